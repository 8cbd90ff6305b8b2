#!/usr/bin/env bash
# A venv of its own for Harbor (the `harbor` package of the Harbor framework, PyPI), whose
# loader and linter tests/envs/terminal/test_harbor.py runs on `palaestra pack export harbor`
# output: its pins must never reach the project's .venv, and it needs Python >= 3.12.
# Idempotent: prints the venv's python path; exits 3 when no Python >= 3.12 is found.
set -euo pipefail
VERSION="${HARBOR_VERSION:-0.26.0}"
CACHE="${PALAESTRA_CACHE:-$HOME/.cache/palaestra}"
VENV="$CACHE/harbor-venv"
find_python() {
  local c
  for c in "${PYTHON:-}" python3.13 python3.12 python3; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1 || [ -d "${PYENV_ROOT:-$HOME/.pyenv}/versions" ]; then
    for c in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
      [ -x "$c/bin/python" ] && { echo "$c/bin/python"; return 0; }
    done
  fi
  return 1
}
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.version" 2>/dev/null)" != "$VERSION" ]; then
  PY=$(find_python) || { echo "harbor-venv: no Python >= 3.12 (Harbor needs one)" >&2; exit 3; }
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PY" -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "harbor==$VERSION" >&2
  echo "$VERSION" > "$VENV/.version"
fi
echo "$VENV/bin/python"
