#!/usr/bin/env bash
# The base sandbox image: a minimal Debian bookworm rootfs (debootstrap, python3 included),
# kept as a directory bwrap can use as an image rootfs and imported into the local docker
# engine as palaestra/base:bookworm (no registry is reachable, so nothing is pulled).
# PALAESTRA_BASE_SUITE=trixie makes another suite's the same way, as palaestra/base:trixie
# (Debian 13, python3 = 3.13: the images/python3.13 stand-in is FROM it), cached apart.
#
# Cached under $PALAESTRA_CACHE (default ~/.cache/palaestra)/images/base/ (another suite:
# images/base-<suite>/):
#   rootfs.tar  the debootstrap output (skips debootstrap when present)
#   rootfs/     the same tree unpacked (for bwrap)
# The docker import is skipped when the image already exists. FORCE=1 rebuilds everything.
# Usage: images/base/build.sh [--no-docker]
set -euo pipefail

SUITE="${PALAESTRA_BASE_SUITE:-bookworm}"
case "$SUITE" in *[!a-z]* | "") echo "images/base: suite '$SUITE' is not a Debian codename" >&2; exit 2 ;; esac
TAG="${PALAESTRA_BASE_TAG:-palaestra/base:$SUITE}"
CACHE="${PALAESTRA_CACHE:-$HOME/.cache/palaestra}"
DIR="$CACHE/images/base"
[ "$SUITE" = bookworm ] || DIR="$CACHE/images/base-$SUITE"
TAR="$DIR/rootfs.tar"
ROOTFS="$DIR/rootfs"
DOCKER=1
[ "${1:-}" = "--no-docker" ] && DOCKER=0
log() { echo "images/base: $*" >&2; }

# The Debian mirror apt already uses (deb822 .sources first, then sources.list).
mirror() {
  local uri
  uri=$(awk 'tolower($1)=="uris:"{print $2}' /etc/apt/sources.list.d/*.sources 2>/dev/null |
    grep -v -- '-security' | grep -m1 -i debian || true)
  if [ -z "$uri" ]; then
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1=="deb"{for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' |
      grep -v -- '-security' | grep -m1 -i debian || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

mkdir -p "$DIR"
if [ "${FORCE:-0}" = 1 ]; then rm -rf "$TAR" "$ROOTFS"; fi

if [ ! -s "$TAR" ]; then
  [ "$(id -u)" -eq 0 ] || { log "debootstrap needs root"; exit 1; }
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "apt-get install debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 || {
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
  fi
  MIRROR=$(mirror)
  tmp="$DIR/rootfs.build"
  rm -rf "$tmp"
  log "debootstrap --variant=minbase --include=python3 $SUITE ($MIRROR)"
  start=$(date +%s)
  if ! debootstrap --variant=minbase --include=python3-minimal,python3 \
      "$SUITE" "$tmp" "$MIRROR" >"$DIR/debootstrap.log" 2>&1; then
    log "debootstrap failed; see $DIR/debootstrap.log"; tail -20 "$DIR/debootstrap.log" >&2
    rm -rf "$tmp"; exit 1
  fi
  # Small and reproducible-ish: no package caches or lists, a sandbox user, a writable /tmp.
  rm -rf "$tmp"/var/cache/apt/*.bin "$tmp"/var/cache/apt/archives/*.deb \
    "$tmp"/var/lib/apt/lists/* "$tmp"/var/log/*.log "$tmp"/usr/share/doc/* \
    "$tmp"/usr/share/man/* "$tmp"/usr/share/locale/* "$tmp"/usr/share/info/*
  grep -q '^sandbox:' "$tmp/etc/passwd" ||
    echo 'sandbox:x:1000:1000:sandbox:/work:/bin/sh' >>"$tmp/etc/passwd"
  grep -q '^sandbox:' "$tmp/etc/group" || echo 'sandbox:x:1000:' >>"$tmp/etc/group"
  mkdir -p "$tmp/work" && chown 1000:1000 "$tmp/work"
  tar --numeric-owner -C "$tmp" -cf "$TAR.part" . && mv "$TAR.part" "$TAR"
  rm -rf "$ROOTFS" && mv "$tmp" "$ROOTFS"
  log "rootfs built in $(( $(date +%s) - start )) s: $(du -sh "$TAR" | cut -f1) at $TAR"
elif [ ! -x "$ROOTFS/usr/bin/python3" ]; then
  log "unpacking $TAR into $ROOTFS"
  rm -rf "$ROOTFS.part" && mkdir -p "$ROOTFS.part"
  tar --numeric-owner -C "$ROOTFS.part" -xf "$TAR" && rm -rf "$ROOTFS" && mv "$ROOTFS.part" "$ROOTFS"
fi

[ "$DOCKER" = 1 ] || exit 0
if docker image inspect "$TAG" >/dev/null 2>&1 && [ "${FORCE:-0}" != 1 ]; then
  log "$TAG already in the engine"
  exit 0
fi
log "docker import $TAR as $TAG"
docker import \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1' \
  --change 'WORKDIR /work' --change 'CMD ["/bin/sh"]' \
  "$TAR" "$TAG" >/dev/null
log "$TAG imported"
