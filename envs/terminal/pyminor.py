"""The Python minor a task's base image names, against the one the local stand-ins run.

Every local stand-in for a Python base image (images/python, `palaestra/python`, which
`image_aliases` maps `python:3.X…` and the t-bench `python-3-13` base to) and the terminal
image are Debian bookworm, whose python3 is 3.11; bwrap runs the host's (a bootstrapped
bookworm). No Debian bookworm package gives another minor, and nothing else can be
fetched, so a task whose image names 3.12 or 3.13 runs on 3.11 (docs/importing.md,
"Python version"). At import, each Python file of the task (the environment's, the
tests', the solution's) is compiled for 3.11: one that does not compile there (a `type`
statement, PEP 701 f-strings, `except*` on an older minor's terms) would fail at the first
episode, so the task is refused naming the version and the file; otherwise the report
notes the minor it runs on.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping

from palaestra.envs.terminal.dockerfile import dockerfile_instructions

STANDIN = (3, 11)  # Debian bookworm's python3: every local stand-in's
STANDINS = "palaestra/python and the terminal image run Debian bookworm's Python 3.11"


def _text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def base_image(dockerfile: str) -> str | None:
    """The image of the Dockerfile's first FROM (flags such as --platform skipped)."""
    for instr, args in dockerfile_instructions(dockerfile):
        if instr == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            return words[0] if words else None
    return None


def named_minor(image: str) -> tuple[int, int] | None:
    """The Python minor an image names: `python:3.13-slim`, `…/python-3-13:tag`,
    `python3.12…`; None where it names none (`python:3`, `ubuntu:24.04`)."""
    last = image.rsplit("/", 1)[-1].lower()
    repo, _, tag = last.partition(":")
    if repo == "python":
        parts = tag.split("-", 1)[0].split(".")
    elif repo.startswith("python"):
        parts = repo.removeprefix("python").lstrip("-_").replace("-", ".").split(".")
    else:
        return None
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def compile_error(name: str, text: str) -> str | None:
    """Why `text` does not compile on the stand-in's Python (None: it does)."""
    try:
        if sys.version_info[:2] == STANDIN:
            compile(text, name, "exec", dont_inherit=True)
        else:  # the importer runs on another minor: the parser's best effort for 3.11
            ast.parse(text, name, feature_version=STANDIN)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # a NUL byte
        return str(exc)
    return None


def check(image: str, sources: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(problems, notes) for a task on `image` whose files are `sources` (name -> text)."""
    named = named_minor(image)
    if named is None or named == STANDIN:
        return [], []
    want, have = _text(named), _text(STANDIN)
    for name, text in sorted(sources.items()):
        if not name.endswith(".py"):
            continue
        error = compile_error(name, text)
        if error is not None:
            return [
                f"base image {image} names Python {want}, which no local stand-in runs "
                f"({STANDINS}), and {name} does not compile on Python {have} ({error})"
            ], []
    return [], [
        f"base image {image} names Python {want}; it runs on Python {have} ({STANDINS}; "
        f"none runs {want}), where every Python file of the task compiles"
    ]
