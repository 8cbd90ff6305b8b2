"""A service that refuses to start on a bad configuration.

    python3 app.py --check    validate app.toml, print OK or every problem, exit 0 or 1
"""
import sys
import tomllib

SCHEMA = {
    "server": {"host": str, "port": int, "workers": int},
    "database": {"url": str, "pool_size": int},
    "logging": {"level": str},
}
REQUIRED = {"server": {"port", "workers"}, "database": {"url"}, "logging": {"level"}}
LEVELS = {"debug", "info", "warning", "error"}


def problems(cfg):
    out = []
    for section, keys in cfg.items():
        if section not in SCHEMA:
            out.append(f"unknown section [{section}]")
            continue
        for key, value in keys.items():
            want = SCHEMA[section].get(key)
            if want is None:
                out.append(f"[{section}] unknown key {key!r}")
            elif type(value) is not want:
                out.append(f"[{section}] {key} must be {want.__name__}, got {type(value).__name__}")
    for section, keys in REQUIRED.items():
        for key in keys - set(cfg.get(section, {})):
            out.append(f"[{section}] {key} is required")
    port = cfg.get("server", {}).get("port")
    if isinstance(port, int) and not 1 <= port <= 65535:
        out.append("[server] port must be 1..65535")
    level = cfg.get("logging", {}).get("level")
    if isinstance(level, str) and level not in LEVELS:
        out.append(f"[logging] level must be one of {sorted(LEVELS)}")
    url = cfg.get("database", {}).get("url")
    if isinstance(url, str) and not url.startswith("postgresql://"):
        out.append("[database] url must start with postgresql://")
    return out


def main():
    try:
        with open("app.toml", "rb") as fh:
            cfg = tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        print(f"app.toml: {e}")
        return 1
    found = problems(cfg)
    for p in found:
        print(p)
    if not found:
        print("OK")
    return 1 if found else 0


if __name__ == "__main__" and sys.argv[1:] == ["--check"]:
    sys.exit(main())
