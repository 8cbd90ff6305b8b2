#!/bin/bash
set -euo pipefail
cd /work
cat > Makefile <<'MK'
CC = gcc
CFLAGS = -O2 -Wall
OBJS = main.o eval.o stack.o

rpn: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $(OBJS)

%.o: %.c
	$(CC) $(CFLAGS) -c $<

main.o: eval.h
eval.o: eval.h stack.h
stack.o: stack.h

clean:
	rm -f rpn *.o

.PHONY: clean
MK
make
./rpn "3 4 + 2 *"
