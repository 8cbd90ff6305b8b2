set -e
git init -q -b main .
git config user.email dev@example.com
git config user.name "Dev Eloper"
c() { export GIT_AUTHOR_DATE="2024-03-0$1T09:00:00+00:00" GIT_COMMITTER_DATE="2024-03-0$1T09:00:00+00:00"; git add -- "${@:3}"; git commit -q -m "$2"; }
cat > settings.conf <<'EOF'
# service settings
name = ingest
timeout = 10
log_level = info
workers = 2
EOF
printf 'ingest service\n' > README.md
c 1 "Initial settings" settings.conf README.md
git checkout -q -b feature
sed -i 's/^timeout = 10$/timeout = 45\nretries = 5/' settings.conf
c 2 "Add retries, longer timeout" settings.conf
printf 'def backoff(n):\n    return min(2 ** n, 60)\n' > retry.py
c 3 "Add backoff helper" retry.py
git checkout -q main
sed -i 's/^timeout = 10$/timeout = 30/; s/^workers = 2$/workers = 4/' settings.conf
c 4 "Tune timeout and workers" settings.conf
printf 'ingest service\n\nSee settings.conf.\n' > README.md
c 5 "Document settings" README.md
