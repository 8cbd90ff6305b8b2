"""A bwrap sandbox's filesystem: the host's ``/usr`` or an image's rootfs, the synthetic
``/etc``, and the bind argv (`static_args`) every jail of one sandbox is started with."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import posixpath
import secrets
import shutil
from pathlib import Path

from palaestra.sandbox.base import SandboxCreateError, SandboxSpec
from palaestra.sandbox.preamble import SANDBOX_GID, SANDBOX_UID

_ETC_COPIED = ("ld.so.cache", "alternatives", "ssl/certs", "ca-certificates", "localtime")
_ETC_SYNTHETIC = ("passwd", "group", "hosts")


def usr_symlinks() -> list[str]:
    """Mirror the host's /bin, /lib, /lib64, /sbin (symlinks into /usr on merged-/usr hosts)."""
    out: list[str] = []
    for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        host = f"/{name}"
        if os.path.islink(host):
            out += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            out += ["--ro-bind", host, host]
    return out


def etc_args() -> list[str]:
    """Only the /etc files programs need (never the whole /etc)."""
    out: list[str] = []
    for p in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl/certs", "/etc/ca-certificates"):
        if os.path.exists(p):
            out += ["--ro-bind", p, p]
    lt = "/etc/localtime"
    if os.path.islink(lt):
        out += ["--symlink", os.readlink(lt), lt]
    elif os.path.isfile(lt):
        out += ["--ro-bind", lt, lt]
    return out


def write_etc_files(etc: Path, workdir: str) -> None:
    """The synthetic /etc/passwd, group and hosts bound read-only into every sandbox."""
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{workdir}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n")
    for f in _ETC_SYNTHETIC:
        os.chmod(etc / f, 0o644)


def write_etc_tree(etc: Path) -> Path:
    """``<etc>/etc``: the whole ``/etc`` of a host-``/usr`` sandbox, bound read-only at once.

    It holds the synthetic passwd, group and hosts (already in `etc`) and copies of what
    `etc_args` binds one by one (symlinks kept as symlinks).  One bind instead of eight: bwrap
    re-reads ``/proc/self/mountinfo`` for every read-only bind, ≈ 0.3 ms of CPU each.  Built
    once per runtime folder and workdir (atomically, by rename), so a host change to those
    files reaches new sandboxes after a server restart."""
    tree = etc / "etc"
    if tree.is_dir():
        return tree
    tmp = etc / f"etc.{secrets.token_hex(4)}.tmp"
    try:
        tmp.mkdir(mode=0o755)
        for f in _ETC_SYNTHETIC:
            shutil.copy2(etc / f, tmp / f)
        for rel in _ETC_COPIED:
            src, dst = Path("/etc") / rel, tmp / rel
            dst.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            if src.is_symlink() and rel == "localtime":
                os.symlink(os.readlink(src), dst)
            elif src.is_dir():
                shutil.copytree(src, dst, symlinks=True)
            elif src.is_file():
                shutil.copy2(src, dst)
        for dirpath, _, _ in os.walk(tmp):
            os.chmod(dirpath, 0o755)
        try:
            os.rename(tmp, tree)
        except OSError:
            if not tree.is_dir():  # not "another sandbox was first"
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tree


def image_args(root: Path, workdir: str) -> list[str]:
    """Bind a rootfs's top-level entries read-only (never those we mount ourselves)."""
    top = workdir.strip("/").split("/")[0]
    skip = {"proc", "dev", "sys", "tmp", "run", top}
    out: list[str] = []
    for name in sorted(os.listdir(root)):
        if name in skip:
            continue
        host = root / name
        if host.is_symlink():
            out += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            out += ["--ro-bind", str(host), f"/{name}"]
    return out


def closed_to(path: Path, uid: int) -> Path | None:
    """The folder on the way to `path` that `uid` (no supplementary groups) cannot traverse,
    the highest one; None when it can reach `path`."""
    closed = None
    for p in (path, *path.parents):
        try:
            st = os.stat(p)
        except OSError:
            return p
        if st.st_uid == uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == uid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            closed = p
    return closed


def reachable_by(path: Path, uid: int) -> bool:
    """Whether `uid` can traverse every folder down to `path`."""
    return closed_to(path, uid) is None


_mounted: set[str] = set()


def reachable_source(path: Path, runtime_dir: Path, host_uid: int | None, kind: str) -> Path:
    """Where bwrap (running as `host_uid`) can reach the host folder `path`.

    If some directory above it is closed to that uid (an image cached under /root, a venv or
    a checkout in a 0700 folder), the folder is bind-mounted read-only (not recursively) once
    per server at ``<runtime_dir>/<kind>-<hash>``, a folder the collector unmounts when the
    server is gone. Its files must still be readable by others (served.py checks palaestra's
    own binds at serve start)."""
    if host_uid is None or reachable_by(path, host_uid):
        return path
    tag = hashlib.sha256(os.fsencode(path)).hexdigest()[:12]
    target = runtime_dir / f"{kind}-{tag}"
    if str(target) in _mounted:
        return target
    target.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(runtime_dir, 0o711)
    ms_bind, ms_remount, ms_ro, ms_nosuid, ms_nodev = 0x1000, 0x20, 0x1, 0x2, 0x4
    src, dst = os.fsencode(path), os.fsencode(target)
    if libc().mount(src, dst, None, ms_bind, None) != 0:
        err = ctypes.get_errno()
        raise SandboxCreateError(
            f"cannot bind {path} where the sandbox uid {host_uid} can reach it: "
            f"{os.strerror(err)}; install it where uid {host_uid} can traverse every folder "
            "above it (o+x)"
        )
    flags = ms_bind | ms_remount | ms_ro | ms_nosuid | ms_nodev
    if libc().mount(None, dst, None, flags, None) != 0:
        err = ctypes.get_errno()
        unmount(target)
        raise SandboxCreateError(f"cannot make the bind of {path} read-only: {os.strerror(err)}")
    _mounted.add(str(target))
    return target


def reachable_binds(
    binds: tuple[tuple[str, str], ...], runtime_dir: Path, host_uid: int | None
) -> tuple[tuple[str, str], ...]:
    """A spec's read-only binds with each host folder where the sandbox uid reaches it."""
    return tuple(
        (str(reachable_source(Path(host), runtime_dir, host_uid, "bind")), target)
        for host, target in binds
    )


def _is_plain_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def static_args(
    bwrap: str,
    spec: SandboxSpec,
    *,
    image: Path | None,
    etc: Path,
    etc_tree: Path | None,
    workspace: Path,
    binds: tuple[tuple[str, str], ...] | None = None,
) -> list[str]:
    """The bwrap argv every exec of a sandbox shares: its root (the host's /usr or `image`),
    /etc (`etc_tree` in one bind, else file by file from `etc`), /proc, /dev, /tmp, the
    workspace at the workdir, the read-only `binds` (default: the spec's), the namespaces
    and the uid."""
    workdir = posixpath.normpath(spec.workdir)
    a = [bwrap]
    etc_files: tuple[str, ...] = ()
    if image is None and etc_tree is not None:
        a += ["--ro-bind", "/usr", "/usr", *usr_symlinks()]
        a += ["--ro-bind", str(etc_tree), "/etc"]
    elif image is None:
        a += ["--ro-bind", "/usr", "/usr", *usr_symlinks(), *etc_args()]
        etc_files = _ETC_SYNTHETIC
    else:
        a += image_args(image, workdir)
        # Over the image's own where it has them (a read-only root cannot grow new files).
        etc_files = tuple(f for f in _ETC_SYNTHETIC if _is_plain_file(image / "etc" / f))
    for f in etc_files:
        a += ["--ro-bind", str(etc / f), f"/etc/{f}"]
    size = str(spec.workspace_mb * 1024 * 1024)
    a += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm"]
    a += ["--size", size, "--tmpfs", "/tmp"]
    a += ["--bind", str(workspace), workdir]
    for host, target in spec.ro_binds if binds is None else binds:
        a += ["--ro-bind", host, posixpath.normpath(target)]
    if spec.network or spec.gateway is not None:  # its own namespace and listener (netns.py)
        a += ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts"]
        a += ["--unshare-cgroup-try", "--disable-userns"]
    else:
        a += ["--unshare-all", "--unshare-user", "--disable-userns"]
    a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", "sandbox"]
    a += ["--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    return a


def shell_source(image: Path | None) -> str | None:
    """The host path of a sandbox's own bash (the image's, or the host's /usr); None if none."""
    root = str(image) if image is not None else "/"
    for rel in ("usr/bin/bash", "bin/bash"):
        p = os.path.join(root, rel)
        for _ in range(8):  # follow symlinks inside the rootfs, never out of it
            if not os.path.islink(p):
                break
            target = os.readlink(p)
            base = root if target.startswith("/") else os.path.dirname(p)
            p = os.path.normpath(os.path.join(base, target.lstrip("/")))
        if os.path.isfile(p):
            return p
    return None


@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(target: Path, options: str) -> str:
    """mount(2) a tmpfs (a syscall, not a `mount` process: ~2 ms less a sandbox). "" on success."""
    flags = 0x2 | 0x4  # MS_NOSUID | MS_NODEV (not MS_NOEXEC: the agent runs programs it writes)
    rc = libc().mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, options.encode())
    if rc != 0:
        err = ctypes.get_errno()
        return f"mount tmpfs on {target}: {os.strerror(err)}"
    return ""


def remove_tree(root: Path, mount: Path | None) -> None:
    """Unmount `mount` (if any), then remove `root` and all below it."""
    if mount is not None:
        unmount(mount)
    shutil.rmtree(root, ignore_errors=True)


def unmount(target: Path) -> None:
    """umount2(2), falling back to a lazy detach if the mount is still busy."""
    path = os.fsencode(target)
    if libc().umount2(path, 0) != 0:
        libc().umount2(path, 2)  # MNT_DETACH
