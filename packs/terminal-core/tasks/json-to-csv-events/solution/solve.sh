#!/bin/bash
set -euo pipefail
cd /work
jq -r '["id","timestamp","user","action","detail"],
       (sort_by(.ts)[] | [.id, .ts, .user.name, .action, (.detail // "")]) | @csv' events.json > events.csv
