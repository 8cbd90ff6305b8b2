"""Plain-text formatting."""
