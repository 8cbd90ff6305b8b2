"""Whether a sandbox's unprivileged uid can read a host folder bound into it.

A bind reaches the sandbox whatever the folders above it are (the bwrap backend bind-mounts
a folder under a closed one where its uid can reach it: bwrap/mounts.py), but the files
themselves keep their modes: a venv made under umask 077 binds fine and imports nothing.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def unreadable_by_others(folder: Path) -> str | None:
    """Why another uid could not read `folder` and its entries (None if it can): the folder
    and every folder in it need o+rx, every file o+r. Only the top level is looked at (a
    site-packages holds thousands of files; an install's umask shows at its top)."""
    try:
        st = os.stat(folder)
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        return f"{folder} cannot be read: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode) or (st.st_mode & 0o005) != 0o005:
        return f"{folder} lacks o+rx (mode {stat.S_IMODE(st.st_mode):04o})"
    for entry in entries:
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue  # a dangling link binds as nothing either way
        need = 0o005 if stat.S_ISDIR(mode) else 0o004
        if mode & need != need:
            kind = "o+rx" if stat.S_ISDIR(mode) else "o+r"
            return f"{entry.path} lacks {kind} (mode {stat.S_IMODE(mode):04o})"
    return None
