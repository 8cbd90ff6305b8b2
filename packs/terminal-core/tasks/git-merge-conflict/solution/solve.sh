#!/bin/bash
set -uo pipefail
cd /work
git checkout -q main
git merge --no-edit feature >/dev/null 2>&1 || true
cat > settings.conf <<'CONF'
# service settings
name = ingest
timeout = 30
retries = 5
log_level = info
workers = 4
CONF
git add settings.conf
git commit -q --no-edit
