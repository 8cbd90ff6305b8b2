#!/bin/bash
set -euo pipefail
cd /work
find site -type f -exec chmod 644 {} +
find site -type f -name '*.sh' -exec chmod 755 {} +
find site/private -type f -exec chmod 600 {} +
