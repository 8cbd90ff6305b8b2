#!/bin/bash
set -euo pipefail
cd /work
{
  echo "hour,requests,server_errors"
  awk '{
    split(substr($4, 2), t, /[\/:]/)          # dd Mon yyyy HH MM SS
    m = (index("JanFebMarAprMayJunJulAugSepOctNovDec", t[2]) + 2) / 3
    key = sprintf("%s-%02d-%sT%s", t[3], m, t[1], t[4])
    req[key]++
    if ($9 >= 500 && $9 <= 599) err[key]++
  }
  END { for (k in req) printf "%s,%d,%d\n", k, req[k], err[k] }' access.log | LC_ALL=C sort
} > errors_by_hour.csv
