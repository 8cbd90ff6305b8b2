#!/bin/bash
set -euo pipefail
cd /work
sed -i -e 's/^port = "8443"/port = 8443/' -e 's/^worker = 4/workers = 4/' \
       -e 's/^uri = /url = /' -e 's/^level = "warn"/level = "warning"/' app.toml
python3 -B app.py --check
