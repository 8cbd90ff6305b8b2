#!/usr/bin/env bash
# Build the harness toolchains (server/harness/toolchain.py), each pinned for CPython 3.11 (the
# host's /usr/bin/python3 and the images' under images/, Debian bookworm), installed with
# `pip install --no-deps --target $ROOT/<name>` and byte-compiled by /usr/bin/python3 (the
# sandbox binds it read-only: no __pycache__ can be written there):
# - mini-swe-agent: mini-swe-agent 2.4.6 and what its non-interactive run imports
#   (scripts/harness-mini-swe-agent.txt);
# - acp: the Agent Client Protocol SDK 0.12.1 the ACP reference agent runs on
#   (scripts/harness-acp.txt).
# ROOT is the cad toolchains' (scripts/bootstrap-cad.sh): $PALAESTRA_TOOLCHAINS_DIR, else
# /opt/palaestra/toolchains as root, else .toolchains here.
#
# Cached: a stamp holds the pin file's sha256; a rerun returns at once. A failure never fails
# the caller: it writes $ROOT/<name>/UNAVAILABLE with the reason, which the tests print when
# they skip.
set -uo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/toolchain-root.sh
. scripts/toolchain-root.sh

build() {  # name, pin file, python that must import on it, extra env for that check...
  local name=$1 pins=$2 imports=$3
  shift 3
  local dir="$ROOT/$name" want
  want=$(sha256sum "$pins" | cut -d' ' -f1)
  [ "$(cat "$dir/.palaestra-installed" 2>/dev/null)" = "$want" ] && return 0
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "bootstrap-harness: installing the $name toolchain into $dir"
  local start log="$ROOT/$name-install.log"
  start=$(date +%s)
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
      --python-version 3.11 --only-binary=:all: --target "$dir" -r "$pins" > "$log" 2>&1; then
    unavailable "$name" "pip install --target failed: $(grep -v '^WARNING: Location' "$log" | tail -n 3 | tr '\n' ' ')"
    return 0
  fi
  rm -rf "$dir/bin"  # console scripts with this venv's interpreter on their #! line
  if /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    /usr/bin/python3 -m compileall -q -j 0 "$dir" > "$ROOT/$name-compile.log" 2>&1 || true
    if ! env -i PATH=/usr/bin:/bin HOME=/tmp PYTHONPATH="$dir" PYTHONNOUSERSITE=1 "$@" \
        /usr/bin/python3 -c "$imports" > "$ROOT/$name-import.log" 2>&1; then
      unavailable "$name" "installed but does not import: $(tail -n 3 "$ROOT/$name-import.log" | tr '\n' ' ')"
      return 0
    fi
  else
    echo "bootstrap-harness: /usr/bin/python3 is not 3.11: $name not byte-compiled, not checked here" >&2
  fi
  chmod -R a+rX "$dir"
  echo "$want" > "$dir/.palaestra-installed"
  echo "bootstrap-harness: $name installed in $(( $(date +%s) - start ))s ($(du -sm "$dir" | cut -f1) MB)"
}

unavailable() {  # name, reason
  mkdir -p "$ROOT/$1"
  echo "$2" > "$ROOT/$1/UNAVAILABLE"
  echo "bootstrap-harness: $1 toolchain unavailable: $2" >&2
}

build mini-swe-agent scripts/harness-mini-swe-agent.txt 'import minisweagent.run.mini, minisweagent.agents.default
import minisweagent.models.litellm_model, minisweagent.environments.local, litellm' \
  LITELLM_LOCAL_MODEL_COST_MAP=True MSWEA_CONFIGURED=true MSWEA_SILENT_STARTUP=1
build acp scripts/harness-acp.txt 'import acp, acp.schema, acp.stdio'
