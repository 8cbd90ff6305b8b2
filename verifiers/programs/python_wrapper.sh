#!/bin/sh
# python3 / python in the terminal runner's PATH: pytest (-m pytest) and the verifier's own
# programs (a script in $VERIFIER_DIR, -c CODE) under the verifier's boots; a heredoc on
# stdin as it is; anything else (the agent's script or module) confined by agent_jail.py.
flags=
while :; do
  case "$1" in
    -B|-u|-E|-s|-S|-I|-O|-OO|-q|-b|-bb|-P) flags="$flags $1"; shift;;
    *) break;;
  esac
done
if [ "$1" = -m ] && { [ "$2" = pytest ] || [ "$2" = py.test ]; }; then
  shift 2
  exec @REAL@ -I -B -c @PYTEST_BOOT@ "$@"
fi
case "$1" in
  "$VERIFIER_DIR"/*|-c) exec @REAL@ -I -B -c @SCRIPT_BOOT@ "$@";;
  -|"") exec @REAL@ $flags "$@";;
esac
exec @REAL@ -I -c @AGENT_JAIL@ @REAL@ $flags "$@"
