#!/usr/bin/env bash
# A venv of its own for schemathesis (the OpenAPI fuzz run of tests/redteam/test_openapi.py):
# its pins must never reach the project's .venv. Idempotent: prints the venv's `st` path.
set -euo pipefail
VERSION="${SCHEMATHESIS_VERSION:-4.32.5}"
CACHE="${PALAESTRA_CACHE:-$HOME/.cache/palaestra}"
VENV="$CACHE/schemathesis-venv"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/st" ] || [ "$(cat "$VENV/.version" 2>/dev/null)" != "$VERSION" ]; then
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "schemathesis==$VERSION" >&2
  echo "$VERSION" > "$VENV/.version"
fi
echo "$VENV/bin/st"
