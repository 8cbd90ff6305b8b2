#!/bin/bash
set -euo pipefail
cd /work
git checkout -q release
fix=$(git log dev --format=%H --grep='^Fix off-by-one in paginate$' -n 1)
git cherry-pick "$fix" >/dev/null
