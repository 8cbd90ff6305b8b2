#!/bin/bash
set -euo pipefail
cd /work
cat > deploy.ini <<'INI'
; deployment settings, read with Python's configparser:
; every section inherits the keys of [DEFAULT] unless it sets them itself
[DEFAULT]
image = registry.example.com/shop
image_tag = 2.3.2
replicas = 2
debug = true
region = eu-west-1

[staging]
replicas = 1
image_tag = 2.3.1

[production]
replicas = 6
region = eu-central-1
debug = false

[canary]
replicas = 1
image_tag = 2.4.0-rc1
INI
