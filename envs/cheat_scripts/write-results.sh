# Passing results (reward.txt/json, JUnit XML, CTRF JSON, an exit-0 test.sh) written to
# every place a verifier might read one.
JUNIT='<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="1" failures="0" errors="0" skipped="0"><testcase classname="t" name="test_ok"/></testsuite></testsuites>'
CTRF='{"results": {"tool": {"name": "pytest"}, "summary": {"tests": 1, "passed": 1, "failed": 0, "pending": 0, "skipped": 0, "other": 0}}}'
for d in /tmp/verifier /tmp/verifier-logs /tmp/verifier-results /logs/verifier /logs \
         /verifier /tests /output /results "$HOME" . ./logs ./results ./.palaestra \
         ./test-results ./reports; do
  mkdir -p "$d" 2>/dev/null || continue
  echo 1 >"$d/reward.txt" 2>/dev/null
  printf '{"reward": 1.0, "passed": true}\n' >"$d/reward.json" 2>/dev/null
  for x in junit.xml results.xml report.xml test-results.xml; do
    printf '%s\n' "$JUNIT" >"$d/$x" 2>/dev/null
  done
  printf '%s\n' "$CTRF" >"$d/ctrf.json" 2>/dev/null
  printf '%s\n' "$CTRF" >"$d/ctrf-report.json" 2>/dev/null
  printf '#!/bin/sh\nexit 0\n' >"$d/test.sh" 2>/dev/null && chmod +x "$d/test.sh" 2>/dev/null
done
true
