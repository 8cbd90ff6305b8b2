"""Validate /work/app.toml with a pristine copy of the checker and check the intended values."""
import os
import sys
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from app_check import problems  # noqa: E402

WANT = {
    "server": {"host": "0.0.0.0", "port": 8443, "workers": 4},
    "database": {"url": "postgresql://db.internal:5432/app", "pool_size": 10},
    "logging": {"level": "warning"},
}


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


try:
    with open("/work/app.toml", "rb") as fh:
        cfg = tomllib.load(fh)
except FileNotFoundError:
    fail("/work/app.toml is missing")
except tomllib.TOMLDecodeError as e:
    fail(f"app.toml is not valid TOML: {e}")
found = problems(cfg)
if found:
    fail(f"the check still reports: {found}")
if cfg != WANT:
    fail(f"the settings are not the intended ones: {cfg}")
print("PASS")
