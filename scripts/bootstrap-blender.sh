#!/usr/bin/env bash
# Build .venv-blender: Blender as a Python module (bpy 5.0.1) for the cad family's Blender
# toolchain. It lives apart from .venv because bpy 5.0.1 needs numpy < 2 (trimesh's venv has
# numpy 2). The cad sandbox runs /usr/bin/python3 with this venv's site-packages bound
# read-only, so the venv is made from a CPython 3.11 (bpy's wheels are cp311 only).
#
# Cached: a stamp holds the wanted versions; a rerun with the stamp in place and bpy importable
# returns at once. A failure (no Python 3.11, no wheel for this platform, no registry) never
# fails the caller: it writes .venv-blender/UNAVAILABLE with the reason, which the tests print
# when they skip. The install time is printed (the wheel is several hundred MB).
set -uo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-blender
WANT="bpy==5.0.1 numpy<2"
stamp="$VENV/.palaestra-installed"

fail() {
  mkdir -p "$VENV"
  printf '*\n' > "$VENV/.gitignore"
  echo "$1" > "$VENV/UNAVAILABLE"
  echo "bootstrap-blender: Blender toolchain unavailable: $1" >&2
  exit 0
}

if [ "$(cat "$stamp" 2>/dev/null)" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi

PY=""
for candidate in /usr/bin/python3.11 python3.11; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    PY="$candidate"; break
  fi
done
[ -n "$PY" ] || fail "no CPython 3.11 with the venv module (bpy 5.0.1 wheels are cp311 only)"

rm -rf "$VENV"
"$PY" -m venv "$VENV" || fail "cannot create $VENV with $PY"
printf '*\n' > "$VENV/.gitignore"
echo "bootstrap-blender: installing $WANT into $VENV (a large wheel; once per machine)"
start=$(date +%s)
# The numpy pin wins over any machine-wide constraint file; PIP_CACHE_DIR is honoured if set.
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check bpy==5.0.1 'numpy<2' \
    > "$VENV/install.log" 2>&1; then
  fail "pip install bpy==5.0.1 failed: $(tail -n 3 "$VENV/install.log" | tr '\n' ' ')"
fi
took=$(( $(date +%s) - start ))
if ! "$VENV/bin/python" -c 'import bpy, numpy; assert numpy.__version__ < "2"' \
    > "$VENV/import.log" 2>&1; then
  fail "bpy installed but does not import: $(tail -n 3 "$VENV/import.log" | tr '\n' ' ')"
fi
rm -f "$VENV/UNAVAILABLE"
echo "$WANT" > "$stamp"
echo "bootstrap-blender: bpy 5.0.1 installed in ${took}s"
