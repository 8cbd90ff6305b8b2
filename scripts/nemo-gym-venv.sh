#!/usr/bin/env bash
# A venv of its own for NeMo Gym (the `nemo-gym` package, PyPI), whose own client and
# session conformance check tests/server/doors/test_door_nemo_gym.py runs against the
# NeMo Gym door: its pins (ray, mlflow, openai==…) must never reach the project's .venv.
# nemo-gym 0.7.0 declares Python >= 3.13.14; where only an older 3.13 is found it is
# installed with --ignore-requires-python (the modules the tests import run on 3.13.0).
# Idempotent: prints the venv's python path; exits 3 when no Python >= 3.13 is found.
set -euo pipefail
VERSION="${NEMO_GYM_VERSION:-0.7.0}"
CACHE="${PALAESTRA_CACHE:-$HOME/.cache/palaestra}"
VENV="$CACHE/nemo-gym-venv"
find_python() {
  local c
  for c in "${PYTHON:-}" python3.14 python3.13 python3; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 13))' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  for c in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[3-9]* 2>/dev/null | sort -rV); do
    [ -x "$c/bin/python" ] && { echo "$c/bin/python"; return 0; }
  done
  return 1
}
mkdir -p "$CACHE"
exec 9>"$CACHE/nemo-gym-venv.lock"  # test workers run side by side: one makes it, the other waits
flock 9
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.version" 2>/dev/null)" != "$VERSION" ]; then
  PY=$(find_python) || { echo "nemo-gym-venv: no Python >= 3.13 (NeMo Gym needs one)" >&2; exit 3; }
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" >&2
  FLAGS=()
  "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 13, 14))' \
    || FLAGS=(--ignore-requires-python)
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -U pip >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${FLAGS[@]}" \
    "nemo-gym==$VERSION" >&2
  echo "$VERSION" > "$VENV/.version"
fi
echo "$VENV/bin/python"
