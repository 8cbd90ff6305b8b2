#!/usr/bin/env bash
# A venv of its own for a peer (another project's client, trainer or server that a test
# drives against palaestra): its pins never reach the project's .venv.
#   scripts/peer-venv.sh NAME REQUIREMENT...    e.g.  scripts/peer-venv.sh openenv openenv==0.10.0
# Made under $PALAESTRA_CACHE (~/.cache/palaestra) on first use and again whenever the
# requirements change; `torch==2.13.0` resolves to the CPU wheel on disk. A file
# `tests/peers/NAME.post` (if any) runs after the install (a peer's known fix-ups).
# Idempotent: prints the venv's python.
set -euo pipefail
NAME="$1"; shift
CACHE="${PALAESTRA_CACHE:-$HOME/.cache/palaestra}"
VENV="$CACHE/peer-$NAME-venv"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
HERE="$(cd "$(dirname "$0")/.." && pwd)"
POST="$HERE/tests/peers/$NAME.post"
STAMP="$({ printf '%s\n' "$@"; cat "$POST" 2>/dev/null || true; } | sha256sum | cut -c1-16)"
mkdir -p "$CACHE"
exec 9>"$CACHE/peer-$NAME.lock"  # test workers run side by side: one makes it, the other waits
flock 9
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$STAMP" ]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -U pip wheel >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2
  if [ -f "$POST" ]; then VENV="$VENV" bash "$POST" >&2; fi
  echo "$STAMP" > "$VENV/.stamp"
fi
echo "$VENV/bin/python"
