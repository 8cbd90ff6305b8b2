#!/bin/bash
set -euo pipefail
cd /work
cat >> crontab <<'CRON'
30 2 * * * /opt/app/backup.sh
0 8 * * MON-FRI /opt/app/report.sh
*/15 * * * * /opt/app/rotate.sh
0 0 1 * * /opt/app/cleanup.sh
CRON
