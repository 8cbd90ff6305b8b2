"""Configuration from environment variables."""
