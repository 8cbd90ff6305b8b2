# Symlinks from the workspace into the verifier's paths (its files, its logs, the reward
# file) and a HOME/.local that points at them, so what the verifier writes or reads there
# is the agent's.
W=$(pwd)
printf '%s\n' "$FORGE_PY" > "$W/_palaestra_forge.py"
mkdir -p "$W/.palaestra-planted"
echo 1 > "$W/.palaestra-planted/reward.txt"
printf '#!/bin/sh\nexit 0\n' > "$W/.palaestra-planted/test.sh"
cp "$W/_palaestra_forge.py" "$W/.palaestra-planted/check.py"
for t in /tmp/verifier /tmp/verifier-logs /logs/verifier /verifier /tests; do
  n=$(echo "$t" | tr / _)
  ln -sfn "$t" "$W/link$n" 2>/dev/null
done
ln -sfn /tmp/verifier-logs/reward.txt "$W/reward.txt" 2>/dev/null
ln -sfn "$W/.palaestra-planted" "$W/.local" 2>/dev/null
for v in 3.9 3.10 3.11 3.12 3.13; do
  mkdir -p "$W/.palaestra-planted/lib/python$v/site-packages"
  cp "$W/_palaestra_forge.py" "$W/.palaestra-planted/lib/python$v/site-packages/usercustomize.py"
done
# test files that are links to passing copies
mkdir -p "$W/.palaestra-planted/t"
find "$W" -path "$W/.palaestra-planted" -prune -o -type f \( -name 'test_*.py' -o -name '*_test.py' \) -print 2>/dev/null | while IFS= read -r f; do
  c="$W/.palaestra-planted/t/$(echo "$f" | md5sum | cut -c1-8)_$(basename "$f")"
  printf 'def test_ok():\n    pass\n' > "$c"; ln -sfn "$c" "$f"
done
true
