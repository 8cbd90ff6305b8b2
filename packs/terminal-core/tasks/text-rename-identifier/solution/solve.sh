#!/bin/bash
set -euo pipefail
cd /work/src
find . -name '*.py' -exec sed -E -i 's/(^|[^A-Za-z0-9_])get_usr([^A-Za-z0-9_]|$)/\1fetch_user\2/g' {} +
# a second pass catches occurrences that shared a boundary character with the previous match
find . -name '*.py' -exec sed -E -i 's/(^|[^A-Za-z0-9_])get_usr([^A-Za-z0-9_]|$)/\1fetch_user\2/g' {} +
