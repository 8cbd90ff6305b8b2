#!/usr/bin/env bash
# Install what palaestra needs on a fresh Debian/Ubuntu machine: bubblewrap, a venv, the package.
# Idempotent and quick when nothing changed (the venv is rebuilt only when pyproject.toml changes).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v prlimit >/dev/null 2>&1 || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: please install ${need_apt[*]} (needs root: apt-get install ${need_apt[*]})" >&2
    exit 1
  fi
  echo "bootstrap: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Headless Chromium for the HTML report's browser test (tests/sdk/test_report_browser.py skips,
# saying why, where it is missing). Soft: a non-root user still gets a working install.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "bootstrap: apt-get install chromium chromium-driver"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } ||
      echo "bootstrap: chromium could not be installed; the browser test will skip" >&2
  else
    echo "bootstrap: chromium is missing (as root: apt-get install chromium chromium-driver); the browser test will skip" >&2
  fi
fi

# PostgreSQL, for the tests of the shared store (tests/pg.py starts a throwaway server).
# Soft: without it those tests skip, saying why.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "bootstrap: apt-get install postgresql (the PostgreSQL store's tests)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } ||
      echo "bootstrap: postgresql could not be installed; the PostgreSQL store tests will skip" >&2
  else
    echo "bootstrap: postgresql is missing (as root: apt-get install postgresql); the PostgreSQL store tests will skip" >&2
  fi
fi

# The terminal family's tools, which bwrap sandboxes see in the host's /usr (docs/terminal.md).
# Soft: without them the terminal pack's checks fail on bwrap, nothing else does.
term_apt=()
for tool in jq sqlite3 gawk git gcc g++ make patch; do
  command -v "$tool" >/dev/null 2>&1 || term_apt+=("$tool")
done
/usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || term_apt+=(python3-pytest)
if [ ${#term_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "bootstrap: apt-get install ${term_apt[*]} (terminal tasks on bwrap)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${term_apt[@]}" >/dev/null; } ||
      echo "bootstrap: ${term_apt[*]} could not be installed; terminal tasks on bwrap will fail" >&2
  else
    echo "bootstrap: terminal tasks on bwrap need: apt-get install ${term_apt[*]} (as root)" >&2
  fi
fi

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PYTHON="$candidate"; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "bootstrap: Python >= 3.11 is required" >&2; exit 1; }

stamp=.venv/.palaestra-installed
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: creating .venv with $PYTHON and installing palaestra[server,gym,dev,train,cad,finance,cluster]"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install -q -e '.[server,gym,dev,train,cad,finance,cluster]' 2>&1 | grep -v "^WARNING: Location" || true
  # fails loudly if the install did (the server's extra and the gym's among it)
  .venv/bin/python -c 'import palaestra.server.app, palaestra.sdk.gym, palaestra.cli.main'
  echo "$want" > "$stamp"
fi
bash scripts/bootstrap-cad.sh  # the cad family's sandbox toolchains (trimesh, Blender), cached
bash scripts/bootstrap-harness.sh  # harness mode: mini-swe-agent for the sandboxes, cached
