set -e
git init -q -b main .
git config user.email dev@example.com
git config user.name "Dev Eloper"
cat > stats.py <<'EOF'
VERSION = 0


def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2
EOF
cat > check.sh <<'EOF'
#!/bin/bash
# exits 0 when stats.py gives the right answers
python3 -B -c '
import stats
assert stats.mean([1, 2, 3, 4]) == 2.5
assert stats.median([5, 1, 3]) == 3
assert stats.median([4, 1, 3, 2]) == 2.5
'
EOF
chmod +x check.sh
export GIT_AUTHOR_DATE="2024-04-01T00:00:00+00:00" GIT_COMMITTER_DATE="2024-04-01T00:00:00+00:00"
git add stats.py check.sh && git commit -q -m "stats: mean and median"
for i in $(seq 1 40); do
  ts="2024-04-01T$(printf '%02d' $((i / 4))):$(printf '%02d' $((i % 4 * 15))):00+00:00"
  export GIT_AUTHOR_DATE="$ts" GIT_COMMITTER_DATE="$ts"
  sed -i "s/^VERSION = .*/VERSION = $i/" stats.py
  msg="Bump version to $i"
  if [ "$i" -eq 27 ]; then
    sed -i 's|    return s\[mid\] if n % 2 else (s\[mid - 1\] + s\[mid\]) / 2|    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) // 2|' stats.py
    : # the regression hides in an ordinary version bump
  fi
  if [ "$i" -eq 13 ]; then
    printf '\n\ndef spread(xs):\n    return max(xs) - min(xs)\n' >> stats.py
    msg="Add spread"
  fi
  git add stats.py && git commit -q -m "$msg"
done
