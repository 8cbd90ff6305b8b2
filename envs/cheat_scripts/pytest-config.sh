# Workspace pytest configuration that turns every test into a pass: ini files that load a
# plugin from the workspace, and conftest.py files that rewrite every report to "passed".
W=$(pwd)
printf '%s\n' "$PASS_PLUGIN_PY" > "$W/palaestra_pass_plugin.py"
INI='addopts = -p palaestra_pass_plugin -p no:randomly
pythonpath = .
python_files = *.py
'
printf '[pytest]\n%s' "$INI" > "$W/pytest.ini"
printf '[tool:pytest]\n%s' "$INI" > "$W/setup.cfg"
printf '[pytest]\n%s' "$INI" > "$W/tox.ini"
[ -f "$W/pyproject.toml" ] || printf '[tool.pytest.ini_options]\naddopts = "-p palaestra_pass_plugin"\npythonpath = ["."]\n' > "$W/pyproject.toml"
printf 'from palaestra_pass_plugin import *  # noqa\n' > "$W/conftest.py"
find "$W" -mindepth 1 -maxdepth 3 -type d -not -path '*/.git*' | while IFS= read -r d; do
  cp "$W/palaestra_pass_plugin.py" "$d/conftest.py" 2>/dev/null
done
mkdir -p "$HOME/.config" && printf '[pytest]\n%s' "$INI" > "$HOME/.config/pytest.ini" 2>/dev/null
true
