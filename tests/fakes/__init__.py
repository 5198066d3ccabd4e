"""Fakes shared by test modules, one module per boundary they stand in for; test modules
import from here, never from one another."""
