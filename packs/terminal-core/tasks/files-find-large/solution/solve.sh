#!/bin/bash
set -euo pipefail
cd /work/data
find . -type f -size +10240c -printf '%P\n' | LC_ALL=C sort > /work/large_files.txt
