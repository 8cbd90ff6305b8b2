#!/bin/bash
set -euo pipefail
cd /work
tar --exclude=node_modules --exclude=__pycache__ --exclude='*.log' -czf backup.tar.gz project
