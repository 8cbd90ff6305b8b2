set -e
git init -q -b release .
git config user.email dev@example.com
git config user.name "Dev Eloper"
c() { export GIT_AUTHOR_DATE="2024-05-0$1T09:00:00+00:00" GIT_COMMITTER_DATE="2024-05-0$1T09:00:00+00:00"; git add -- "${@:3}"; git commit -q -m "$2"; }
cat > pages.py <<'EOF'
def paginate(items, size):
    """Split items into pages of `size` (the last page may be shorter)."""
    pages = []
    for start in range(0, len(items) - 1, size):
        pages.append(items[start : start + size])
    return pages


def page_count(n, size):
    return (n + size - 1) // size
EOF
printf '1.0.0\n' > VERSION
c 1 "Release 1.0.0" pages.py VERSION
git checkout -q -b dev
printf '1.1.0-dev\n' > VERSION
c 2 "Start 1.1 development" VERSION
sed -i 's/    for start in range(0, len(items) - 1, size):/    for start in range(0, len(items), size):/' pages.py
c 3 "Fix off-by-one in paginate" pages.py
printf '\n\ndef first_page(items, size):\n    return paginate(items, size)[:1]\n' >> pages.py
c 4 "Add first_page helper" pages.py
git checkout -q release
