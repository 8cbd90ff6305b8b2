#!/bin/sh
# Build-time proof that the standard TB2 line resolves offline from the image's wheels.
set -eu
d=/opt/palaestra-verifier
export HOME=/tmp/uv-check UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS="$d/wheels" \
  UV_PYTHON_DOWNLOADS=never UV_NO_CONFIG=1 UV_NO_PROGRESS=1
"$d/bin/uvx" -p "$(command -v python3)" -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 \
  -w pytest-timeout==2.4.0 pytest --version
rm -rf /tmp/uv-check
