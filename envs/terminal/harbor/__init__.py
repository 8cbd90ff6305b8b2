"""Harbor task folders both ways: `pack import harbor` (reader.py) and `pack export harbor`
(writer.py), with task.toml's fields (config.py) and its content digests (digest.py)."""
