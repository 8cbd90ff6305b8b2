"""Integer intervals."""
