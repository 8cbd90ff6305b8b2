#!/bin/bash
set -euo pipefail
cd /work
sed -E 's/[ \t]+$//' words.txt | awk 'NF || length($0) { k = tolower($0); if (!(k in seen)) { seen[k] = 1; print } }' > words.clean.txt
