#!/bin/sh
if [ "$1" = -m ] && { [ "$2" = pytest ] || [ "$2" = py.test ]; }; then
  shift 2
  exec @REAL@ -I -B -c @PYTEST_BOOT@ "$@"
fi
case "$1" in
  "$VERIFIER_DIR"/*) exec @REAL@ -E -s -B -c @SCRIPT_BOOT@ "$@";;
esac
exec @REAL@ "$@"
