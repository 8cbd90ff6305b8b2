"""The bwrap backend's exec helper: one small static C program, built from this file.

Why: a bwrap exec used to be ``sh`` (joins the cgroup, sets rlimits) → ``setpriv`` (host
uid 1000) → ``bwrap`` → the command, about 0.8 ms a hop, all of it after the caller asked
for the exec.  This helper replaces the first two hops with one and lets the bwrap jail be
started *before* the command is known:

``palaestra-exec launch [--cg FILE]... [--rl NAME=N]... [--ids UID:GID] -- PROG ARGS...``
    on the host, as the server's user: write its own pid into each cgroup ``FILE`` (so
    nothing it starts ever runs outside the sandbox's cgroup), set the rlimits (both soft
    and hard; NAME is fsize, core, nofile or as), drop to ``UID:GID`` with no supplementary
    groups, then exec ``PROG`` (bwrap).  Any failure exits 125 with a message on stderr.

``palaestra-exec stub FD``
    inside the jail (bwrap's command, already uid 1000, no capabilities, seccomp filter and
    rlimits applied): write one byte ``R`` to the socket ``FD`` (ready), read one request
    (its header carries, by SCM_RIGHTS, the command's stdout and stderr pipes, and its stdin
    pipe unless stdin is /dev/null: bwrap itself never holds them), write ``S`` (taken:
    whatever happens next is the command's outcome, so the host retries only a jail that
    died before this), put those pipes on 0/1/2, close ``FD`` and every other descriptor
    above 2, then become the command: ``chdir``, a fresh environment, ``execvp``.  A failed
    ``chdir`` exits 1 ("can't chdir"), a failed exec 127 (126 for an argument list too
    long), as a shell would; those are data, not faults.  If the socket closes without a
    request, it exits 0.

Request: ``PXR1``, a 4-byte little-endian body length, then NUL-terminated fields:
``stdin_null("0"|"1")``, ``cwd``, ``envc``, envc ``NAME=VALUE``, ``argc``, argc arguments.

The binary is compiled once (``cc -O2 -static``) into a root-only cache folder named by
the source's hash and copied into each backend's runtime folder; where no C compiler (or
no static libc) is found, `helper_binary` says why and the backend keeps the old launcher.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import shutil
import socket
import struct
import subprocess
import tempfile
from pathlib import Path

MAGIC = b"PXR1"
# Where the helper is bound, read-only, inside every jail.
INSIDE_PATH = "/.palaestra/exec"
LAUNCH_FAILED = 125

C_SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

extern char **environ;

static int fail(const char *what, const char *arg) {
    fprintf(stderr, "palaestra-exec: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    return 125;
}

static int set_limit(const char *spec) {
    const char *eq = strchr(spec, '=');
    if (!eq) { errno = EINVAL; return -1; }
    size_t n = (size_t)(eq - spec);
    int res;
    if (n == 5 && !strncmp(spec, "fsize", 5)) res = RLIMIT_FSIZE;
    else if (n == 4 && !strncmp(spec, "core", 4)) res = RLIMIT_CORE;
    else if (n == 6 && !strncmp(spec, "nofile", 6)) res = RLIMIT_NOFILE;
    else if (n == 2 && !strncmp(spec, "as", 2)) res = RLIMIT_AS;
    else { errno = EINVAL; return -1; }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(eq + 1, &end, 10);
    if (errno || *end) { errno = EINVAL; return -1; }
    struct rlimit rl = {(rlim_t)v, (rlim_t)v};
    return setrlimit(res, &rl);
}

static int launch(int argc, char **argv) {
    long uid = -1, gid = -1;
    int i = 2;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        if (i + 1 >= argc) { errno = EINVAL; return fail("missing value for", argv[i]); }
        const char *opt = argv[i], *val = argv[++i];
        if (!strcmp(opt, "--cg")) {
            int fd = open(val, O_WRONLY | O_CLOEXEC);
            char buf[32];
            int len = snprintf(buf, sizeof buf, "%ld", (long)getpid());
            if (fd < 0 || write(fd, buf, (size_t)len) != len) {
                fprintf(stderr, "palaestra: cannot join the sandbox cgroup\n");
                return 125;
            }
            close(fd);
        } else if (!strcmp(opt, "--rl")) {
            if (set_limit(val) != 0) return fail("setrlimit", val);
        } else if (!strcmp(opt, "--ids")) {
            if (sscanf(val, "%ld:%ld", &uid, &gid) != 2) {
                errno = EINVAL;
                return fail("--ids", val);
            }
        } else {
            errno = EINVAL;
            return fail("unknown option", opt);
        }
    }
    if (i >= argc) { errno = EINVAL; return fail("no program to run", NULL); }
    if (gid >= 0) {
        if (setgroups(0, NULL) != 0) return fail("setgroups", NULL);
        if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) return fail("setresgid", NULL);
    }
    if (uid >= 0 && setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
        return fail("setresuid", NULL);
    execv(argv[i], argv + i);
    return fail("cannot run", argv[i]);
}

static int read_all(int fd, char *buf, size_t n) {
    while (n) {
        ssize_t r = read(fd, buf, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

static void close_above_2(void) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3U, ~0U, 0U) == 0) return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = 3; fd < (max > 0 ? max : 65536); fd++) close((int)fd);
}

/* The next NUL-terminated field of [*p, end), or NULL when the request is malformed. */
static char *field(char **p, char *end) {
    char *s = *p;
    char *z = memchr(s, 0, (size_t)(end - s));
    if (!z) return NULL;
    *p = z + 1;
    return s;
}

/* The request's 8-byte header, and the descriptors sent with it (SCM_RIGHTS). */
static int recv_header(int fd, char *hdr, int *fds, int *nfds) {
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 3)];
    } u;
    struct iovec iov = {hdr, 8};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof u.buf;
    ssize_t r;
    do r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC); while (r < 0 && errno == EINTR);
    if (r <= 0) return -1;
    *nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            if (n > 3) n = 3;
            memcpy(fds, CMSG_DATA(c), n * sizeof(int));
            *nfds = (int)n;
        }
    }
    if (r < 8 && read_all(fd, hdr + r, (size_t)(8 - r)) != 0) return -1;
    return 0;
}

static int stub(int argc, char **argv) {
    if (argc < 3) return 125;
    int fd = atoi(argv[2]);
    char hdr[8];
    int fds[3], nfds = 0;
    if (write(fd, "R", 1) != 1) return 125;
    if (recv_header(fd, hdr, fds, &nfds) != 0) return 0; /* closed without a request */
    if (memcmp(hdr, "PXR1", 4) != 0) return 125;
    uint32_t len = (uint32_t)(unsigned char)hdr[4] | (uint32_t)(unsigned char)hdr[5] << 8 |
                   (uint32_t)(unsigned char)hdr[6] << 16 | (uint32_t)(unsigned char)hdr[7] << 24;
    char *body = malloc((size_t)len + 1);
    if (!body || read_all(fd, body, len) != 0) return 125;
    body[len] = 0;
    if (write(fd, "S", 1) != 1) return 125; /* took it: from here on, the command's outcome */
    char *p = body, *end = body + len;
    char *nul = field(&p, end), *cwd = field(&p, end), *cnt = field(&p, end);
    if (!nul || !cwd || !cnt) return 125;
    long envc = atol(cnt);
    if (envc < 0 || envc > (long)len) return 125;
    char **envp = calloc((size_t)envc + 1, sizeof(char *));
    if (!envp) return 125;
    for (long k = 0; k < envc; k++) if (!(envp[k] = field(&p, end))) return 125;
    if (!(cnt = field(&p, end))) return 125;
    long args = atol(cnt);
    if (args < 1 || args > (long)len) return 125;
    char **av = calloc((size_t)args + 1, sizeof(char *));
    if (!av) return 125;
    for (long k = 0; k < args; k++) if (!(av[k] = field(&p, end))) return 125;
    /* stdio sent with the request: [stdin,] stdout, stderr (never bwrap's own) */
    int first = nul[0] == '1' ? 1 : 0;
    if (nfds == 3 - first) {
        for (int k = 0; k < nfds; k++)
            if (dup2(fds[k], first + k) < 0) return 125;
    }
    if (nul[0] == '1') {
        int dn = open("/dev/null", O_RDONLY);
        if (dn < 0 || dup2(dn, 0) < 0) return fail("open", "/dev/null");
        if (dn != 0) close(dn);
    }
    close_above_2();
    if (chdir(cwd) != 0) {
        fprintf(stderr, "palaestra: can't chdir to %s: %s\n", cwd, strerror(errno));
        return 1;
    }
    environ = envp;
    execvp(av[0], av);
    if (errno == E2BIG) {
        fprintf(stderr, "palaestra: argument list too long (an argument over 128 KiB?)\n");
        return 126;
    }
    fprintf(stderr, "palaestra: execvp %s: %s\n", av[0], strerror(errno));
    return 127;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "launch")) return launch(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "stub")) return stub(argc, argv);
    fprintf(stderr, "usage: palaestra-exec launch|stub ...\n");
    return 2;
}
"""


def source_tag() -> str:
    return hashlib.sha256(C_SOURCE.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    cache = os.environ.get("PALAESTRA_CACHE") or str(Path.home() / ".cache" / "palaestra")
    return Path(cache) / "helpers"


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


@functools.cache
def helper_binary() -> tuple[Path | None, str]:
    """The built helper (compiling it on first use) and "", or None and why not (cached)."""
    if os.environ.get("PALAESTRA_EXEC_HELPER", "1") == "0":
        return None, "exec helper off: PALAESTRA_EXEC_HELPER=0"
    dest = cache_dir() / f"palaestra-exec-{source_tag()}"
    if dest.exists() and _trusted(dest) and _usable(dest):
        return dest, ""
    if dest.parent.exists() and not _trusted(dest.parent):
        # Someone else could swap what we would run as root: build a private copy instead.
        dest = Path(tempfile.mkdtemp(prefix="palaestra-helper-")) / dest.name
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc, clang) to build the exec helper"
    try:
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            src = Path(tmp) / "palaestra_exec.c"
            src.write_text(C_SOURCE)
            out = Path(tmp) / "palaestra-exec"
            argv = [cc, "-O2", "-static", "-o", str(out), str(src)]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
            if proc.returncode != 0:
                return None, f"building the exec helper failed: {proc.stderr.strip()[-500:]}"
            os.chmod(out, 0o755)
            os.replace(out, dest)  # atomic: a concurrent build wins or loses whole
        for old in dest.parent.glob("palaestra-exec-*"):  # earlier versions' builds
            if old != dest:
                with contextlib.suppress(OSError):
                    old.unlink()
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"building the exec helper failed: {e}"
    if not _usable(dest):
        return None, f"the exec helper at {dest} does not run"
    return dest, ""


def _trusted(path: Path) -> bool:
    """Whether only we (or root) can change `path` and the folder holding it: the helper
    runs as the server's user, root included."""
    for p in (path, path.parent):
        try:
            st = os.stat(p, follow_symlinks=False)
        except OSError:
            return False
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return False
    return True


def _usable(path: Path) -> bool:
    try:
        proc = subprocess.run([str(path)], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 2 and b"usage: palaestra-exec" in proc.stderr


def install(dest_dir: Path) -> Path | None:
    """A root-owned copy of the helper in `dest_dir` (reachable by the sandbox uid, which
    bwrap needs to bind it); None when there is no helper."""
    src, _ = helper_binary()
    if src is None:
        return None
    dest = dest_dir / src.name
    if dest.exists() and _trusted(dest):
        return dest
    dest_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    tmp = dest_dir / f"{src.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dest


def send(ctl: socket.socket, req: bytes, fds: list[int]) -> bytes:
    """Send a request's header with the command's stdio `fds`; returns what is left to send."""
    sent = socket.send_fds(ctl, [req[:8]], fds)
    return req[sent:]


def request(cwd: str, env: dict[str, str], argv: list[str], stdin_null: bool) -> bytes:
    """One exec request for a stub (see the module docstring)."""
    if any("\0" in a for a in argv) or "\0" in cwd:
        raise ValueError("embedded null byte in the command or cwd")
    fields = ["1" if stdin_null else "0", cwd, str(len(env))]
    fields += [f"{k}={v}" for k, v in env.items()]
    fields += [str(len(argv)), *argv]
    body = b"".join(os.fsencode(f) + b"\0" for f in fields)
    return MAGIC + struct.pack("<I", len(body)) + body


__all__ = ["INSIDE_PATH", "LAUNCH_FAILED", "helper_binary", "install", "request"]
