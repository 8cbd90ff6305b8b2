#!/usr/bin/env bash
# Build the harness toolchain (server/harness/toolchain.py): mini-swe-agent 2.4.6 and what its
# non-interactive run imports, pinned in scripts/harness-mini-swe-agent.txt, installed with
# `pip install --no-deps --target $ROOT/mini-swe-agent` for CPython 3.11 (the host's
# /usr/bin/python3 and the images' under images/, Debian bookworm), byte-compiled by
# /usr/bin/python3 (the sandbox binds it read-only: no __pycache__ can be written there).
# ROOT is the cad toolchains' (scripts/bootstrap-cad.sh): $PALAESTRA_TOOLCHAINS_DIR, else
# /opt/palaestra/toolchains as root, else .toolchains here.
#
# Cached: a stamp holds the pin file's sha256; a rerun returns at once. A failure never fails
# the caller: it writes $ROOT/mini-swe-agent/UNAVAILABLE with the reason, which the tests
# print when they skip.
set -uo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/toolchain-root.sh
. scripts/toolchain-root.sh
DIR="$ROOT/mini-swe-agent"
PINS=scripts/harness-mini-swe-agent.txt
want=$(sha256sum "$PINS" | cut -d' ' -f1)
[ "$(cat "$DIR/.palaestra-installed" 2>/dev/null)" = "$want" ] && exit 0

unavailable() {  # reason
  mkdir -p "$DIR"
  echo "$1" > "$DIR/UNAVAILABLE"
  echo "bootstrap-harness: mini-swe-agent toolchain unavailable: $1" >&2
  exit 0
}

rm -rf "$DIR"
mkdir -p "$DIR"
echo "bootstrap-harness: installing mini-swe-agent 2.4.6 into $DIR"
start=$(date +%s)
log="$ROOT/mini-swe-agent-install.log"
if ! .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
    --python-version 3.11 --only-binary=:all: --target "$DIR" -r "$PINS" > "$log" 2>&1; then
  unavailable "pip install --target failed: $(grep -v '^WARNING: Location' "$log" | tail -n 3 | tr '\n' ' ')"
fi
rm -rf "$DIR/bin"  # console scripts with this venv's interpreter on their #! line
if /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  /usr/bin/python3 -m compileall -q -j 0 "$DIR" > "$ROOT/mini-swe-agent-compile.log" 2>&1 || true
  check=(env -i PATH=/usr/bin:/bin HOME=/tmp PYTHONPATH="$DIR" PYTHONNOUSERSITE=1
         LITELLM_LOCAL_MODEL_COST_MAP=True MSWEA_CONFIGURED=true MSWEA_SILENT_STARTUP=1
         /usr/bin/python3 -c 'import minisweagent.run.mini, minisweagent.agents.default
import minisweagent.models.litellm_model, minisweagent.environments.local, litellm')
  if ! "${check[@]}" > "$ROOT/mini-swe-agent-import.log" 2>&1; then
    unavailable "installed but does not import: $(tail -n 3 "$ROOT/mini-swe-agent-import.log" | tr '\n' ' ')"
  fi
else
  echo "bootstrap-harness: /usr/bin/python3 is not 3.11: not byte-compiled, not checked here" >&2
fi
chmod -R a+rX "$DIR"
echo "$want" > "$DIR/.palaestra-installed"
echo "bootstrap-harness: mini-swe-agent installed in $(( $(date +%s) - start ))s ($(du -sm "$DIR" | cut -f1) MB)"
