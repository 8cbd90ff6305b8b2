"""What ``uv`` / ``uvx`` run under the terminal runner's wrappers (argv[1]: which one): the
verifier image's uv, offline, from the image's wheels only, with no uv configuration read
from the workdir and the interpreter pinned to an absolute path (never a virtualenv the
agent left); ``-p 3.x`` maps to that Python where the image has it, else to the image's
python3 (said on stderr). A pytest it runs gets the verifier's ini, no cache and conftests
from the verifier's folder down; plugins load from the tool environment (the image's
wheels) alone."""

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


def harden(command: list[str]) -> list[str]:
    """pytest with the verifier's ini, no cache, its folder as rootdir (report paths are
    relative to it) and conftests from there down."""
    if not command or not re.match(r"^(pytest|py\.test)(\W.*)?$", command[0]):
        return command
    ini, vdir = os.environ["PALAESTRA_PYTEST_INI"], os.environ["VERIFIER_DIR"]
    opts = ["-p", "no:cacheprovider", "-c", ini, "--rootdir", vdir, "--confcutdir", vdir]
    return [command[0], *opts, *command[1:]]


def main() -> None:
    prog, args = sys.argv[1], sys.argv[2:]
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
        argv = [UV, *head, *opts, *([command[0]] if command else [])]
        argv += harden(command)[1:] if command else []
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
