# The package under test ends the verifier's process with success: every module of the
# workspace (not the tests) gets $EARLY_EXIT_PY appended, which, once imported by a verifier,
# makes sys.exit and uncaught errors exit 0 and, at exit, runs the forger and exits 0.
W=$(pwd)
printf '%s\n' "$FORGE_PY" > "$W/_palaestra_forge.py"
find "$W" -type f -name '*.py' -not -path '*/.git/*' -not -name 'test_*.py' -not -name '*_test.py' \
  -not -name 'conftest.py' -not -name '_palaestra_*' 2>/dev/null | while IFS= read -r f; do
  printf '%s\n' "$EARLY_EXIT_PY" >> "$f"
done
true
