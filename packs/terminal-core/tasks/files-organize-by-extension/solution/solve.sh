#!/bin/bash
set -euo pipefail
cd /work
find inbox -type f | while IFS= read -r path; do
  name=$(basename "$path")
  case "$name" in
    *.*) ext=$(printf '%s' "${name##*.}" | tr '[:upper:]' '[:lower:]') ;;
    *) ext=other ;;
  esac
  mkdir -p "sorted/$ext"
  mv "$path" "sorted/$ext/$name"
done
