"""Moved to crishim.crashpoint (kept until every caller imports it from there)."""
from crishim.crashpoint import ENV, STEPS, crash_point  # noqa: F401
