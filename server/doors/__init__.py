"""Compatibility doors: the same episodes through the protocols trainers and hubs already
speak (OpenEnv, the Open Reward Standard, MCP). A door translates; the episode manager does
the work, so ownership, sealed splits, quotas and verification are the same as on /v1."""
