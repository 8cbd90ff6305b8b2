#!/bin/bash
set -euo pipefail
cd /work
awk '/^#/ || NF == 0 { next }
     !header { header = 1; next }
     { rev[$2] += $4 * $5; all += $4 * $5 }
     END { for (r in rev) printf "%s %.2f\n", r, rev[r]
           printf "TOTAL %.2f\n", all > "/dev/stderr" }' sales.txt 2> total.tmp |
  sort -k2,2nr -k1,1 > totals.txt
cat total.tmp >> totals.txt
rm total.tmp
