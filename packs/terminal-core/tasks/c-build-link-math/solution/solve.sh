#!/bin/bash
set -euo pipefail
cd /work
sed -i 's|\t$(CC) $(CFLAGS) -o $@ stats.o|\t$(CC) $(CFLAGS) -o $@ stats.o -lm|' Makefile
make clean && make
