"""Parsing and formatting of time spans."""
