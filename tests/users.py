"""A normal (non-root) user for the tests that run something as one: the account, whether
it can reach a path of root's, and the command prefix that becomes it (root + setpriv).

Used by tests/adversarial/test_server_files.py (the sandboxes of a server run as a normal
user) and tests/install/test_wheel_install.py (a wheel a normal user installed and serves).
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path


def normal_user() -> pwd.struct_passwd | None:
    """A non-root account with a home it owns, to run the server as."""
    for uid in (1000, 1001):
        try:
            user = pwd.getpwuid(uid)
        except KeyError:
            continue
        home = Path(user.pw_dir)
        if home.is_dir() and home.stat().st_uid == uid:
            return user
    return None


def why_not_root_and_user() -> str:
    """Why the suite cannot become a normal user here ("" when it can): it must be root,
    have setpriv and a normal user with a home."""
    if os.getuid() != 0:
        return "needs root (to become a normal user with a home)"
    if shutil.which("setpriv") is None:
        return "needs setpriv (to become a normal user)"
    if normal_user() is None:
        return "needs a normal user (uid 1000 or 1001) with a home it owns"
    return ""


def closed_to_others(path: Path) -> str | None:
    """Why another uid could not read `path` (None if it can): o+x on every ancestor, o+r on
    the path itself (o+x too where it is a directory)."""
    path = path.resolve()
    for part in path.parents:
        if not part.stat().st_mode & stat.S_IXOTH:
            return f"{part} lacks o+x"
    mode = path.stat().st_mode
    if not mode & stat.S_IROTH or (path.is_dir() and not mode & stat.S_IXOTH):
        return f"{path} lacks o+r"
    return None


def as_user(
    user: pwd.struct_passwd, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> list[str]:
    """The argv prefix that runs a command as `user` (no groups, no capabilities) in an
    environment of only HOME, PATH and `env`, in the folder `cwd` (else the caller's)."""
    argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    argv += ["env", "-i", *([f"--chdir={cwd}"] if cwd is not None else [])]
    base = {"HOME": user.pw_dir, "PATH": "/usr/bin:/bin", **(env or {})}
    return [*argv, *(f"{k}={v}" for k, v in base.items())]
