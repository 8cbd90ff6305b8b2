"""The worker of a repository task's tests: the only process that runs the agent's code
(stdlib only; started by the test process through repo_proxy.py as ``python3 -I -B``).

Why: the process that runs the tests and decides their outcomes must never run agent
code, or code written against the runner's own protocol can lie to it. This process
imports the task's modules from the workspace and answers the test process's requests
(import, attribute, call, operator) over two pipes, the only descriptors it gets beside
stdio. Plain data goes back as data (repo_wire.py); anything else stays here and goes
back as a handle. A value of a subclass of a builtin type (a `str` subclass, a
namedtuple, a Counter) goes back as its builtin value; one that claims to equal a fresh
object is counted (an always-equal object). The tests' tooling (pytest, pluggy) is not
the code's: importing it fails. An exception goes back described (its name, its nearest
builtin base, its arguments where they are plain); SystemExit and KeyboardInterrupt end
this process, as they would end a program.

Where the config names a jail (agent_jail.py) and hidden paths (the tests, the verifier's
files, the runner's folder), this process confines itself with Landlock once its own
modules are loaded and before any of the agent's: the code cannot open them, nor the
memory, descriptors or environment of processes outside its domain. Also the worker of an
imported ``test.sh`` task's tests (pytest_boot.py), whose modules it may load by file.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.machinery
import importlib.util
import json
import marshal
import operator
import os
import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from palaestra.verifiers.programs.repo_wire import Reader, WireError, decode, encode, send
else:  # beside this file in the sandbox (a script's folder is not on `python3 -I`'s path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from repo_wire import Reader, WireError, decode, encode, send

    del sys.path[0]

REFUSED = ("pytest", "_pytest", "pluggy")
MUTABLE = (list, dict, set, bytearray)
# A builtin subclass's value as its builtin type, by the builtin's own code where a
# subclass could answer with itself (str(x) returns whatever x.__str__ returns).
PLAIN_BASES: dict[type, Any] = {
    str: str.__str__, int: int.__index__, float: float.__float__, complex: complex.__complex__,
    bytes: lambda v: bytes(memoryview(v)), bytearray: lambda v: bytearray(memoryview(v)),
    list: list, tuple: tuple, set: set, frozenset: frozenset, dict: dict,
}  # fmt: skip


def _contains(container: Any, item: Any) -> bool:
    return item in container


def _enter(obj: Any) -> Any:
    return obj.__enter__()


def _exit(obj: Any, *args: Any) -> Any:
    return obj.__exit__(*args)


OPS: dict[str, Any] = {
    "len": len, "bool": bool, "hash": hash, "repr": repr, "str": str, "iter": iter,
    "next": next, "reversed": reversed, "int": int, "float": float, "index": operator.index,
    "abs": abs, "neg": operator.neg, "pos": operator.pos, "invert": operator.invert,
    "contains": _contains, "getitem": operator.getitem, "setitem": operator.setitem,
    "delitem": operator.delitem, "eq": operator.eq, "ne": operator.ne, "lt": operator.lt,
    "le": operator.le, "gt": operator.gt, "ge": operator.ge, "add": operator.add,
    "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": pow, "and": operator.and_,
    "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift,
    "rshift": operator.rshift, "matmul": operator.matmul, "divmod": divmod,
    "enter": _enter, "exit": _exit, "dir": dir, "format": format,
}  # fmt: skip


class Bound:
    """The answer for an attribute that is a method of the object it was looked up on."""


class Tooling:
    """First on sys.meta_path: the tests' tooling is not the code's, and the task's own
    top-level names load from the workspace even where a standard module has the name."""

    def __init__(self, workdir: str, sources: set[str]) -> None:
        self.workdir = workdir
        self.sources = sources
        self.refused: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        top = name.partition(".")[0]
        if top in REFUSED:
            self.refused.append(top)
            raise ImportError(f"palaestra: the code under test may not import {top!r}")
        if name in self.sources and path is None:
            return importlib.machinery.PathFinder.find_spec(name, [self.workdir])
        return None


class Worker:
    """The objects the test process holds handles to, and the requests' answers."""

    def __init__(self, workdir: str, tooling: Tooling) -> None:
        self.workdir = os.path.realpath(workdir)
        self.tooling = tooling
        self.objects: dict[int, object] = {}
        self.handles: dict[int, int] = {}  # id(object) -> handle
        self.claims = 0

    # -- values ---------------------------------------------------------------------------

    def ref(self, value: object) -> list[Any]:
        """What is not plain data: a builtin subclass as its builtin value, a workspace
        module by name, an exception class described, anything else a handle."""
        if type(value) is Bound:
            return ["A"]
        for base, convert in PLAIN_BASES.items():
            if isinstance(value, base):
                self._claim(value, base)
                return encode(convert(value), self.ref)
        if isinstance(value, types.ModuleType) and self._ours(value):
            return ["m", value.__name__]
        if isinstance(value, type) and issubclass(value, BaseException):
            return ["e", describe_class(value)]
        key = id(value)
        if key not in self.handles:
            self.handles[key] = len(self.objects) + 1
            self.objects[self.handles[key]] = value
        kind = "class" if isinstance(value, type) else type(value).__name__
        return ["h", self.handles[key], kind]

    def _claim(self, value: object, base: type) -> None:
        below = type(value).__mro__[: type(value).__mro__.index(base)]
        if not any("__eq__" in vars(c) or "__ne__" in vars(c) for c in below):
            return
        sentinel = object()
        try:
            claims = bool(value == sentinel) or not bool(value != sentinel)
        except Exception:
            claims = False
        self.claims += claims

    def _ours(self, module: types.ModuleType) -> bool:
        where = getattr(module, "__file__", None) or ""
        return os.path.realpath(where).startswith(self.workdir + "/") and (
            sys.modules.get(module.__name__) is module
        )

    def deref(self, node: list[Any]) -> object:
        tag = node[0]
        if tag == "h" and len(node) >= 2 and node[1] in self.objects:
            return self.objects[node[1]]
        if tag == "m" and len(node) == 2 and isinstance(node[1], str):
            return importlib.import_module(node[1])
        if tag == "o":
            return object()  # a fresh object of the test's: equal to nothing honest
        if tag == "A" and len(node) == 3 and isinstance(node[2], str):
            return getattr(self.value(node[1]), node[2])  # a method, looked up again
        if tag == "e" and len(node) == 2 and isinstance(node[1], dict):
            return find_class(node[1])
        if tag == "h":
            raise LookupError("palaestra: an object this process does not hold")
        raise WireError(f"no such reference {str(tag)[:20]!r}")

    def value(self, node: object) -> Any:
        return decode(node, self.deref)

    # -- requests -------------------------------------------------------------------------

    def answer(self, request: list[Any]) -> Any:
        """The result of one request (raises what the code under test raised)."""
        op, args = request[0], request[1:]
        if op == "import" and len(args) in (1, 2):
            for folder in args[1] if len(args) == 2 and isinstance(args[1], list) else ():
                if isinstance(folder, str) and folder not in sys.path:
                    sys.path.append(folder)  # where the tests found it (their sys.path)
            return importlib.import_module(str(args[0]))
        if op == "load" and len(args) == 2:  # importlib.util.spec_from_file_location
            load_file(str(args[0]), str(args[1]))
            return None
        if op == "resolve" and len(args) == 1 and isinstance(args[0], list) and args[0]:
            obj: Any = importlib.import_module(str(args[0][0]))
            for attr in args[0][1:]:
                obj = getattr(obj, str(attr))
            return obj
        if op == "getattr" and len(args) == 2:
            target = self.value(args[0])
            value = getattr(target, str(args[1]))
            if isinstance(value, types.MethodType) and value.__self__ is target:
                return Bound()  # named by the test side (no handle kept for each lookup)
            return value
        if op == "setattr" and len(args) == 3:
            return setattr(self.value(args[0]), str(args[1]), self.value(args[2]))
        if op == "delattr" and len(args) == 2:
            return delattr(self.value(args[0]), str(args[1]))
        if op == "call" and len(args) == 3 and isinstance(args[2], list):
            fn = self.value(args[0])
            call_args = self.value(args[1])
            kwargs = {str(k): self.value(v) for k, v in args[2]}
            # what it was given, as bytes (marshal: exact builtin types, in C)
            sent: dict[int | str, bytes | None] = {i: _image(a) for i, a in enumerate(call_args)}
            sent |= {k: _image(v) for k, v in kwargs.items()}
            result = fn(*call_args, **kwargs)
            # the plain containers it was given, as the call left them (written back there)
            # (only those it changed: a large argument does not cross twice for nothing)
            after = [[i, a] for i, a in enumerate(call_args) if self._changed(a, sent[i])]
            after += [[k, v] for k, v in kwargs.items() if self._changed(v, sent[k])]
            return (result, after)
        if op == "op" and len(args) == 2 and args[0] in OPS and isinstance(args[1], list):
            return OPS[args[0]](*[self.value(a) for a in args[1]])
        raise WireError(f"no such request {str(op)[:20]!r}")

    @staticmethod
    def _changed(value: object, sent: bytes | None) -> bool:
        """Whether `value`, a plain container the call received (`sent`: its image then),
        may differ now (anything that is not plain data counts as changed)."""
        if type(value) not in MUTABLE:
            return False
        now = _image(value)
        return now is None or now != sent

    def events(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.claims:
            out["claims"], self.claims = self.claims, 0
        if self.tooling.refused:
            out["refused"] = sorted(set(self.tooling.refused))
            self.tooling.refused.clear()
        return out

    def serve(self, rfd: int, wfd: int) -> None:
        reader = Reader(rfd)
        while True:
            try:
                request = reader.read()
            except EOFError:
                return
            if not (isinstance(request, list) and len(request) > 1):
                raise WireError("not a request")
            seq, request = request[0], request[1:]
            reply: list[Any]
            try:
                result = self.answer(request)
                reply = ["ok", encode(result, self.ref)]
            except (SystemExit, KeyboardInterrupt) as exc:
                code = exc.code if isinstance(exc, SystemExit) else 130
                sys.stdout.flush()
                os._exit(code if isinstance(code, int) else (0 if code is None else 1))
            except BaseException as exc:  # every error of the code under test
                reply = ["err", self.describe(exc)]
            send(wfd, [seq, *reply, self.events()])

    def describe(self, exc: BaseException) -> dict[str, Any]:
        """An exception as the test process rebuilds it."""
        out = describe_class(type(exc))
        try:
            out["args"] = encode(exc.args, self._plain_only)
        except (TypeError, WireError):
            out["args"] = None
        try:
            out["text"] = str(exc)[:2000]
        except Exception:
            out["text"] = f"<{type(exc).__name__}: unprintable>"
        return out

    @staticmethod
    def _plain_only(value: object) -> list[Any]:
        raise TypeError("not plain")


def describe_class(cls: type) -> dict[str, Any]:
    """Its module, qualified name and nearest builtin base that is an Exception."""
    builtin = next(
        (
            c.__name__
            for c in cls.__mro__
            if c.__module__ == "builtins"
            and issubclass(c, Exception)
            and vars(builtins).get(c.__name__) is c
        ),
        None,
    )
    return {"module": str(cls.__module__), "qualname": str(cls.__qualname__), "builtin": builtin}


def _image(value: object) -> bytes | None:
    """`value`'s marshal bytes (exact builtin types only), None where it has others."""
    if type(value) not in MUTABLE:
        return None
    try:
        # version 2: no object references, whose flags follow refcounts (a call that only
        # kept references to its argument would read as a change and be written back)
        return marshal.dumps(value, 2)  # type: ignore[arg-type]  # ValueError if not plain
    except ValueError:
        return None


def load_file(name: str, path: str) -> None:
    """Module `name` from the file at `path` (a test that loads the agent's file by path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"palaestra: no module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def jail(cfg: dict[str, Any], workdir: str) -> None:
    """Landlock this process before any of the agent's code loads (see the module doc)."""
    path = cfg.get("jail")
    if not path:
        return
    spec = importlib.util.spec_from_file_location("palaestra_agent_jail", str(path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hidden = [str(h) for h in cfg.get("hidden") or () if str(h).startswith("/")]
    why = module.confine(hidden, [], (workdir,))
    if why:
        sys.stderr.write(f"palaestra: {why}; the code under test runs unconfined\n")


def find_class(desc: dict[str, Any]) -> type:
    """An exception class the test process names (a builtin, or one of the code's)."""
    module, qualname = str(desc.get("module")), str(desc.get("qualname"))
    obj: Any = builtins if module == "builtins" else importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise TypeError(f"palaestra: {module}.{qualname} is not an exception class")
    return obj


def main() -> None:
    cfg = json.loads(sys.argv[1])
    workdir = str(cfg["workdir"])
    tooling = Tooling(workdir, {str(n) for n in cfg.get("sources") or ()})
    sys.meta_path.insert(0, tooling)
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(workdir)]
    sys.path.append(workdir)
    os.chdir(workdir)
    jail(cfg, workdir)
    worker = Worker(workdir, tooling)
    worker.serve(int(cfg["in"]), int(cfg["out"]))


if __name__ == "__main__":
    main()
