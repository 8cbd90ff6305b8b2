"""A tiny CSV writer."""
