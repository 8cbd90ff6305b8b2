"""Red-team tests: untrusted clients, tenants and pack authors attacking the server."""
