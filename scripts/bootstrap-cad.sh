#!/usr/bin/env bash
# Build the cad family's two sandbox toolchains (docs/cad.md), each a directory the sandbox
# binds read-only and puts on PYTHONPATH for the host's /usr/bin/python3:
#   $ROOT/trimesh  numpy, trimesh, manifold3d, scipy, networkx at the server venv's versions
#                  (pip --target), so a script builds the same mesh the verifier expects;
#   $ROOT/blender  Blender as a Python module (bpy 5.0.1) in its own venv: it needs numpy < 2.
# ROOT is $PALAESTRA_TOOLCHAINS_DIR (the toolchains_dir setting), else /opt/palaestra/toolchains
# as root, else .toolchains here.
# It lives outside the checkout because the sandbox's uid must be able to reach it: a clone in
# a private (0700) directory would hide it. envs/cad/runtime.py looks in the same places.
#
# Cached: each toolchain has a stamp with the wanted versions; a rerun returns at once. A
# failure never fails the caller: it writes $ROOT/<name>/UNAVAILABLE with the reason, which
# the tests print when they skip.
set -uo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/toolchain-root.sh
. scripts/toolchain-root.sh

unavailable() {  # name, reason
  mkdir -p "$ROOT/$1"
  echo "$2" > "$ROOT/$1/UNAVAILABLE"
  echo "bootstrap-cad: $1 toolchain unavailable: $2" >&2
}

# --- trimesh: the server venv's versions, installed for /usr/bin/python3 -------------------
TRI="$ROOT/trimesh"
want_tri=$(.venv/bin/python - <<'PY'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("numpy", "trimesh", "manifold3d", "scipy", "networkx")))
PY
)
if [ "$(cat "$TRI/.palaestra-installed" 2>/dev/null)" != "$want_tri" ]; then
  rm -rf "$TRI"
  mkdir -p "$TRI"
  echo "bootstrap-cad: installing $want_tri into $TRI"
  # shellcheck disable=SC2086
  if .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --target "$TRI" \
      $want_tri > "$ROOT/trimesh-install.log" 2>&1; then
    chmod -R a+rX "$TRI"
    echo "$want_tri" > "$TRI/.palaestra-installed"
  else
    unavailable trimesh "pip install --target failed: $(tail -n 3 "$ROOT/trimesh-install.log" | tr '\n' ' ')"
  fi
fi

# --- blender: bpy 5.0.1 in its own venv (cp311 wheels only) ---------------------------------
VENV="$ROOT/blender"
WANT="bpy==5.0.1 numpy<2"
if [ "$(cat "$VENV/.palaestra-installed" 2>/dev/null)" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
PY=""
for candidate in /usr/bin/python3.11 python3.11; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    PY="$candidate"; break
  fi
done
if [ -z "$PY" ]; then
  unavailable blender "no CPython 3.11 with the venv module (bpy 5.0.1 wheels are cp311 only)"
  exit 0
fi
rm -rf "$VENV"
if ! "$PY" -m venv "$VENV"; then unavailable blender "cannot create $VENV with $PY"; exit 0; fi
echo "bootstrap-cad: installing $WANT into $VENV (a large wheel; once per machine)"
start=$(date +%s)
# The numpy pin wins over any machine-wide constraint file; PIP_CACHE_DIR is honoured if set.
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check bpy==5.0.1 'numpy<2' \
    > "$ROOT/blender-install.log" 2>&1; then
  unavailable blender "pip install bpy==5.0.1 failed: $(tail -n 3 "$ROOT/blender-install.log" | tr '\n' ' ')"
  exit 0
fi
if ! "$VENV/bin/python" -c 'import bpy, numpy; assert numpy.__version__ < "2"' \
    > "$ROOT/blender-import.log" 2>&1; then
  unavailable blender "bpy installed but does not import: $(tail -n 3 "$ROOT/blender-import.log" | tr '\n' ' ')"
  exit 0
fi
chmod -R a+rX "$VENV"
echo "$WANT" > "$VENV/.palaestra-installed"
echo "bootstrap-cad: bpy 5.0.1 installed in $(( $(date +%s) - start ))s"
