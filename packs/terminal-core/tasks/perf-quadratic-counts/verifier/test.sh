#!/bin/bash
V="$(cd "$(dirname "$0")" && pwd)"
exec python3 "$V/check.py"
