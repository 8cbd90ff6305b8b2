"""Programs a harness runs inside the sandbox (files, not imported by the server)."""
