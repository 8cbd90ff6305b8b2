"""The Python minor a task's base image names, against the one it runs on here.

Two stand-ins run Python (docs/importing.md, "Python version"): Debian bookworm's 3.11 --
the terminal image, bwrap's rootfs and images/python (`palaestra/python`, what `python:3.8`
to `3.11` map to) -- and Debian trixie's 3.13, images/python3.13 (`palaestra/python3.13`,
what `python:3.12` to `3.14` and the t-bench `python-3-13` base map to; docker only, built
when a pack needs it). No 3.12 is to be had: 3.13 runs all of 3.12's syntax. A task whose
Dockerfile the terminal image stands in for runs on 3.11 on either backend; one that runs in
the image built from its Dockerfile (`built`) runs on the minor its base's stand-in has
(`DEFAULT_IMAGE_ALIASES`; an operator's own alias or mirror is not seen here).

At import, for a base image naming another minor than the task runs on:

* on 3.11, each Python file of the task (the environment's, the tests', the solution's) is
  compiled with 3.11's grammar. All compile: noted. One does not (a `type` statement, a
  PEP 701 f-string) and the base maps to the 3.13 stand-in: the task is to run in its own
  image there instead (`Judged.own_image`; the converter builds its context). Else refused
  naming the file: it would fail at the first episode.
* on 3.13, a file that does not compile with 3.11's grammar is not judged (the importer has
  no 3.13 compiler; newer syntax is what a 3.12+ base allows). A 3.12 base's file that
  imports a module 3.13 removed (PEP 594's, lib2to3) is refused naming it; a 3.14 base is
  noted (its own syntax, t-strings and bare `except A, B`, fails on 3.13).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from palaestra.envs.terminal.baseimages import alias_of
from palaestra.envs.terminal.dockerfile import dockerfile_instructions
from palaestra.sandbox.docker.standins import DEFAULT_IMAGE_ALIASES, PYTHON313, PYTHON_MINORS

STANDIN = PYTHON_MINORS["palaestra/python:latest"]  # bookworm's: the terminal image's too
STANDINS = "palaestra/python and the terminal image run Debian bookworm's Python 3.11"
NEWER = PYTHON_MINORS[PYTHON313]
# Modules Python 3.13 removed (PEP 594's dead batteries, lib2to3, tkinter.tix).
REMOVED_IN_313 = frozenset({
    "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis",
    "nntplib", "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib",
    "lib2to3", "tkinter.tix",
})  # fmt: skip
_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+([\w., \t]+)|from[ \t]+([\w.]+)[ \t]+import\b)", re.M)


@dataclass
class Judged:
    """Problems refuse the task, notes go to the import report; `own_image` (a reason) asks
    for the task to run in the image built from its Dockerfile, on the 3.13 stand-in, and
    `tests_elsewhere` is the problem instead where its tests run on a verifier image."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    own_image: str | None = None
    tests_elsewhere: str = ""


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


def stand_in_minor(image: str) -> tuple[int, int] | None:
    """The minor of the Python stand-in `image` maps to by default (None: no such one)."""
    return PYTHON_MINORS.get(alias_of(image, DEFAULT_IMAGE_ALIASES) or "")


def runs_newer(image: str) -> bool:
    """Whether a task built from `image` runs on the 3.13 stand-in."""
    return stand_in_minor(image) == NEWER


def compile_error(name: str, text: str) -> str | None:
    """Why `text` does not compile on Python 3.11 (None: it does)."""
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


def removed_imports(text: str) -> list[str]:
    """The modules 3.13 removed that `text` imports (`import cgi`, `from telnetlib import …`)."""
    found = set()
    for names, module in _IMPORT.findall(text):
        for name in [module] if module else names.split(","):
            words = name.split()
            dotted = words[0] if words else ""
            parts = dotted.split(".")
            found |= {m for m in (parts[0], ".".join(parts[:2])) if m in REMOVED_IN_313}
    return sorted(found)


def _python(sources: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(name, text) for name, text in sorted(sources.items()) if name.endswith(".py")]


def check(image: str, sources: Mapping[str, str], *, built: bool = False) -> Judged:
    """The judgement for a task on `image` whose files are `sources` (name -> text); `built`:
    it runs in the image built from its Dockerfile (else on the terminal image)."""
    named = named_minor(image)
    newer = runs_newer(image)
    if named is None:
        return Judged()
    if built and newer:
        return _on_newer(image, named, sources)
    if named == STANDIN:
        return Judged()
    want, have = _text(named), _text(STANDIN)
    for name, text in _python(sources):
        error = compile_error(name, text)
        if error is None:
            continue
        why = f"{name} does not compile on Python {have} ({error})"
        refused = f"base image {image} names Python {want}, which no local stand-in runs"
        if newer and named > STANDIN:
            judged = _on_newer(image, named, sources)
            judged.own_image = f"base image {image} names Python {want} and {why}"
            judged.tests_elsewhere = (
                f"{refused} for its tests: they run on a verifier image (uv/uvx or "
                f"tests/Dockerfile: the terminal image's Python {have}), and {why}"
            )
            return judged
        return Judged(
            [f"{refused} for this tag (the one it maps to has {have}: {STANDINS}; "
             f"palaestra/python3.13 has 3.13 for the tags image_aliases maps to it), and {why}"]
        )  # fmt: skip
    on = "palaestra/python, the image built from its Dockerfile" if built else STANDINS
    return Judged(
        notes=[
            f"base image {image} names Python {want}; it runs on Python {have} ({on}), "
            "where every Python file of the task compiles"
        ]
    )


def _on_newer(image: str, named: tuple[int, int], sources: Mapping[str, str]) -> Judged:
    """The task runs on the 3.13 stand-in: a 3.12 base's removed imports, a 3.14's syntax."""
    want, have = _text(named), _text(NEWER)
    where = f"base image {image} names Python {want}; it runs on Python {have} ({PYTHON313})"
    if named < NEWER:
        for name, text in _python(sources):
            gone = removed_imports(text)
            if gone:
                return Judged(
                    [f"base image {image} names Python {want}, which no local stand-in runs "
                     f"(the nearest, {PYTHON313}, has {have}), and {name} imports "
                     f"{', '.join(gone)}, which {have} removed (PEP 594; map {image} to an "
                     "image of your own in image_aliases)"]
                )  # fmt: skip
        return Judged(notes=[f"{where}: no {want} here, and {have} runs all of its syntax"])
    if named > NEWER:
        return Judged(notes=[f"{where}: no {want} here; syntax new in {want} fails there"])
    return Judged()
