"""What ``uv`` / ``uvx`` run under the terminal runner's wrappers (argv[1]: which one): the
verifier image's uv, offline, from the image's wheels only, with no uv configuration read
from the workdir and the interpreter pinned to an absolute path (never a virtualenv the
agent left); ``-p 3.x`` maps to that Python where the image has it, else to the image's
python3 (said on stderr).

A pytest it runs is never the tool environment's ``pytest`` script: uv runs that
environment's Python on the verifier's boot (argv[2]: import_guard.py + pytest_boot.py, as
``python3 -m pytest`` gets it), so the same guard, conftest rule and monitor decide the
session (an ``os._exit(0)`` at import, a workspace ``hashlib.py``, an agent's conftest.py
cannot pass it). The boot gets the verifier's ini, no cache, its folder as rootdir; plugins
load from the tool environment (the image's wheels) alone, before the workspace joins
sys.path (a ``*.dist-info`` entry point the agent leaves there is never seen)."""

import os
import re
import shutil
import sys

UV = os.environ["PALAESTRA_UV"]
WHEELS = os.environ["PALAESTRA_UV_WHEELS"]
PYTHON = os.environ["PALAESTRA_PYTHON"]
BINDIR = os.environ["PALAESTRA_BIN"]
VALUED = {
    "-p", "--python", "-w", "--with", "--from", "--with-requirements", "--with-editable",
    "--index", "--default-index", "-i", "--index-url", "--extra-index-url", "-f",
    "--find-links", "--cache-dir", "--directory", "--project", "--env-file", "-c",
    "--constraints", "--overrides", "-b", "--build-constraints", "-C", "--config-setting",
    "--resolution", "--prerelease", "--exclude-newer", "--link-mode", "--color",
    "--python-preference", "--refresh-package", "--reinstall-package", "--upgrade-package",
    "--allow-insecure-host", "--index-strategy", "--keyring-provider", "--extra", "--group",
    "--package", "--config-file",
}  # fmt: skip
PYTEST = re.compile(r"^(pytest|py\.test)(\W.*)?$")
VERSION = re.compile(r"^(?:python|cpython-?)?(3(?:\.\d+)?)(?:\.\d+)?$")


def say(text: str) -> None:
    sys.stderr.write(f"palaestra: {text}\n")


def interpreter(value: str) -> str:
    """An absolute interpreter for a ``-p`` value: the image's ``python3.X`` when it has
    one, else the image's python3."""
    found = VERSION.match(value)
    if found is None:
        return value if os.path.isabs(value) else PYTHON
    want = found.group(1)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != BINDIR)
    exact = shutil.which(f"python{want}", path=path) if "." in want else None
    if exact is not None:
        return os.path.realpath(exact)
    say(f"no Python {want} in the verifier image; -p {value} runs on {PYTHON}")
    return PYTHON


def split(args: list[str]) -> tuple[list[str], list[str]]:
    """(uv's options with every interpreter pinned, the command and its arguments)."""
    opts: list[str] = []
    pinned = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-"):
            rest = args[i + 1 :] if arg == "--" else args[i:]
            break
        name, eq, value = arg.partition("=")
        if name in ("-p", "--python"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            opts += ["--python", interpreter(value)]
            pinned = True
            continue
        if arg.startswith("-p") and len(arg) > 2 and not arg.startswith("--"):
            opts += ["--python", interpreter(arg[2:])]
            pinned = True
            i += 1
            continue
        opts.append(arg)
        if not eq and name in VALUED and i + 1 < len(args):
            opts.append(args[i + 1])
            i += 1
        i += 1
    else:
        rest = []
    if not pinned:
        opts += ["--python", PYTHON]
    return opts, rest


def harden(run: bool, opts: list[str], command: list[str], boot: str) -> list[str]:
    """uv's options and command, with pytest turned into the environment's Python running
    `boot` on pytest's arguments (the verifier's folder as rootdir: report paths are
    relative to it). The environment is the one ``pytest`` would have run in: ``uv tool
    run --from <the pytest requirement>`` (``uvx``), ``--with`` it for ``uv run``."""
    if not command or not PYTEST.match(command[0]):
        return [*opts, *command]
    spec = command[0] if command[0].startswith("pytest") else "pytest"
    spec = re.sub(r"@latest$", "", spec).replace("@", "==", 1)
    if run:
        opts = [*opts, "--with", spec]
    elif not any(o == "--from" or o.startswith("--from=") for o in opts):
        opts = [*opts, "--from", spec]
    vdir = os.environ["VERIFIER_DIR"]
    return [*opts, "python", "-I", "-c", boot, "--rootdir", vdir, *command[1:]]


def main() -> None:
    prog, boot, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if prog == "uvx":
        head, args = ["tool", "run"], args
    elif args[:2] == ["tool", "run"]:
        head, args = ["tool", "run"], args[2:]
    elif args[:1] == ["run"]:
        head, args = ["run", "--no-project"], args[1:]
    else:
        head = []
    if head:
        opts, command = split(args)
        argv = [UV, *head, *harden(head[0] == "run", opts, command, boot)]
    else:
        argv = [UV, *args]
    home = os.environ.get("HOME", "/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)  # the tool env holds the image's wheels only
    env.update(
        UV_OFFLINE="1",
        UV_NO_INDEX="1",
        UV_FIND_LINKS=WHEELS,
        UV_NO_CONFIG="1",
        UV_PYTHON_DOWNLOADS="never",
        UV_NO_PROGRESS="1",
        UV_LINK_MODE="copy",
        UV_CACHE_DIR=os.path.join(home, ".cache", "uv"),
        UV_TOOL_DIR=os.path.join(home, ".local", "share", "uv", "tools"),
        UV_TOOL_BIN_DIR=os.path.join(home, ".local", "bin"),
        UV_PYTHON_INSTALL_DIR=os.path.join(home, ".local", "share", "uv", "python"),
    )
    os.execve(UV, argv, env)


main()
