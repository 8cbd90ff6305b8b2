set -e
git init -q -b main .
git config user.email dev@example.com
git config user.name "Dev Eloper"
c() { export GIT_AUTHOR_DATE="2024-02-0$1T09:00:00+00:00" GIT_COMMITTER_DATE="2024-02-0$1T09:00:00+00:00"; git add calc.py README.md; git commit -q -m "$2"; }
cat > README.md <<'EOF'
# calc
A tiny calculator: `python3 calc.py "3 + 4"`.
EOF
cat > calc.py <<'EOF'
import sys


def parse(expr):
    """Split 'a op b' into (a, op, b); a and b may be negative."""
    left, op, right = expr.split()
    return int(left), op, int(right)


# ---------------------------------------------------------------------------
# operators
# ---------------------------------------------------------------------------


def apply(a, op, b):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    raise ValueError(f"unknown operator {op!r}")


if __name__ == "__main__":
    print(apply(*parse(sys.argv[1])))
EOF
c 1 "Initial calculator"
sed -i 's/    if op == "-":/    if op == "*":\n        return a * b\n    if op == "-":/' calc.py
c 2 "Add multiplication"
cat > calc.py.new <<'EOF'
import sys


def parse(expr):
    """Split 'a op b' into (a, op, b); a and b may be negative."""
    expr = expr.replace(" ", "")
    for i, ch in enumerate(expr):
        if ch in "+-*/":
            return int(expr[:i]), ch, int(expr[i + 1 :])
    raise ValueError(expr)
EOF
sed -n '/^# ----/,$p' calc.py | sed '1s/^/\n\n/' >> calc.py.new
mv calc.py.new calc.py
printf '# calc\nA tiny calculator: `python3 calc.py "3 + 4"` (spaces optional).\n' > README.md
c 3 "Speed up parser"
sed -i 's/    raise ValueError(f"unknown operator {op!r}")/    if op == "\/\/":\n        return a \/\/ b\n    raise ValueError(f"unknown operator {op!r}")/' calc.py
c 4 "Add integer division"
printf 'MIT License\n' > LICENSE
git add LICENSE
c 5 "Add license file"
