#!/bin/bash
set -euo pipefail
cd /work
jq '[.[] | select(.active == true and (.roles | index("admin")))
     | {id, email: (.email | ascii_downcase)}] | sort_by(.id)' users.json > admins.json
