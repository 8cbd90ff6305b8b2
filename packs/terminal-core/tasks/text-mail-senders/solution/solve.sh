#!/bin/bash
set -euo pipefail
cd /work/mail
for f in *.eml; do
  # header section only: stop at the first empty line
  awk 'NF == 0 { exit } tolower($0) ~ /^from:/ { print; exit }' "$f"
done | sed -E 's/^[Ff][Rr][Oo][Mm]:[[:space:]]*//; s/.*<([^>]+)>.*/\1/; s/[[:space:]]+$//' |
  tr '[:upper:]' '[:lower:]' | LC_ALL=C sort | uniq -c |
  awk '{ print $1, $2 }' | LC_ALL=C sort -k1,1nr -k2,2 > /work/senders.txt
