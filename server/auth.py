"""Bearer tokens with scopes (DESIGN §3, §6, §9).

Scopes: `train` (episodes on public splits), `eval` (episodes on sealed splits, and on
public ones), `publish` (POST /v1/packs), `harness` (a reset that names a harness and the
model endpoint it calls, beside `train` or `eval`), `admin` (everything, token admin, the
oracle on sealed splits). A token is shown once, when it is made; the store keeps only its sha256.

The server checks a token on every `/v1` request. The lookup is cached in memory (token
hash → principal, a few seconds), so the step fast path pays a dict lookup, not a query;
a token revoked over HTTP is dropped from the cache at once, one revoked with the CLI
on the server's data dir stops working within `CACHE_TTL_S`.

`auth = "off"` makes every request an admin: for local experiments only, never on a
network anyone else can reach.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palaestra.sdk.errors import AuthenticationError, BadRequestError, PermissionDeniedError
from palaestra.server.db import Database, IntegrityError

TRAIN, EVAL, PUBLISH, ADMIN = "train", "eval", "publish", "admin"
HARNESS = "harness"  # may start harness episodes, which name a model endpoint the server calls
SCOPES = (TRAIN, EVAL, PUBLISH, HARNESS, ADMIN)
TOKEN_FILE = "admin.token"
LOCAL_ADMIN = "local-admin"
PREFIX = "pal_"
CACHE_TTL_S = 5.0
CACHE_MAX = 10_000

HOW_TO_GET_ONE = (
    "send 'Authorization: Bearer <token>'; the server's local admin token is in "
    f"<data dir>/{TOKEN_FILE} on its machine, and `palaestra token create --scope train` "
    "(or eval, publish, harness, admin) makes others"
)


@dataclass(frozen=True)
class Quota:
    """A token's own limits; None falls back to the server-wide default in Settings."""

    max_live: int | None = None
    max_episodes_per_hour: int | None = None
    max_cpu_s_per_hour: float | None = None


NO_QUOTA = Quota()


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's name, id, scopes (`admin` implies every scope), the orgs it
    may publish into (granted by an admin) and its quota.

    `token_id` is what episodes are owned by (DESIGN §3: an episode belongs to the token that
    started it)."""

    name: str
    scopes: frozenset[str]
    token_id: str = ""
    orgs: frozenset[str] = frozenset()
    quota: Quota = NO_QUOTA

    def has(self, scope: str) -> bool:
        return scope in self.scopes or ADMIN in self.scopes

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    def require(self, scope: str, what: str) -> None:
        if not self.has(scope):
            raise PermissionDeniedError(
                f"{what} needs a token with the {scope!r} scope; this token "
                f"({self.name!r}) has {sorted(self.scopes) or 'no scopes'}",
                code="missing_scope",
            )

    def require_episodes(self, sealed: bool, split: str | None) -> None:
        """Starting or driving an episode: `eval` on a sealed split, `train` or `eval` else."""
        if sealed:
            if not self.has(EVAL):
                where = f"split {split!r} is sealed" if split else "this episode's split is sealed"
                raise PermissionDeniedError(
                    f"{where}: episodes on it need a token with the 'eval' "
                    f"scope; this token ({self.name!r}) has {sorted(self.scopes) or 'none'}",
                    code="missing_scope",
                )
        elif not (self.has(TRAIN) or self.has(EVAL)):
            raise PermissionDeniedError(
                f"episodes need a token with the 'train' scope (or 'eval'); this token "
                f"({self.name!r}) has {sorted(self.scopes) or 'none'}",
                code="missing_scope",
            )


# The in-process clients (embedded, trusted) and a server with auth = "off".
ADMIN_PRINCIPAL = Principal(
    name="embedded-admin", scopes=frozenset({ADMIN}), token_id="embedded-admin"
)

_ORG = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def check_scopes(scopes: Iterable[str]) -> list[str]:
    chosen = sorted(set(scopes))
    unknown = [s for s in chosen if s not in SCOPES]
    if unknown or not chosen:
        raise BadRequestError(
            f"scopes must be some of {list(SCOPES)}; got {chosen or 'none'}", code="bad_scope"
        )
    return chosen


def check_orgs(orgs: Iterable[str]) -> list[str]:
    chosen = sorted(set(orgs))
    bad = [o for o in chosen if not _ORG.match(o)]
    if bad:
        raise BadRequestError(
            f"org names are lowercase [a-z0-9._-] (at most 64); got {bad}", code="bad_org"
        )
    return chosen


def check_quota(quota: Quota) -> Quota:
    for field_name in ("max_live", "max_episodes_per_hour", "max_cpu_s_per_hour"):
        value = getattr(quota, field_name)
        if value is not None and not (value >= 0 and value < 1e12):
            raise BadRequestError(
                f"{field_name} must be a finite number >= 0; got {value!r}", code="bad_quota"
            )
    return quota


# -- the tokens table (in the server's database: server/db.py) ---------------------------------


def create_token(
    db: Database,
    scopes: Iterable[str],
    name: str | None = None,
    token: str | None = None,
    *,
    orgs: Iterable[str] = (),
    quota: Quota = NO_QUOTA,
) -> tuple[str, dict[str, Any]]:
    """Make a token; returns it (the only time it is seen) and its public record.

    `orgs` are the pack orgs a publish token may publish into (granted by the admin who
    makes it); `quota` its own limits (None: the server's defaults)."""
    chosen = check_scopes(scopes)
    chosen_orgs = check_orgs(orgs)
    check_quota(quota)
    token = token or new_token()
    token_id = uuid.uuid4().hex[:12]
    name = name or f"token-{token_id}"
    now = time.time()
    try:
        db.run(
            "INSERT INTO tokens (id, name, hash, scopes, created_at, orgs, max_live,"
            " max_episodes_per_hour, max_cpu_s_per_hour) VALUES (?,?,?,?,?,?,?,?,?)",
            (
                token_id,
                name,
                hash_token(token),
                " ".join(chosen),
                now,
                " ".join(chosen_orgs),
                quota.max_live,
                quota.max_episodes_per_hour,
                quota.max_cpu_s_per_hour,
            ),
        )
    except IntegrityError:
        raise BadRequestError(
            f"a token named {name!r} exists already; pick another --name", code="token_exists"
        ) from None
    record = _record(token_id, name, " ".join(chosen), now, None, " ".join(chosen_orgs), quota)
    return token, record


def _record(
    token_id: str,
    name: str,
    scopes: str,
    created_at: float,
    revoked_at: float | None,
    orgs: str,
    quota: Quota,
) -> dict[str, Any]:
    return {
        "id": token_id,
        "name": name,
        "scopes": scopes.split(),
        "created_at": created_at,
        "revoked": revoked_at is not None,
        "orgs": orgs.split(),
        "max_live": quota.max_live,
        "max_episodes_per_hour": quota.max_episodes_per_hour,
        "max_cpu_s_per_hour": quota.max_cpu_s_per_hour,
    }


_SELECT = (
    "SELECT id, name, scopes, created_at, revoked_at, orgs, max_live, max_episodes_per_hour,"
    " max_cpu_s_per_hour FROM tokens"
)


def list_tokens(db: Database) -> list[dict[str, Any]]:
    rows = db.all(_SELECT + " ORDER BY created_at")
    return [_record(r[0], r[1], r[2], r[3], r[4], r[5], Quota(r[6], r[7], r[8])) for r in rows]


def revoke_token(db: Database, name_or_id: str) -> list[str]:
    """Revoke by name or id; returns the hashes revoked (empty: no such live token)."""
    with db.transaction() as conn:
        rows = conn.all(
            "SELECT hash FROM tokens WHERE (name=? OR id=?) AND revoked_at IS NULL",
            (name_or_id, name_or_id),
        )
        conn.execute(
            "UPDATE tokens SET revoked_at=? WHERE (name=? OR id=?) AND revoked_at IS NULL",
            (time.time(), name_or_id, name_or_id),
        )
    return [r[0] for r in rows]


def lookup(db: Database, token_hash: str) -> Principal | None:
    row = db.one(_SELECT + " WHERE hash=? AND revoked_at IS NULL", (token_hash,))
    if row is None:
        return None
    return Principal(
        name=row[1],
        scopes=frozenset(row[2].split()),
        token_id=row[0],
        orgs=frozenset(row[5].split()),
        quota=Quota(row[6], row[7], row[8]),
    )


def ensure_admin_token(data_dir: Path, db: Database) -> Path:
    """`<data_dir>/admin.token` (mode 0600), made at first start; registered if the store lost it.

    A revoked local admin token stays revoked: delete the file to get a new one."""
    path = data_dir / TOKEN_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        known = db.one("SELECT 1 FROM tokens WHERE hash=?", (hash_token(token),))
        if known is None:
            name = LOCAL_ADMIN if not _name_taken(db, LOCAL_ADMIN) else None
            create_token(db, [ADMIN], name=name, token=token)
        return path
    name = LOCAL_ADMIN if not _name_taken(db, LOCAL_ADMIN) else None
    token, _ = create_token(db, [ADMIN], name=name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return path


def _name_taken(db: Database, name: str) -> bool:
    return db.one("SELECT 1 FROM tokens WHERE name=?", (name,)) is not None


def read_token_file(data_dir: Path) -> str | None:
    path = data_dir / TOKEN_FILE
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class Authenticator:
    """Header → principal, with an in-memory cache of token hash → principal."""

    def __init__(self, db: Database, mode: str = "token") -> None:
        self.db = db
        self.off = mode == "off"
        self._cache: dict[str, tuple[Principal, float]] = {}
        # An Authorization header's bytes -> its token's hash, for headers that named a valid
        # token in the canonical form (`Bearer <token>`: one entry a token, however a client
        # pads or cases the header): the step fast path skips parsing and hashing (SHA-256 a
        # request). A revoked token's hash leaves `_cache` (`forget`), so its header is looked
        # up again.
        self._hashes: dict[bytes, str] = {}

    def from_headers(self, headers: Iterable[tuple[bytes, bytes]]) -> Principal:
        """From raw ASGI headers (the step fast path)."""
        if self.off:
            return ADMIN_PRINCIPAL
        for key, value in headers:
            if key == b"authorization":
                known = self._hashes.get(value)
                if known is not None:
                    hit = self._cache.get(known)
                    if hit is not None and hit[1] > time.monotonic():
                        return hit[0]
                    return self._by_hash(known)  # looked up again: revoked, or 5 s old
                token = self._token(value.decode("latin-1"))
                known = hash_token(token)
                principal = self._by_hash(known)
                if value == b"Bearer " + token.encode("latin-1"):
                    if len(self._hashes) >= CACHE_MAX:
                        self._hashes.clear()
                    self._hashes[value] = known
                return principal
        raise AuthenticationError("no bearer token: " + HOW_TO_GET_ONE, code="unauthenticated")

    def from_value(self, value: str | None) -> Principal:
        if self.off:
            return ADMIN_PRINCIPAL
        return self.principal(self._token(value))

    @staticmethod
    def _token(value: str | None) -> str:
        """The token of an Authorization header's value."""
        if not value:
            raise AuthenticationError("no bearer token: " + HOW_TO_GET_ONE, code="unauthenticated")
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError(
                "the Authorization header must be 'Bearer <token>': " + HOW_TO_GET_ONE,
                code="unauthenticated",
            )
        return token

    def principal(self, token: str) -> Principal:
        return self._by_hash(hash_token(token))

    def _by_hash(self, key: str) -> Principal:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        found = lookup(self.db, key)
        if found is None:
            self._cache.pop(key, None)
            raise AuthenticationError(
                "the token is unknown or revoked: " + HOW_TO_GET_ONE, code="invalid_token"
            )
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[key] = (found, now + CACHE_TTL_S)
        return found

    def forget(self, hashes: Iterable[str]) -> None:
        for key in hashes:
            self._cache.pop(key, None)
