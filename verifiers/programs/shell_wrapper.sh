#!/bin/sh
# bash / sh in the terminal runner's PATH: a script of the verifier's ($VERIFIER_DIR), -c
# CODE and options as they are; a script of the agent's confined by agent_jail.py.
case "$1" in
  "$VERIFIER_DIR"/*|-*|"") exec @SHELL@ "$@";;
esac
exec @REAL@ -I -c @AGENT_JAIL@ @SHELL@ "$@"
