"""What an action touches: the files it writes and reads, the code it runs, the variables it
sets — the raw material of the reward-hack monitor (sdk/hack_monitor.py).

Actions are read by the shape of their arguments, not by family, so any family's tools
are covered: `{"command"}` is a shell command line, `{"path", "content"}` (or `{"path",
"new"}`, an edit) a file write, `{"code"}` Python run in the agent's own process, any
other `{"path"}` a read (reading a file, listing a folder, running a script).

A shell command is read heuristically, never run: heredoc bodies are cut out first, the
rest is split into words (shlex) and simple commands; `for` lists and literal assignments
are remembered so that `for d in /tmp/verifier /logs; do echo 1 > "$d/reward.txt"` writes
both files; `sh -c` / `bash -c` strings are read the same way. Writes are redirection
targets and the operands of `tee`, `touch`, `mkdir`, `cp`, `mv`, `install`, `rsync`, `ln`,
`dd of=`, `sed -i`; reads are the operands of `cat`, `grep`, `ls`, `find` and their kind,
`<` inputs, copy sources and link targets, and any absolute verifier path a command names.
A variable the heuristic cannot know (`$(pwd)`, `read -r f`) stays in the path as written,
so a basename survives (`"$W/conftest.py"` is still a conftest). Python code (a `{"code"}`
argument, `python -c`, a heredoc fed to python) is scanned for `open(…, "w")` and
`Path(…).write_text` writes.
"""

from __future__ import annotations

import functools
import itertools
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

TouchKind = Literal["write", "read", "code", "env"]
MAX_EXPANSIONS = 64  # words one variable-laden word may expand to
MAX_DEPTH = 3  # nested `sh -c` strings read
EXCERPT_CHARS = 160
SHELL_TOOLS = frozenset({"bash", "shell", "sh", "run_command", "terminal", "exec", "execute"})


@dataclass(frozen=True)
class Touch:
    """One thing an action does: `write`/`read` a `path` (`text`: the written content where
    the action shows it, else None), run `code` (`text`), or set an `env` variable `name`
    to `text`. `excerpt` is the short piece of the action it was read from."""

    kind: TouchKind
    index: int
    excerpt: str
    path: str = ""
    text: str | None = None
    name: str = ""


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """One line of at most `limit` characters: what a report shows as evidence."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def action_touches(index: int, tool: str, arguments: Mapping[str, Any]) -> list[Touch]:
    """What the action at `index` (a tool call) touches, read by its arguments' shape."""
    args = {k: v for k, v in arguments.items() if isinstance(v, str)}
    command = args.get("command", args.get("cmd"))
    if command is not None and (tool in SHELL_TOOLS or "path" not in args):
        return shell_touches(command, index)
    path = args.get("path") or args.get("file") or args.get("filename")
    content = args.get("content", args.get("new"))
    if path is not None and content is not None:
        return [Touch("write", index, excerpt(f"{tool} {path}"), path=path, text=content)]
    out: list[Touch] = []
    if "code" in args:
        out += code_touches(args["code"], index)
    if path is not None:
        out.append(Touch("read", index, excerpt(f"{tool} {path}"), path=path))
    return out


def code_touches(code: str, index: int) -> list[Touch]:
    """Python run in the agent's process: the code itself, and the files it opens to write."""
    out = [Touch("code", index, excerpt(code), text=code)]
    for match in _PY_WRITE.finditer(code):
        path = match.group("a") or match.group("b")
        out.append(Touch("write", index, excerpt(match.group(0)), path=path))
    return out


_PY_WRITE = re.compile(
    r"""open\(\s*[rbf]?['"](?P<a>[^'"\n]+)['"]\s*,\s*(?:mode\s*=\s*)?[rbf]?['"][^'"]*[wax]"""
    r"""|Path\(\s*[rbf]?['"](?P<b>[^'"\n]+)['"]\s*\)\s*\.write_(?:text|bytes)\("""
)


# -- shell ---------------------------------------------------------------------------------------

_HEREDOC = re.compile(r"(?<!<)<<(-?)[ \t]*(?:'([^'\n]+)'|\"([^\"\n]+)\"|\\?([A-Za-z_][\w.-]*))")
_MARK = "__palaestra_heredoc_{}__"
_MARK_RE = re.compile(r"__palaestra_heredoc_(\d+)__")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\+?=(.*)$", re.S)
_SEP_CHARS = set(";&|()\n")
_PREFIXES = frozenset(
    {"sudo", "env", "nohup", "setsid", "exec", "time", "command", "builtin", "nice", "xargs"}
)
_KEYWORDS = frozenset(
    {"do", "then", "else", "elif", "if", "while", "until", "!", "{", "}", "done", "fi", "esac"}
)
_READERS = frozenset(
    {
        *("cat", "tac", "head", "tail", "less", "more", "grep", "egrep", "fgrep", "rg", "ag"),
        *("ls", "find", "stat", "file", "strings", "xxd", "od", "hexdump", "wc", "diff", "cmp"),
        *("tree", "cd", "source", ".", "md5sum", "sha1sum", "sha256sum", "readlink", "realpath"),
        *("du", "base64", "awk", "sort", "uniq", "cut", "jq", "nl", "tar", "unzip", "zcat"),
        *("bat", "view", "vi", "vim", "nano"),
    }
)
_COPIERS = frozenset({"cp", "mv", "install", "rsync"})
_PYTHONS = re.compile(r"^(?:python|python3(?:\.\d+)?|pypy3?)$")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh"})


@dataclass
class _Command:
    words: list[str]
    redirects: list[tuple[str, str]]  # (operator, target)
    heredoc: str | None = None


def shell_touches(command: str, index: int, depth: int = 0) -> list[Touch]:
    """What a shell command line touches (module docstring: heuristic, never run)."""
    return _ShellReader(index, depth).read(command)


def _cut_heredocs(command: str) -> tuple[str, list[str]]:
    """The command without heredoc bodies (each operator then names its body by a marker
    word) and the bodies, in order; full-line comments are dropped."""
    lines = command.split("\n")
    kept: list[str] = []
    bodies: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.lstrip().startswith("#"):
            continue
        pending: list[tuple[str, bool]] = []
        kept.append(_HEREDOC.sub(functools.partial(_mark, pending, len(bodies)), line))
        for delim, strip_tabs in pending:
            body: list[str] = []
            while i < len(lines):
                raw = lines[i]
                i += 1
                if (raw.lstrip("\t") if strip_tabs else raw) == delim:
                    break
                body.append(raw)
            bodies.append("\n".join(body) + "\n")
    return "\n".join(kept), bodies


def _mark(pending: list[tuple[str, bool]], first: int, match: re.Match[str]) -> str:
    """A heredoc operator, its delimiter noted in `pending`, as `<<` and a marker word."""
    delim = match.group(2) or match.group(3) or match.group(4)
    pending.append((delim, match.group(1) == "-"))
    return "<< " + _MARK.format(first + len(pending) - 1)


def _words(text: str) -> list[str]:
    """Shell words and operator tokens (runs of `;&|()<>` and newlines)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: split plainly
        return [w.strip("'\"") for w in re.findall(r"[;&|()<>\n]+|[^\s;&|()<>]+", text)]


def _is_operator(word: str) -> bool:
    return bool(word) and all(c in _SEP_CHARS or c in "<>" for c in word)


def _commands(words: list[str], bodies: list[str]) -> list[_Command]:
    """Simple commands: words between separators, with their redirections."""
    out: list[_Command] = []
    current = _Command([], [])
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not _is_operator(word):
            following = words[i] if i < len(words) else ""
            if not (word.isdigit() and following[:1] in ("<", ">")):  # 2>…: a descriptor
                current.words.append(word)
            continue
        cut = min((word.find(c) for c in "<>" if c in word), default=len(word))
        if cut > 0 and (current.words or current.redirects):
            out.append(current)
            current = _Command([], [])
        op = word[cut:]
        if not op:
            continue
        target = words[i] if i < len(words) and not _is_operator(words[i]) else ""
        if target:
            i += 1
        if op.startswith("<<") and op != "<<<" and (m := _MARK_RE.fullmatch(target)):
            k = int(m.group(1))
            current.heredoc = bodies[k] if k < len(bodies) else ""
        elif op.endswith("&") and target.isdigit():
            continue  # 2>&1: a descriptor, not a file
        elif op != "<<<":
            current.redirects.append((op, target))
    if current.words or current.redirects:
        out.append(current)
    return out


def _expand(word: str, variables: Mapping[str, list[str]]) -> list[str]:
    """`word` with each known variable replaced by each of its values (at most
    MAX_EXPANSIONS results); unknown variables stay as written."""
    names = [m.group(1) or m.group(2) for m in _VAR.finditer(word)]
    known = [n for n in dict.fromkeys(names) if n in variables]
    if not known:
        return [word]
    out: list[str] = []
    for combo in itertools.product(*(variables[n] for n in known)):
        values = dict(zip(known, combo, strict=True))
        out.append(_VAR.sub(functools.partial(_substitute, values), word))
        if len(out) >= MAX_EXPANSIONS:
            break
    return out


def _substitute(values: Mapping[str, str], match: re.Match[str]) -> str:
    return values.get(match.group(1) or match.group(2), match.group(0))


def _unescape(text: str) -> str:
    """printf/echo -e escapes a script uses to write files."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text)


def _operands(words: list[str]) -> list[str]:
    return [w for w in words if w and not w.startswith("-")]


class _ShellReader:
    """Reads one command line: the variables it sets as it goes, and the last text an
    `echo`/`printf`/heredoc produced (a `{ …; } > file` group writes it)."""

    def __init__(self, index: int, depth: int) -> None:
        self.index = index
        self.depth = depth
        self.variables: dict[str, list[str]] = {}
        self.last_text: str | None = None

    def read(self, command: str) -> list[Touch]:
        text, bodies = _cut_heredocs(command)
        return [t for cmd in _commands(_words(text), bodies) for t in self.command(cmd)]

    def command(self, cmd: _Command) -> list[Touch]:
        words = list(cmd.words)
        self.show = excerpt(" ".join(words + [f"{op} {t}" for op, t in cmd.redirects]))
        out: list[Touch] = []
        closing = not words or words[0] in ("}", "done", "fi", "esac")
        while words and words[0] in _KEYWORDS:
            words.pop(0)
        while words and (m := _ASSIGN.match(words[0])):  # NAME=value cmd …
            words.pop(0)
            out.append(self.assign(m.group(1), m.group(2)))
        if words and words[0] in ("export", "declare", "local", "readonly", "typeset"):
            assigned = [m for w in words[1:] if (m := _ASSIGN.match(w))]
            out += [self.assign(m.group(1), m.group(2)) for m in assigned]
            words = []
        while words and words[0] in _PREFIXES:
            words.pop(0)
            while words and (words[0].startswith("-") or _ASSIGN.match(words[0])):
                if m := _ASSIGN.match(words.pop(0)):
                    out.append(self.assign(m.group(1), m.group(2)))
        if words[:1] == ["timeout"]:
            words = list(itertools.dropwhile(lambda w: w.startswith("-"), words[1:]))[1:]
        if words[:1] == ["read"]:
            for var in _operands(words[1:]):
                self.variables.pop(var, None)
            return out
        name, groups = "", [[w] for w in words]
        if words[:1] == ["for"] and len(words) >= 3 and words[2] == "in":
            values = [v for w in words[3:] for e in self.expand(w) for v in e.split()]
            self.variables[words[1]] = values
            groups = [[v] for v in values]  # a loop list naming verifier paths is read below
        elif words:
            name = _basename(words[0])
            groups = [self.expand(w) for w in words[1:]]
        args = [a for group in groups for a in group]
        content = cmd.heredoc
        if content is None and name in ("echo", "printf"):
            content = _unescape("\n".join(a for a in args if a not in ("-e", "-n", "-E")))
        if content is None and closing:
            content = self.last_text
        if content is not None:
            self.last_text = content
        for op, target in cmd.redirects:
            for path in self.expand(target):
                if op.endswith("<") or op == "<>":
                    out.append(self.touch("read", path))
                elif path and path != "/dev/null" and not path.startswith("/dev/fd"):
                    out.append(self.touch("write", path, content))
        return out + self.by_name(name, groups, content)

    def expand(self, word: str) -> list[str]:
        return _expand(word, self.variables)

    def touch(self, kind: TouchKind, path: str, text: str | None = None) -> Touch:
        return Touch(kind, self.index, self.show, path=path, text=text)

    def assign(self, name: str, value: str) -> Touch:
        if "`" in value or value.endswith("$") or "$(" in value:
            self.variables.pop(name, None)  # a command's output: unknown
        else:
            self.variables[name] = self.expand(value)
        return Touch("env", self.index, self.show, name=name, text=value)

    def by_name(self, name: str, groups: list[list[str]], content: str | None) -> list[Touch]:
        """The touches a command makes by what it is (module docstring); `groups` holds
        each argument's expansions."""
        args = [a for group in groups for a in group]
        ops = _operands(args)
        write, read = functools.partial(self.touch, "write"), functools.partial(self.touch, "read")
        if name in ("tee", "touch", "mkdir"):
            return [write(p, content if name == "tee" else None) for p in ops]
        operands = [g for g in groups if g and not g[0].startswith("-")]
        if name in _COPIERS and len(operands) >= 2:
            *sources, dests = operands
            out = [read(s) for group in sources for s in group] + [write(d) for d in dests]
            if len(sources) > 1 or any(d.endswith("/") or d in (".", "..") for d in dests):
                out += [write(d.rstrip("/") + "/" + _basename(s))
                        for d in dests for group in sources for s in group]  # fmt: skip
            return out
        if name == "ln" and operands:
            *targets, links = operands if len(operands) > 1 else [operands[0], []]
            links = links or [_basename(t) for t in operands[0]]
            return [read(t) for group in targets for t in group] + [write(x) for x in links]
        if name == "dd":
            return [write(a[3:]) if a.startswith("of=") else read(a[3:])
                    for a in args if a.startswith(("of=", "if="))]  # fmt: skip
        if name in ("sed", "perl") and any(a.startswith(("-i", "-pi")) for a in args) and ops:
            return [write(ops[-1])]
        code = _option_value(args, "-c")
        if _PYTHONS.match(name):
            if code is not None or content is not None:
                return code_touches(code if code is not None else content or "", self.index)
            return [read(ops[0])] if ops else []
        inline = code is not None or (content is not None and not ops)
        if name in _SHELLS and inline and self.depth < MAX_DEPTH:
            text = code if code is not None else content or ""
            return _ShellReader(self.index, self.depth + 1).read(text)
        if name in _READERS or name in _SHELLS:
            return [read(p) for p in ops]
        return [read(p) for p in ops if p.startswith("/")]


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _option_value(args: list[str], option: str) -> str | None:
    return args[args.index(option) + 1] if option in args[:-1] else None
