#!/bin/bash
set -euo pipefail
cd /work
sed -i 's/    ordered = sorted(entries, key=lambda e: (e\[0\], e\[1\]), reverse=True)/    ordered = sorted(entries, key=lambda e: (-int(e[0]), e[1]))/' largest.py
grep -q 'int(e\[0\])' largest.py
