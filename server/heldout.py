"""The server's held-out secret (DESIGN §5b): what sealed generated tasks derive seeds from.

A generated pack's code is public, so a seed anyone can compute (from the pack's name, a
task id, a documented range) lets anyone regenerate a held-out task's private fields: its
answer, its hidden parameters. The sealed splits of generators and sources therefore draw
their seeds from an HMAC of this secret: 32 random bytes in a file of the data dir
(`heldout.secret`, or `Settings.heldout_secret_file`), made at first start with mode 0600,
never served and never bound into a sandbox. Public splits keep their public seeds
(reproducible anywhere). A server keeps its held-out set across restarts as long as it
keeps the file; servers that should share one held-out set share the file.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import random
import secrets
from pathlib import Path

log = logging.getLogger("palaestra.heldout")

SECRET_FILE = "heldout.secret"
SECRET_BYTES = 32


def create_secret_file(path: Path, text: str) -> None:
    """Write `text` to `path` made 0600, unless the file exists already (never overwritten:
    two processes starting at once keep the first one's secret)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(text)


def ensure_secret(path: Path) -> bytes:
    """The secret in `path`, made (0600, never overwritten) when there is none yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    create_secret_file(path, secrets.token_hex(SECRET_BYTES) + "\n")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("%s was readable by others (mode %o); made it 0600", path, mode)
        path.chmod(0o600)
    text = path.read_text(encoding="ascii").strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path}: not a hex secret; delete it to make a new one") from None
    if len(secret) < 16:
        raise ValueError(f"{path}: the secret is too short; delete it to make a new one")
    return secret


def derive(secret: bytes, label: str) -> int:
    """A 256-bit integer only the secret's holder can compute, one per `label`."""
    return int.from_bytes(hmac.new(secret, label.encode(), hashlib.sha256).digest(), "big")


def seeded(secret: bytes, label: str) -> random.Random:
    """A generator seeded by `derive` (for drawing a sealed split's seeds)."""
    return random.Random(derive(secret, label))


def fingerprint(secret: bytes | None) -> str:
    """A name for caches of what the secret derived ('public' without one); it reveals
    nothing of the secret."""
    return "public" if secret is None else f"{derive(secret, 'cache-fingerprint'):064x}"[:16]


def task_digest(plain: str, secret: bytes | None) -> str:
    """The digest a task is served under: `plain` (sha256 over all its fields, public code)
    on a public split; keyed by the secret on a sealed one, where a plain digest would let
    anyone confirm a guessed private answer offline."""
    if secret is None:
        return plain
    keyed = hmac.new(secret, b"task-digest:" + plain.encode(), hashlib.sha256)
    return "sha256:" + keyed.hexdigest()


def fresh_seeds(
    secret: bytes, label: str, first: int, end: int, count: int, used: set[int]
) -> list[int]:
    """`count` distinct seeds of [first, end) outside `used`, drawn by `seeded(secret,
    label)` (a rotated held-out draw, server/draws.py); the caller checks enough are left."""
    rng = seeded(secret, label)
    size = end - first
    if size <= 1 << 20:  # a small range: choose among what is left
        left = [seed for seed in range(first, end) if seed not in used]
        return sorted(rng.sample(left, count))
    chosen: set[int] = set()
    while len(chosen) < count:  # a wide range: rejections are rare
        seed = rng.randrange(first, end)
        if seed not in used:
            chosen.add(seed)
    return sorted(chosen)
