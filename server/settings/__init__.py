"""The settings' declarations, one pydantic model per concern (docs/reference/server.md
"Settings"); server/config.py composes them into `Settings` and merges the sources."""
