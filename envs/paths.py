"""One path rule for every file-taking tool of every family (DESIGN §3, docs/reference/episodes.md).

`x`, `./x` and `<workdir>/x` (the workspace's own absolute path, whatever the family's
workdir is) name the same file; anything else (`/etc/x`, `../x`, `<workdir>/../x`, a NUL
byte, an empty path) is refused with a 422 that names the path. The rule is on names only:
whether the file exists, or is a symlink or a fifo, is the sandbox's file API's business
(a SandboxPathError, which is the agent's fault, never void).
"""

from __future__ import annotations

import posixpath

from palaestra.sdk.errors import InvalidActionError

DEFAULT_WORKDIR = "/work"


def _refuse(path: str, workdir: str, why: str) -> InvalidActionError:
    return InvalidActionError(
        f"path {path!r} {why}: name a file inside the workspace {workdir} (x, ./x or {workdir}/x)",
        code="bad_path",
    )


def workspace_relpath(
    path: str, workdir: str = DEFAULT_WORKDIR, *, allow_root: bool = False
) -> str:
    """`path` as a normalized path relative to `workdir` ("." for the workspace itself, only
    with `allow_root`); InvalidActionError (422, code `bad_path`) when it leaves it."""
    root = posixpath.normpath(workdir)
    if not path:
        raise _refuse(path, root, "is empty")
    if "\0" in path:
        raise _refuse(path, root, "holds a NUL byte")
    if path.startswith("/"):
        norm = posixpath.normpath("/" + path.lstrip("/"))  # "//x" is "/x" here
        if norm == root:
            rel = "."
        elif root == "/" or norm.startswith(root + "/"):
            rel = norm[len(root) :].lstrip("/")
        else:
            raise _refuse(path, root, "is outside the workspace")
    else:
        rel = posixpath.normpath(path)
    if rel == ".." or rel.startswith("../"):
        raise _refuse(path, root, "is outside the workspace")
    if rel == "." and not allow_root:
        raise _refuse(path, root, "names the workspace itself, not a file")
    return rel


def workspace_abspath(
    path: str, workdir: str = DEFAULT_WORKDIR, *, allow_root: bool = False
) -> str:
    """The same rule, as an absolute path inside the workspace (for tools that exec)."""
    root = posixpath.normpath(workdir)
    rel = workspace_relpath(path, root, allow_root=allow_root)
    return root if rel == "." else posixpath.join(root, rel)
