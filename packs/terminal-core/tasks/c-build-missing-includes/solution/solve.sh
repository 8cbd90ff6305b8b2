#!/bin/bash
set -euo pipefail
cd /work
sed -i 's|#include <ctype.h>|#include <ctype.h>\n#include <stdlib.h>\n#include <string.h>|' wordfreq.c
make
