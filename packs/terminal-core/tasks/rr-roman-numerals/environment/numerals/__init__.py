"""Number formats."""
