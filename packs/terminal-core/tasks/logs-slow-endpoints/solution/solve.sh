#!/bin/bash
set -euo pipefail
cd /work
awk -F'"' '{
  split($2, req, " "); split($3, rest, " ")
  if (rest[1] != "200") next
  path = req[2]; sub(/\?.*/, "", path)
  sum[path] += rest[3]; n[path]++
}
END { for (p in sum) printf "%s %.3f %.9f\n", p, sum[p] / n[p], sum[p] / n[p] }' access.log |
  sort -k3,3gr | head -n 3 | cut -d' ' -f1,2 > slowest.txt
cat slowest.txt
