set -e
export GIT_AUTHOR_DATE="2024-01-01T10:00:00+00:00" GIT_COMMITTER_DATE="2024-01-01T10:00:00+00:00"
git init -q -b main .
git config user.email dev@example.com
git config user.name "Dev Eloper"
mkdir -p config
printf 'print("hello")\n' > app.py
printf '[server]\nport = 8080\n' > config/defaults.ini
printf 'API_KEY=changeme\n' > config/secrets.example
printf '# demo\n' > README.md
git add app.py config README.md && git commit -q -m "Initial commit"
export GIT_AUTHOR_DATE="2024-01-02T10:00:00+00:00" GIT_COMMITTER_DATE="2024-01-02T10:00:00+00:00"
printf 'API_KEY=changeme\nDB_PASSWORD=changeme\nSMTP_TOKEN=changeme\n' > config/secrets.example
printf 'import sys\nprint("hello", sys.argv[1:])\n' > app.py
git commit -q -am "Add database and mail secrets"
export GIT_AUTHOR_DATE="2024-01-03T10:00:00+00:00" GIT_COMMITTER_DATE="2024-01-03T10:00:00+00:00"
git rm -q config/secrets.example
printf '# demo\n\nConfiguration lives in config/.\n' > README.md
git commit -q -am "Remove unused config"
export GIT_AUTHOR_DATE="2024-01-04T10:00:00+00:00" GIT_COMMITTER_DATE="2024-01-04T10:00:00+00:00"
printf '[server]\nport = 9090\n' > config/defaults.ini
git commit -q -am "Change default port"
