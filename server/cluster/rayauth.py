"""Ray token authentication for cluster mode (DESIGN §5b; issue 34, invariant 7).

Whoever joins the Ray cluster a front uses can ask any worker for its channel key (its
`info()`) and then step, read or close every episode as any token, admin included. So
palaestra runs Ray with token authentication (`RAY_AUTH_MODE=token`, Ray ≥ 2.52): a local
cluster (`--ray local:N`) gets a token in `ray_token_file` (0600, in a 0700 folder) that
every process it starts inherits by path; joining a cluster at an address, a process
without any token first asks the cluster a question: a cluster that answers it runs without
authentication and is refused unless `ray_allow_unauthenticated` says the operator accepts
it. Ray reads its auth mode and token only from the environment, so that is where this
module puts them (and makes an already imported Ray read them again).
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from palaestra.server.config import Settings
from palaestra.server.heldout import create_secret_file

log = logging.getLogger("palaestra.cluster")

TOKEN_FILE = Path("ray") / "auth_token"  # under the data dir, unless ray_token_file says
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
PROBE_TIMEOUT_S = 10.0

# Run by a process with no token and auth off: does the GCS at argv[1] answer a question?
PROBE = """\
import sys
from ray._raylet import GcsClient
from ray.exceptions import AuthenticationError
try:
    GcsClient(address=sys.argv[1]).internal_kv_keys(b"", None, timeout=float(sys.argv[2]))
except AuthenticationError:
    print("closed")
except Exception as exc:
    print("error", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
else:
    print("open")
"""

UNAUTHENTICATED = (
    "the Ray cluster at {address} runs without token authentication: any process that "
    "reaches it can read the workers' channel keys and act on every episode. Start every "
    "Ray node with RAY_AUTH_MODE=token and one shared RAY_AUTH_TOKEN (KubeRay: "
    "spec.authOptions.mode: token) and give palaestra that token (a file at "
    "PALAESTRA_RAY_TOKEN_FILE, default {path}, or RAY_AUTH_TOKEN), or, only where nothing "
    "else can reach the cluster, accept it with PALAESTRA_RAY_ALLOW_UNAUTHENTICATED=true"
)


class RayAuthError(RuntimeError):
    """The cluster's authentication is missing or refuses palaestra's token; says what to set."""


def token_path(settings: Settings) -> Path:
    return settings.ray_token_file or settings.data_dir / TOKEN_FILE


def make_private(path: Path, own_folder: bool) -> None:
    """Keep the token readable by this user only: the file 0600 and, when the folder is
    palaestra's own, the folder 0700 (an operator's folder, or a read-only mount such as a
    Kubernetes Secret's, is only warned about)."""
    items = [(path.parent, 0o700), (path, 0o600)] if own_folder else [(path, 0o600)]
    for item, mode in items:
        current = item.stat().st_mode & 0o777
        if current & 0o077:
            try:
                item.chmod(mode)
            except OSError as exc:
                log.warning("%s is open to others (mode %o) and stays so: %s", item, current, exc)
            else:
                log.warning("%s was open to others (mode %o); made it %o", item, current, mode)
    if not own_folder and path.parent.stat().st_mode & 0o022:
        log.warning("others may replace %s: its folder is writable by them", path)


def ensure_token(path: Path, own_folder: bool) -> None:
    """The token file at `path`, made (never overwritten) with a new random token."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    create_secret_file(path, secrets.token_hex(32))
    make_private(path, own_folder)
    if not path.read_text(encoding="ascii").strip():
        raise RayAuthError(f"{path}: the Ray token file is empty; delete it to make a new one")


def raylet_module() -> Any:
    """Ray's compiled core (its type stubs lack the auth and GCS client calls used here)."""
    return importlib.import_module("ray._raylet")


def reload_ray_config() -> None:
    """Make an already imported Ray read its auth mode and token from the environment again
    (Ray caches both; it does the same when it turns token auth on for `ray.init()`)."""
    if "ray" not in sys.modules:
        return
    raylet = raylet_module()
    raylet.Config.initialize("")
    raylet.AuthenticationTokenLoader.instance().reset_cache()


def use_token(path: Path | None) -> None:
    """Run Ray in token mode, with the token in `path` (None: Ray's own sources); the
    processes this one starts (a local cluster's nodes, its actors) inherit it."""
    os.environ["RAY_AUTH_MODE"] = "token"
    if path is not None:
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
        os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file
    reload_ray_config()


def ray_token_source() -> Path | str | None:
    """Where Ray's own sources hold a token, in Ray's order: "RAY_AUTH_TOKEN" (the variable),
    else the file of RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token; None where none holds one."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    file = Path(named) if named else Path.home() / ".ray" / "auth_token"
    try:
        return file if file.read_text(encoding="utf-8").strip() else None
    except OSError:
        return None


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> Literal["open", "closed"]:
    """Whether the GCS at `address` answers a process that holds no token ("open") or
    refuses it ("closed"); RayAuthError when it does neither."""
    env = {k: v for k, v in os.environ.items() if k not in RAY_AUTH_VARS}
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("RAY_ENABLE_K8S_TOKEN_AUTH", None)
    with tempfile.TemporaryDirectory(prefix="palaestra-probe-") as home:
        env["HOME"] = home  # not this user's ~/.ray/auth_token either
        try:
            run = subprocess.run(
                [sys.executable, "-c", PROBE, address, str(timeout_s)],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s + 30,
            )
        except subprocess.TimeoutExpired:
            raise RayAuthError(f"the Ray cluster at {address} did not answer in time") from None
    answer = run.stdout.strip().splitlines()[-1:] or [run.stderr.strip()[-300:]]
    if answer[0] in ("open", "closed"):
        return "open" if answer[0] == "open" else "closed"
    raise RayAuthError(f"cannot ask the Ray cluster at {address} about its auth: {answer[0]}")


def check_token(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """With this process's token (after use_token): RayAuthError unless the cluster takes it."""
    from ray.exceptions import AuthenticationError

    try:
        raylet_module().GcsClient(address=address).internal_kv_keys(b"", None, timeout=timeout_s)
    except AuthenticationError:
        raise RayAuthError(
            f"the Ray cluster at {address} refuses palaestra's token: give it the cluster's "
            "token (PALAESTRA_RAY_TOKEN_FILE or RAY_AUTH_TOKEN)"
        ) from None


def require_auth(settings: Settings, address: str) -> bool:
    """Before joining the cluster at `address` (host:port of its GCS): refuse one without
    token authentication (unless the operator accepts it), then find palaestra's token and
    check the cluster takes it. Whether the cluster is authenticated."""
    path = token_path(settings)
    if address.startswith("ray://"):
        if settings.ray_allow_unauthenticated:
            log.warning("Ray Client address %s: its authentication is not checked", address)
            return False
        raise RayAuthError(
            f"cannot check that the Ray Client address {address} requires a token: give the "
            "head's GCS address (host:6379) instead, or accept it with "
            "PALAESTRA_RAY_ALLOW_UNAUTHENTICATED=true"
        )
    if probe(address) == "open":
        if not settings.ray_allow_unauthenticated:
            raise RayAuthError(UNAUTHENTICATED.format(address=address, path=path))
        log.warning(
            "the Ray cluster at %s runs without token authentication "
            "(ray_allow_unauthenticated): anything that reaches it can act on every episode",
            address,
        )
        return False
    if path.exists():
        make_private(path, settings.ray_token_file is None)
        use_token(path)
    elif settings.ray_token_file is not None:
        raise RayAuthError(f"ray_token_file {path} does not exist: put the cluster's token there")
    elif (source := ray_token_source()) is not None:
        if isinstance(source, Path):  # `ray get-auth-token --generate` leaves it 0644
            make_private(source, own_folder=False)
        use_token(None)
    else:
        raise RayAuthError(
            f"the Ray cluster at {address} requires a token and palaestra has none: put it in "
            f"{path} (mode 0600), or name its file with PALAESTRA_RAY_TOKEN_FILE, or set "
            "RAY_AUTH_TOKEN"
        )
    check_token(address)
    return True
