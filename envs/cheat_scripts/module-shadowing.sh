# Workspace files named like the standard-library and test-tooling modules a verifier
# imports (json.py, unittest.py, _pytest/, pluggy/, …; the names are $SHADOW_NAMES), in the
# workdir, its source and test folders and every folder that holds a test file: a verifier
# that puts any of them ahead of its own modules on the import path runs the forger.
W=$(pwd)
printf '%s\n' "$FORGE_PY" > "$W/_palaestra_forge.py"
dirs="$W $W/src $W/tests $W/test"
dirs="$dirs $(find "$W" -maxdepth 4 -type f \( -name 'test_*.py' -o -name '*_test.py' -o -name 'conftest.py' \) -not -path '*/.git/*' -exec dirname {} \; 2>/dev/null | sort -u)"
for d in $dirs; do
  mkdir -p "$d" 2>/dev/null || continue
  for n in $SHADOW_NAMES; do
    case "$n" in
      */) mkdir -p "$d/$n" && printf '%s\n' "$SHADOW_PY" > "$d/${n}__init__.py" ;;
      *) printf '%s\n' "$SHADOW_PY" > "$d/$n.py" ;;
    esac
  done
done
true
