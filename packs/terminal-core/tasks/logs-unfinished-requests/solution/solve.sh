#!/bin/bash
set -euo pipefail
cd /work/logs
{ zcat app.log.3.gz app.log.2.gz; cat app.log.1 app.log; } |
  grep -oE 'req=[^ ]+ event=(start|end)' > /tmp/events.txt
grep ' event=start$' /tmp/events.txt | cut -d' ' -f1 | cut -d= -f2 | LC_ALL=C sort -u > /tmp/started
grep ' event=end$' /tmp/events.txt | cut -d' ' -f1 | cut -d= -f2 | LC_ALL=C sort -u > /tmp/ended
LC_ALL=C comm -23 /tmp/started /tmp/ended > /work/unfinished.txt
wc -l /work/unfinished.txt
