"""Moved to crishim.crashpoint (kept until every caller imports it from there)."""

from crishim.crashpoint import crash_point as crash_point
