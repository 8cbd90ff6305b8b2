"""The test side of a repository task's tests: the code under test as proxies (stdlib only;
repo_runner.py loads it into each test process).

Why: the process that runs the tests and decides their outcomes never runs agent code, so
nothing written against the runner's own protocol (its report pipe, its records, its
memory) can lie to it. A finder first on ``sys.meta_path`` turns every module the tests
import from the workspace (but the pack's own files) into a `ProxyModule`; the code runs
in a worker process (repo_worker.py) started here with only its two pipes. Attribute
access, calls and operators (``len``, ``in``, iteration, indexing, ``==`` against plain
values, arithmetic, ``with``) go over the pipes; what comes back is plain data built fresh
here from the wire (repo_wire.py) or a `RemoteObject` handle, so an always-equal object
cannot cross. Plain containers a call received are written back in place (a function that
mutates its argument is seen to). An exception of the code is raised here as the builtin
of its name (``pytest.raises(ValueError)`` works), a class of the code's own as a local
subclass of its nearest builtin base, anything else as `RemoteError`. An object of the
test's that is not plain data cannot be passed to the code (a callback fails with a
TypeError saying so). A worker that ends, hangs past the call timeout or writes something
that is not an answer is a fault: the test running fails, and the next request starts a
fresh worker (module-level names are looked up again in it).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from palaestra.verifiers.programs.repo_wire import Reader, WireError, decode, encode, send
else:  # repo_runner.py registers repo_wire before it loads this module
    from repo_wire import Reader, WireError, decode, encode, send

UNARY = ("len", "bool", "hash", "repr", "str", "iter", "next", "reversed", "int", "float",
         "index", "abs", "neg", "pos", "invert", "dir")  # fmt: skip
BINARY = ("getitem", "delitem", "lt", "le", "gt", "ge", "add", "sub", "mul", "truediv",
          "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift", "matmul",
          "divmod", "format")  # fmt: skip
REFLECTED = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
             "lshift", "rshift", "matmul", "divmod")  # fmt: skip
MUTABLE = (list, dict, set, bytearray)
SENTINEL = ["o"]  # a fresh object in the worker: what a value of the test's compares as
BOUND = object()  # the answer to a lookup that found a method of the object


class RemoteError(Exception):
    """An exception of the code under test with no builtin counterpart (named in the
    message)."""


class WorkerGone(RemoteError):
    """The code under test's process ended, hung or broke the protocol."""


class Remote:
    """The worker of one test process: started on the first request, started again after
    a fault; its faults, always-equal claims and refused imports, for the report."""

    def __init__(
        self,
        program: str,
        workdir: str,
        sources: list[str],
        timeout_s: float,
        *,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`config`: more of the worker's config (its jail: `jail`, `hidden`); `env`: its
        environment (this process's by default)."""
        self.program, self.workdir, self.sources = program, workdir, sources
        self.timeout_s = timeout_s
        self.config, self.env = dict(config or {}), env
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = -1
        self.reader: Reader | None = None
        self.generation = 0
        self.seq = 0
        self.proxies: dict[int, RemoteObject] = {}
        self.classes: dict[tuple[str, str], type] = {}
        self.faults: list[str] = []
        self.claims = 0
        self.refused: list[str] = []

    # -- the process ----------------------------------------------------------------------

    def _start(self) -> None:
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        cfg = {"workdir": self.workdir, "sources": self.sources, "in": req_r, "out": ans_w}
        argv = [sys.executable, "-I", "-B", self.program, json.dumps({**self.config, **cfg})]
        try:
            self.proc = subprocess.Popen(
                argv,
                pass_fds=(req_r, ans_w),
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env=self.env,
            )
        finally:
            os.close(req_r)
            os.close(ans_w)
        self.out, self.reader = req_w, Reader(ans_r)

    def close(self) -> int | None:
        """End the worker; its exit status (None if it had to be killed)."""
        proc, self.proc = self.proc, None
        if self.reader is not None:
            os.close(self.reader.fd)
            os.close(self.out)
            self.reader = None
        self.generation += 1
        self.proxies.clear()
        if proc is None:
            return None
        try:
            return proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return None

    def _fault(self, what: str) -> WorkerGone:
        status = self.close()
        if status is not None:
            what = what.replace("{status}", str(status))
        self.faults.append(f"the code under test {what}")
        return WorkerGone(self.faults[-1])

    # -- requests -------------------------------------------------------------------------

    def request(self, message: list[Any]) -> Any:
        """Send one request; its value, or raise the code's exception or WorkerGone."""
        if self.proc is None:
            self._start()
        assert self.reader is not None
        self.seq += 1
        try:
            send(self.out, [self.seq, *message])
            reply = self.reader.read(self.timeout_s)
        except TimeoutError:
            raise self._fault(f"did not answer within {self.timeout_s:g} s (killed)") from None
        except (EOFError, BrokenPipeError):
            raise self._fault("ended its own process (exit status {status})") from None
        except WireError as exc:
            raise self._fault(f"wrote something that is not an answer ({exc})") from None
        # [the request's number, "ok" or "err", value or error, events]
        ok = isinstance(reply, list) and len(reply) == 4 and reply[0] == self.seq
        if not ok or reply[1] not in ("ok", "err") or not isinstance(reply[3], dict):
            raise self._fault("wrote something that is not an answer")
        self._events(reply[3])
        if reply[1] == "err":
            raise self.exception(reply[2])
        try:
            return decode(reply[2], self.deref)
        except (WireError, TypeError, ValueError) as exc:
            raise self._fault(f"wrote something that is not an answer ({exc})") from None

    def imported(self, request: list[Any]) -> None:
        """An import in the worker; an error of the code's there is also a fault of the
        file's (named in its note: a denied read of a test file, say)."""
        try:
            self.request(request)
        except WorkerGone:
            raise
        except Exception as exc:
            self.faults.append(
                f"the code under test failed to import {request[1]}: "
                f"{type(exc).__name__}: {str(exc)[:200]}"
            )
            raise

    def _events(self, events: dict[str, Any]) -> None:
        claims = events.get("claims")
        if type(claims) is int and claims > 0:
            self.claims += claims
        refused = events.get("refused")
        for name in refused if isinstance(refused, list) else ():
            if str(name) not in self.refused:
                self.refused.append(str(name))
                self.faults.append(f"the code under test tried to import {name}")

    def op(self, name: str, *operands: object, lenient: bool = False) -> Any:
        """An operator in the worker; `lenient`: a value of the test's that cannot cross
        is compared as a fresh object (equal to nothing honest)."""
        return self.request(["op", name, [self.node(x, lenient) for x in operands]])

    def call(self, target: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sent_args = [self.node(a) for a in args]
        sent_kwargs = [[k, self.node(v)] for k, v in kwargs.items()]
        result, after = self.request(["call", target, ["t", sent_args], sent_kwargs])
        for key, value in after:  # plain containers the code may have changed in place
            old = args[key] if isinstance(key, int) else kwargs[key]
            sync(old, value)
        return result

    # -- values ---------------------------------------------------------------------------

    def node(self, value: object, lenient: bool = False) -> list[Any]:
        try:
            return encode(value, self.ref)
        except TypeError:
            if lenient:
                return SENTINEL
            raise

    def ref(self, value: object) -> list[Any]:
        """A value of the test's that may cross: the code's own objects and modules, and
        exception classes."""
        if isinstance(value, RemoteObject):
            return value._palaestra_node()
        if isinstance(value, ProxyModule) and sys.modules.get(value.__name__) is value:
            return ["m", value.__name__]
        if isinstance(value, type) and issubclass(value, BaseException):
            cls: type = value
            origin = cls.__dict__.get("_palaestra_origin")
            if origin is not None:
                return ["e", {"module": origin[0], "qualname": origin[1]}]
            if vars(builtins).get(cls.__name__) is cls:
                return ["e", {"module": "builtins", "qualname": cls.__name__}]
        raise TypeError(
            f"palaestra: a {type(value).__name__} of the test's cannot be passed to the code "
            "under test, which runs in another process: only plain data (None, bool, int, "
            "float, str, bytes, list, tuple, dict, set) and the code's own objects cross"
        )

    def deref(self, node: list[Any]) -> object:
        tag = node[0]
        if tag == "h" and len(node) == 3 and type(node[1]) is int:
            if node[1] not in self.proxies:
                self.proxies[node[1]] = RemoteObject(self, node[1], str(node[2]), None)
            return self.proxies[node[1]]
        if tag == "m" and len(node) == 2 and isinstance(node[1], str):
            module = importlib.import_module(node[1])
            if not isinstance(module, ProxyModule):
                raise WireError(f"{node[1]} is not a module of the code under test")
            return module
        if tag == "e" and len(node) == 2 and isinstance(node[1], dict):
            return self.exception_class(node[1])
        if tag == "A" and len(node) == 1:
            return BOUND
        raise WireError(f"no such reference {str(tag)[:20]!r}")

    def exception_class(self, desc: dict[str, Any]) -> type[BaseException]:
        """A builtin exception class, or a local stand-in for one of the code's: a subclass
        of its nearest builtin base (RemoteError where it has none)."""
        module, qualname = str(desc.get("module")), str(desc.get("qualname"))
        builtin = vars(builtins).get(str(desc.get("builtin") if module != "builtins" else qualname))
        base = builtin if isinstance(builtin, type) and issubclass(builtin, Exception) else None
        if module == "builtins":
            return base or RemoteError
        base = RemoteError if base in (None, Exception) else base
        key = (module, qualname)
        if key not in self.classes:
            space = {"__module__": module, "__qualname__": qualname, "_palaestra_origin": key}
            self.classes[key] = type(qualname.rsplit(".", 1)[-1], (base,), space)
        return self.classes[key]

    def exception(self, desc: object) -> BaseException:
        """The code's exception, raised here."""
        if not isinstance(desc, dict):
            return self._fault("wrote something that is not an answer (an error)")
        cls = self.exception_class(desc)
        text = str(desc.get("text", ""))
        try:
            args = decode(desc["args"], self.deref) if desc.get("args") else None
        except (WireError, TypeError, ValueError):
            args = None
        for attempt in ((args,) if isinstance(args, tuple) else ()) + ((text,),):
            with contextlib.suppress(Exception):
                return cls(*attempt)
        return RemoteError(f"{desc.get('qualname')}: {text}")


def sync(old: Any, new: Any) -> None:
    """Make the test's container `old` hold what the code left in its copy `new`, keeping
    the identity of inner containers of the same type."""
    if type(old) is list and type(new) is list:
        kept = [_synced(o, n) for o, n in zip(old, new, strict=False)]
        old[:] = kept + new[len(kept) :]
    elif type(old) is dict and type(new) is dict:
        items = [(k, _synced(old[k], v) if k in old else v) for k, v in new.items()]
        old.clear()
        old.update(items)
    elif type(old) is set and type(new) is set:
        old.clear()
        old.update(new)
    elif type(old) is bytearray and type(new) is bytearray:
        old[:] = new


def _synced(old: Any, new: Any) -> Any:
    if type(old) is type(new) and type(old) in MUTABLE:
        sync(old, new)
        return old
    return new


class RemoteObject:
    """An object of the code under test: every use is a request to its worker. `path`:
    where a module-level name came from, to find it again in a fresh worker."""

    __slots__ = ("_palaestra",)

    def __init__(self, remote: Remote, handle: int, kind: str, path: list[str] | None) -> None:
        object.__setattr__(self, "_palaestra", [remote, remote.generation, handle, kind, path])

    def _palaestra_node(self) -> list[Any]:
        remote, generation, _, _, path = self._palaestra
        if generation != remote.generation:
            if path is None:
                raise WorkerGone("palaestra: an object of a process of the code that ended")
            fresh = remote.request(["resolve", path])
            if not isinstance(fresh, RemoteObject):
                raise WorkerGone(f"palaestra: {'.'.join(path)} is no longer an object")
            self._palaestra[1:3] = fresh._palaestra[1:3]
            remote.proxies[self._palaestra[2]] = self
        return ["h", self._palaestra[2]]

    def _palaestra_named(self, value: Any, name: str) -> Any:
        path = self._palaestra[4]
        if isinstance(value, RemoteObject) and path is not None and value._palaestra[4] is None:
            value._palaestra[4] = [*path, name]
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_palaestra"):
            raise AttributeError(name)
        remote = self._palaestra[0]
        value = remote.request(["getattr", self._palaestra_node(), name])
        if value is BOUND:
            return RemoteMethod(self, name)
        return self._palaestra_named(value, name)

    def __setattr__(self, name: str, value: Any) -> None:
        remote = self._palaestra[0]
        remote.request(["setattr", self._palaestra_node(), name, remote.node(value)])

    def __delattr__(self, name: str) -> None:
        self._palaestra[0].request(["delattr", self._palaestra_node(), name])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._palaestra[0].call(self._palaestra_node(), args, kwargs)

    def __eq__(self, other: object) -> Any:
        return self._palaestra[0].op("eq", self, other, lenient=True)

    def __ne__(self, other: object) -> Any:
        return self._palaestra[0].op("ne", self, other, lenient=True)

    def __contains__(self, item: object) -> bool:
        return bool(self._palaestra[0].op("contains", self, item, lenient=True))

    def __setitem__(self, key: object, value: object) -> None:
        self._palaestra[0].op("setitem", self, key, value)

    def __enter__(self) -> Any:
        return self._palaestra[0].op("enter", self)

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        """Never swallows a failed assert or pytest's outcomes (not Exceptions) of the
        test's: only an Exception the code could have raised."""
        remote = self._palaestra[0]
        try:
            sent = remote.node(kind) if kind is not None else ["n"]
        except TypeError:
            sent = ["n"]
        swallow = remote.request(["op", "exit", [self._palaestra_node(), sent, ["n"], ["n"]]])
        honest = kind is not None and issubclass(kind, Exception)
        return bool(swallow) and honest and not issubclass(kind, AssertionError)

    def __repr__(self) -> str:
        try:
            return str(self._palaestra[0].op("repr", self))
        except Exception as exc:
            return f"<{self._palaestra[3]} of the code under test ({type(exc).__name__})>"


class RemoteMethod(RemoteObject):
    """A method of an object of the code's, looked up again on each use."""

    __slots__ = ()

    def __init__(self, owner: RemoteObject, name: str) -> None:
        object.__setattr__(self, "_palaestra", [owner._palaestra[0], owner, name, "method"])

    def _palaestra_node(self) -> list[Any]:
        return ["A", self._palaestra[1]._palaestra_node(), self._palaestra[2]]

    def _palaestra_named(self, value: Any, name: str) -> Any:
        return value


def _method(name: str) -> Callable[..., Any]:
    def method(self: RemoteObject, *args: object) -> Any:
        return self._palaestra[0].op(name, self, *args)

    method.__name__ = f"__{name}__"
    return method


def _reflected(name: str) -> Callable[..., Any]:
    def method(self: RemoteObject, other: object) -> Any:
        return self._palaestra[0].op(name, other, self)

    method.__name__ = f"__r{name}__"
    return method


for _name in (*UNARY, *BINARY):
    if _name != "repr":
        setattr(RemoteObject, f"__{_name}__", _method(_name))
for _name in REFLECTED:
    setattr(RemoteObject, f"__r{_name}__", _reflected(_name))


class ProxyModule(types.ModuleType):
    """A module of the code under test: its names are looked up in the worker; a name the
    tests set is set there."""

    _palaestra_remote: Remote
    FORWARDED_DUNDERS = ("__all__", "__version__")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name not in self.FORWARDED_DUNDERS:
            raise AttributeError(name)
        remote = self._palaestra_remote
        value = remote.request(["getattr", ["m", self.__name__], name])
        if isinstance(value, RemoteObject) and value._palaestra[4] is None:
            value._palaestra[4] = [self.__name__, name]
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("__") or isinstance(value, types.ModuleType):
            super().__setattr__(name, value)  # the import system's own
            return
        remote = self._palaestra_remote
        remote.request(["setattr", ["m", self.__name__], name, remote.node(value)])


class ProxyFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on sys.meta_path in the test process: a module found in the workspace that is
    not one of the pack's files becomes a ProxyModule, imported in the worker."""

    def __init__(self, remote: Remote, inside: Callable[[str], bool], trusted: set[str]) -> None:
        self.remote, self.inside, self.trusted = remote, inside, trusted

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        where = [p for p in (spec.origin, *(spec.submodule_search_locations or ())) if p]
        ours = spec.origin is not None and os.path.realpath(spec.origin) in self.trusted
        if ours or not any(self.inside(p) for p in where):
            return None
        package = spec.submodule_search_locations is not None
        proxy = importlib.machinery.ModuleSpec(name, self, origin=spec.origin, is_package=package)
        if package:
            proxy.submodule_search_locations = list(spec.submodule_search_locations or ())
        proxy.has_location = bool(spec.has_location)
        return proxy

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return ProxyModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """Import it in the worker, which also searches the workspace folders the tests put
        on sys.path (``sys.path.insert(0, "/app/src")``)."""
        folders = [p for p in sys.path if isinstance(p, str) and p and self.inside(p)]
        self.remote.imported(["import", module.__name__, folders])


class FileLoader(importlib.abc.Loader):
    """The loader of a workspace file a test loads by path (`spec_from_file_location`):
    a ProxyModule, the file run in the worker."""

    def __init__(self, remote: Remote, path: str) -> None:
        self.remote, self.path = remote, path

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return ProxyModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        self.remote.imported(["load", module.__name__, self.path])


def install(remote: Remote, inside: Callable[[str], bool], trusted: set[str]) -> ProxyFinder:
    """Put the finder first on sys.meta_path (call again to move it back to the front)."""
    ProxyModule._palaestra_remote = remote
    finder = next((f for f in sys.meta_path if isinstance(f, ProxyFinder)), None)
    finder = finder or ProxyFinder(remote, inside, trusted)
    sys.meta_path[:] = [finder, *(f for f in sys.meta_path if f is not finder)]
    return finder


def proxy_file_loads(finder: ProxyFinder) -> None:
    """``importlib.util.spec_from_file_location`` of a workspace file that is not one of
    `finder`'s trusted files gives a spec whose module is a proxy (the evoeval adapters'
    tests load ``/app/solution.py`` so)."""
    original = importlib.util.spec_from_file_location

    def spec_from_file_location(name: str, location: Any = None, **kw: Any) -> Any:
        spec = original(name, location, **kw)
        where = spec.origin if spec is not None else None
        if where is None or not finder.inside(where):
            return spec
        if os.path.realpath(where) in finder.trusted or kw.get("loader") is not None:
            return spec
        proxy = importlib.machinery.ModuleSpec(name, FileLoader(finder.remote, where))
        proxy.origin, proxy.has_location = where, True
        return proxy

    importlib.util.spec_from_file_location = spec_from_file_location
