# Sourced by the toolchain bootstraps (bootstrap-cad.sh, bootstrap-harness.sh) from the
# checkout: sets ROOT, where the sandbox toolchains live, by the rule of the toolchains_dir
# setting (envs/cad/runtime.py, server/harness/toolchain.py): $PALAESTRA_TOOLCHAINS_DIR, else
# /opt/palaestra/toolchains as root, else .toolchains in the checkout.
ROOT="${PALAESTRA_TOOLCHAINS_DIR:-}"
if [ -z "$ROOT" ]; then
  if [ "$(id -u)" -eq 0 ]; then ROOT=/opt/palaestra/toolchains; else ROOT="$PWD/.toolchains"; fi
fi
mkdir -p "$ROOT" && chmod 755 "$ROOT"
