"""The files `palaestra pack export harbor` writes into each Harbor task (templates)."""
