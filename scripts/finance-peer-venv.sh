#!/usr/bin/env bash
# A venv of its own for FinQA's and TAT-QA's official evaluators (scripts/finance_agreement.py
# runs their code in it): numpy, scipy, pandas, sympy, tqdm, never in the project's .venv.
# Idempotent: prints the venv's python.
set -euo pipefail
CACHE="${PALAESTRA_CACHE:-$HOME/.cache/palaestra}"
VENV="$CACHE/finance-peer-venv"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.ready" ]; then
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    numpy scipy pandas sympy tqdm >&2
  touch "$VENV/.ready"
fi
echo "$VENV/bin/python"
