"""Adversarial tests: untrusted code attacking the sandbox, its neighbours and the host."""
