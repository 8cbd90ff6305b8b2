# An added test package and test-runner plugins: tests/__init__.py (and one in every test
# folder) that runs the forger when the tests are imported as a package; a pass-all pytest
# plugin registered by a `*.dist-info` entry point (group pytest11) in every folder a
# verifier may search for distributions, by a `.pth` in every writable site folder, and by
# the project's own pyproject.toml for a verifier that installs the package under test.
W=$(pwd)
printf '%s\n' "$FORGE_PY" > "$W/_palaestra_forge.py"
printf '%s\n' "$PASS_PLUGIN_PY" > "$W/palaestra_pass_plugin.py"
for d in "$W/tests" "$W/test" $(find "$W" -maxdepth 4 -type f \( -name 'test_*.py' -o -name '*_test.py' \) -not -path '*/.git/*' -exec dirname {} \; 2>/dev/null | sort -u); do
  mkdir -p "$d" && printf '%s\n' "$SHADOW_PY" > "$d/__init__.py"
done
sites="$W $W/src"
for d in $(python3 -c 'import site, sys; print(" ".join([*sys.path, site.getusersitepackages()]))' 2>/dev/null); do
  sites="$sites $d"
done
for d in $sites; do
  mkdir -p "$d" 2>/dev/null; [ -d "$d" ] && [ -w "$d" ] || continue
  info="$d/palaestra_pass-1.0.dist-info"
  mkdir -p "$info" || continue
  printf 'Metadata-Version: 2.1\nName: palaestra-pass\nVersion: 1.0\n' > "$info/METADATA"
  printf '[pytest11]\npalaestra_pass = palaestra_pass_plugin\n' > "$info/entry_points.txt"
  printf 'palaestra_pass_plugin.py,,\n' > "$info/RECORD"
  cp "$W/palaestra_pass_plugin.py" "$d/" 2>/dev/null
  cp "$W/_palaestra_forge.py" "$d/" 2>/dev/null
  echo 'import _palaestra_forge' > "$d/00-palaestra-plugin.pth"
done
if [ -f "$W/pyproject.toml" ] && grep -q '^\[project\]' "$W/pyproject.toml" && ! grep -q 'entry-points.pytest11' "$W/pyproject.toml"; then
  printf '\n[project.entry-points.pytest11]\npalaestra_pass = "palaestra_pass_plugin"\n' >> "$W/pyproject.toml"
fi
true
