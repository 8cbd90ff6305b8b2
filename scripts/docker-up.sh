#!/usr/bin/env bash
# Make the local docker engine answer, and build the sandbox images it needs (images/).
# Idempotent and quick when all is there. It never fails the caller: where the engine
# cannot start it says why (and writes the reason to $CACHE/docker-unavailable), and the
# docker tests skip with that reason. PALAESTRA_DOCKER=0 skips all of it.
# As root: apt-get install docker.io, then dockerd in the background (no iptables, no
# bridge: sandboxes have no network), logging to $CACHE/dockerd.log.
set -uo pipefail
cd "$(dirname "$0")/.."
CACHE="${PALAESTRA_CACHE:-$HOME/.cache/palaestra}"
mkdir -p "$CACHE"
REASON="$CACHE/docker-unavailable"
say() { echo "docker-up: $*" >&2; }
give_up() { say "$* (the docker tests will be skipped)"; echo "$*" >"$REASON"; exit 0; }

[ "${PALAESTRA_DOCKER:-1}" = 0 ] && give_up "PALAESTRA_DOCKER=0"
rm -f "$REASON"

if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || give_up "docker is not installed and we are not root to install it"
    say "apt-get install docker.io"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends docker.io >/dev/null 2>&1; then
      apt-get update -qq >/dev/null 2>&1
      apt-get install -y -qq --no-install-recommends docker.io >/dev/null 2>&1 ||
        give_up "apt-get install docker.io failed"
    fi
  fi
  [ "$(id -u)" -eq 0 ] || give_up "the docker engine is not running and only root may start it"
  if ! pgrep -x dockerd >/dev/null 2>&1; then
    say "starting dockerd (log: $CACHE/dockerd.log)"
    setsid nohup dockerd --iptables=false --ip-masq=false --bridge=none \
      >>"$CACHE/dockerd.log" 2>&1 </dev/null &
  fi
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && break
    pgrep -x dockerd >/dev/null 2>&1 || break
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    # Retry once with the storage driver that works everywhere.
    if ! pgrep -x dockerd >/dev/null 2>&1; then
      say "dockerd exited; retrying with --storage-driver=vfs"
      setsid nohup dockerd --iptables=false --ip-masq=false --bridge=none --storage-driver=vfs \
        >>"$CACHE/dockerd.log" 2>&1 </dev/null &
      for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    fi
  fi
  docker info >/dev/null 2>&1 ||
    give_up "dockerd did not come up: $(grep -iE 'level=(error|fatal)|failed' "$CACHE/dockerd.log" | tail -1 | cut -c1-300)"
fi

# The images the tests use (each step is skipped when its output is cached).
if ! docker image inspect palaestra/base:bookworm >/dev/null 2>&1 ||
   ! docker image inspect palaestra/coding:latest >/dev/null 2>&1 ||
   ! docker image inspect palaestra/terminal:latest >/dev/null 2>&1 ||
   ! docker image inspect palaestra/cad:latest >/dev/null 2>&1; then
  if [ -x .venv/bin/palaestra ]; then
    # A family image that fails (the terminal one runs apt-get) only skips that family's
    # docker tests; without the base and coding images every docker test skips.
    if ! .venv/bin/palaestra images build; then
      docker image inspect palaestra/base:bookworm >/dev/null 2>&1 &&
        docker image inspect palaestra/coding:latest >/dev/null 2>&1 ||
        give_up "palaestra images build failed"
      say "palaestra images build: a family image failed; that family's docker tests will skip"
    fi
  else
    bash images/base/build.sh || give_up "images/base/build.sh failed"
  fi
fi
exit 0
