#!/bin/bash
set -euo pipefail
cd /work/reports
for f in *; do
  if [[ "$f" =~ ^(.+)_([0-9]{2})-([0-9]{2})-([0-9]{4})\.([^.]+)$ ]]; then
    mv -- "$f" "${BASH_REMATCH[4]}-${BASH_REMATCH[2]}-${BASH_REMATCH[3]}_${BASH_REMATCH[1]}.${BASH_REMATCH[5]}"
  fi
done
