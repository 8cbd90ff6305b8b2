#!/bin/bash
set -euo pipefail
cd /work
sed -i 's/^int event_count = 0;/extern int event_count;/' registry.h
sed -i 's/^#include "registry.h"$/#include "registry.h"\n\nint event_count = 0;/' registry.c
make clean && make
./events a b
