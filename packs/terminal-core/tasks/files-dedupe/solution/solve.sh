#!/bin/bash
set -euo pipefail
cd /work/photos
: > /work/removed.txt
declare -A seen
while IFS= read -r path; do
  sum=$(sha256sum "$path" | cut -d' ' -f1)
  if [[ -n "${seen[$sum]:-}" ]]; then
    rm -- "$path"
    echo "$path" >> /work/removed.txt
  else
    seen[$sum]=$path
  fi
done < <(find . -type f | sed 's|^\./||' | LC_ALL=C sort)
LC_ALL=C sort -o /work/removed.txt /work/removed.txt
