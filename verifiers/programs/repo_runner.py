"""The `pytest` mode of the terminal runner: a repository task's test sets (stdlib only).

`terminal_runner.run_pytest` executes this file's source (sent in the config) and calls
`run`. Why a parent, children and workers: the tests import the agent's code; the verdict
must come from a process that never ran it, and the tests' outcomes from one that code
cannot reach.

- The parent restores the task's declared artifacts (every test file and pytest
  configuration the pack ships, rewritten; anything else in a test folder, any other
  configuration or startup file -- conftest.py, *.ini, setup.cfg, pyproject.toml,
  sitecustomize, .pth, *.dist-info -- removed; bytecode deleted), imports pytest, every
  `_pytest` / `pluggy` module and the standard library modules pytest loads late, then puts
  a guard first on the import path: no standard-library or test-tooling name may load from
  the workspace. The workspace is appended to sys.path, after the standard library and
  site-packages, and pytest imports tests with ``--import-mode=append``.
- Per test file, the parent restores again and forks a test process that runs pytest on
  that file's ids. That process never runs agent code: a finder first on its import path
  turns every module the tests import from the workspace (but the pack's own files) into
  a proxy, and the code runs in a worker process the test process starts
  (repo_proxy.py, repo_worker.py, over repo_wire.py), which gets only its own request and
  answer pipes. Calls, attribute access and operators go over them; only plain data of
  builtin types, built fresh here, or handles come back; an exception comes back as the
  builtin of its name. The test process is non-dumpable (the worker cannot open its
  /proc/<pid>/fd, mem or environ, nor the runner's), and the worker confines itself with
  Landlock (agent_jail.py) before the code loads: it cannot open the task's test files and
  folders, nor the runner's HOME (its own programs, the ini). A worker that ends, hangs past the
  call timeout (the config's `call_timeout_s`) or writes something that is not an answer
  fails the test running (named in the note); the next test gets a fresh worker.
- The test process reports over a pipe: the collected ids, each test's outcome after
  checking its own integrity (pytest's and pluggy's module and class attributes, the
  plugin manager's plugins and hook implementations, the import machinery, trace hooks:
  all as they were at session start), then the session's end. The parent counts a
  child's tests only if it reported its end with nothing tampered and exited 0; it alone
  writes the verifier's channel.
- Every assert of a rewritten test module compares strictly (repo_strict.py): an operand
  of ``==``, ``!=`` or ``in`` that claims to equal a fresh sentinel object fails the
  comparison (a value of a builtin subclass crosses from the worker as its builtin value;
  one that claimed to equal a fresh object there is counted the same way).

Limits: objects cross by value (a test that relies on the code keeping a reference to a
list the test mutates later, on `isinstance` with the code's classes, or on passing a
function of its own to the code fails); plain containers a call changed in place are
written back. Whatever the worker answers is the agent's to choose, as its return values
always were; it cannot reach the test process or the channel.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import pkgutil
import shutil
import stat
import sys
import threading
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# Names pytest reads configuration or plugins from, and interpreter startup files.
CONFIG_NAMES = ("conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini",
                "sitecustomize.py", "usercustomize.py")  # fmt: skip
CONFIG_SUFFIXES = (".pth", ".dist-info", ".egg-info", ".egg-link")
TOOLING = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "exceptiongroup",
           "tomli", "attr", "attrs", "more_itertools", "_palaestra_strict")  # fmt: skip
# Standard library modules pytest imports only while it runs (loaded before any agent file).
LATE_STDLIB = ("pdb", "cmd", "code", "codeop", "bdb", "doctest", "unittest", "unittest.mock",
               "faulthandler", "xml.etree.ElementTree", "xml.dom.minidom", "json", "decimal",
               "fractions", "numbers", "difflib", "pprint", "tokenize", "shlex", "glob",
               "fnmatch", "tempfile", "importlib.metadata", "importlib.resources", "warnings",
               "traceback", "linecache", "inspect", "textwrap", "argparse", "gettext",
               "locale", "copy", "dataclasses", "enum", "functools", "contextlib", "string",
               "re", "math", "random", "statistics", "collections", "itertools", "typing",
               "threading", "queue", "atexit", "signal", "platform", "sysconfig")  # fmt: skip
WATCHED = ("pytest", "_pytest", "pluggy", "iniconfig", "unittest", "builtins",
           "_palaestra_strict", "repo_wire", "repo_strict", "repo_proxy")  # fmt: skip
# Module globals pytest itself sets while a test runs.
VOLATILE = {("_pytest.assertion.util", "_reprcompare"),
            ("_pytest.assertion.util", "_assertion_pass"),
            ("_pytest.assertion.util", "_config")}  # fmt: skip
MAX_CHILD_OUTPUT = 16 * 1024 * 1024
PR_SET_DUMPABLE = 4
# The programs beside this one: the wire, the test side's proxies, the worker.
HELPERS = (
    "repo_wire.py",
    "repo_strict.py",
    "repo_proxy.py",
    "repo_worker.py",
    "agent_jail.py",
    "exec_guard.py",
)


# -- the declared artifacts ---------------------------------------------------------------


def _under(rel: str, dirs: list[str]) -> bool:
    return any(rel == d or rel.startswith(d + "/") for d in dirs)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def restore(workdir: str, files: dict[str, str], test_dirs: list[str]) -> list[str]:
    """Make the workspace hold only declared artifacts where tests or configuration live;
    return the paths removed (for the note)."""
    removed: list[str] = []
    for base, dirs, names in os.walk(workdir):
        rel_base = os.path.relpath(base, workdir)
        rel_base = "" if rel_base == "." else rel_base
        for name in list(dirs) + names:
            path = os.path.join(base, name)
            rel = os.path.join(rel_base, name) if rel_base else name
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IWUSR:
                    os.chmod(path, st.st_mode | stat.S_IWUSR | stat.S_IXUSR)
            bytecode = name in ("__pycache__", ".pytest_cache") or name.endswith((".pyc", ".pyo"))
            config = name in CONFIG_NAMES or name.endswith(CONFIG_SUFFIXES)
            undeclared = _under(rel, test_dirs) and rel not in files
            undeclared = undeclared and not any(f.startswith(rel + "/") for f in files)
            if (bytecode or config or undeclared) and rel not in files:
                _remove(path)
                if name in dirs:
                    dirs.remove(name)
                if not bytecode:
                    removed.append(rel)
            elif name in dirs and os.path.islink(path):
                dirs.remove(name)
    for rel, text in files.items():
        _write(workdir, rel, text)
    return removed


def _write(workdir: str, rel: str, text: str) -> None:
    """Write a declared file, replacing whatever stands in its way (links included)."""
    parts = rel.split("/")
    cur = workdir
    for part in parts[:-1]:
        cur = os.path.join(cur, part)
        if os.path.islink(cur) or (os.path.exists(cur) and not os.path.isdir(cur)):
            os.unlink(cur)
        if not os.path.isdir(cur):
            os.mkdir(cur)
    path = os.path.join(cur, parts[-1])
    if os.path.lexists(path):
        _remove(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# -- the import path ----------------------------------------------------------------------


class Guard:
    """First on sys.meta_path: a standard-library or tooling name never loads from the
    workspace (the task's own top-level packages excepted)."""

    def __init__(self, workdir: str, allowed: set[str]) -> None:
        self.roots = {workdir.rstrip("/"), os.path.realpath(workdir)}
        self.protected = (set(sys.stdlib_module_names) | set(TOOLING)) - allowed
        self.refused: list[str] = []

    def inside(self, path: str | None) -> bool:
        if not path:
            return False
        real = os.path.realpath(path)
        return any(p == r or p.startswith(r + "/") for p in (path, real) for r in self.roots)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.partition(".")[0] not in self.protected:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = finder.find_spec if hasattr(finder, "find_spec") else None
            spec = find(name, path, target) if find is not None else None
            if spec is None:
                continue
            where = [spec.origin, *(spec.submodule_search_locations or ())]
            if any(self.inside(p) for p in where):
                self.refused.append(name)
                raise ImportError(f"palaestra: {name!r} is not loaded from the workspace")
            return spec
        return None


def preload() -> None:
    """pytest, its plugins and the standard library it loads late, from the verifier's
    own files, before any agent file is reachable."""
    import _pytest
    import pluggy
    import pytest  # noqa: F401

    for pkg in (_pytest, pluggy):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            with contextlib.suppress(Exception):
                importlib.import_module(info.name)
    for name in (*LATE_STDLIB, "iniconfig"):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


# -- the child's integrity ----------------------------------------------------------------


def _ident(v: object) -> tuple[object, ...]:
    if isinstance(v, types.FunctionType):
        return (v, v.__code__, v.__defaults__)
    if isinstance(v, staticmethod | classmethod):
        return (v, *_ident(v.__func__))
    if isinstance(v, property):
        return (v, v.fget, v.fset)
    return (v,)


def snapshot(extra: dict[str, dict[str, Any]], pm: Any) -> dict[object, tuple[object, ...]]:
    """Identity of every attribute of pytest's, pluggy's and unittest's modules and classes,
    the import machinery, trace hooks and the plugin manager's hook implementations."""
    out: dict[object, tuple[object, ...]] = {}
    spaces = {n: vars(m) for n, m in list(sys.modules.items()) if n.split(".")[0] in WATCHED}
    spaces.update(extra)
    for mod, space in spaces.items():
        for key, value in list(space.items()):
            if (mod, key) in VOLATILE:
                continue
            out[(mod, key)] = _ident(value)
            if isinstance(value, type) and value.__module__ == mod:
                for attr, member in list(vars(value).items()):
                    out[(mod, key, attr)] = _ident(member)
    out["meta_path"] = tuple(sys.meta_path)
    out["path_hooks"] = tuple(sys.path_hooks)
    out["trace"] = (sys.gettrace(), sys.getprofile())
    out["pm"] = tuple((k, v) for k, v in sorted(vars(pm).items()) if callable(v))
    for name, caller in sorted(vars(pm.hook).items()):
        impls = caller.get_hookimpls() if hasattr(caller, "get_hookimpls") else []
        out[("hook", name)] = tuple((i.plugin, i.function) for i in impls)
        out[("hookexec", name)] = tuple(v for _, v in sorted(vars(caller).items()) if callable(v))
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a is b


def tampered(
    before: dict[object, tuple[object, ...]],
    now: dict[object, tuple[object, ...]],
    conftests: set[str],
) -> list[str]:
    """What changed since the snapshot, as short names (hook implementations added by the
    task's own conftest files excepted)."""
    out = []
    for key, value in before.items():
        after = now.get(key, ())
        if _same(value, after):
            continue
        if isinstance(key, tuple) and key[0] == "hook":
            if _only_conftests(value, after, conftests):
                continue
            out.append(f"the {key[1]} hook's implementations")
        elif isinstance(key, tuple):
            out.append(".".join(str(k) for k in key))
        else:
            out.append(str(key))
    return sorted(set(out))[:10]


def _only_conftests(before: tuple[Any, ...], after: tuple[Any, ...], conftests: set[str]) -> bool:
    """The hook lost no implementation and gained only modules of the task's conftests."""
    now = {(id(p), id(f)) for p, f in after}
    if any((id(p), id(f)) not in now for p, f in before):
        return False
    old = {(id(p), id(f)) for p, f in before}
    for plugin, fn in after:
        if (id(plugin), id(fn)) in old:
            continue
        path = plugin.__dict__.get("__file__") if isinstance(plugin, types.ModuleType) else None
        if not isinstance(path, str) or os.path.realpath(path) not in conftests:
            return False
    return True


# -- the child ----------------------------------------------------------------------------


def non_dumpable() -> None:
    """No same-uid process (the worker) may read or write this one's memory or descriptors
    through /proc, nor trace it (inherited from the runner; said again here)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def child(fd: int, workdir: str, ini: str, ids: list[str], trusted: set[str], guard: Guard,
          worker: dict[str, Any]) -> None:  # fmt: skip
    """Run pytest on `ids` (one test file's) and report to the parent over `fd`; the code
    under test runs in a worker process (`worker`: its program, sources and call timeout)."""
    import pytest

    non_dumpable()
    proxy = sys.modules["repo_proxy"]
    remote = proxy.Remote(
        worker["program"], workdir, worker["sources"], float(worker["timeout_s"]),
        config=worker["config"],
    )  # fmt: skip
    proxy.install(remote, guard.inside, trusted)
    trusted_code: list[types.CodeType] = []
    code_object = proxy.RemoteObject
    strict = sys.modules["repo_strict"].install_strict(
        trusted_code, lambda x: isinstance(x, code_object)
    )
    sys.dont_write_bytecode = True
    out = os.fdopen(fd, "w", buffering=1)
    conftests = {p for p in trusted if os.path.basename(p) == "conftest.py"}

    def send(kind: str, data: object) -> None:
        out.write(json.dumps([kind, data]) + "\n")
        out.flush()

    def from_the_task(code: types.CodeType) -> bool:
        """A test runs code of a rewritten test module, of another file the pack ships, or
        of a file outside the workspace (a decorator's wrapper)."""
        if any(code is c for c in trusted_code):
            return True
        rewritten = {os.path.realpath(c.co_filename) for c in trusted_code}
        path = os.path.realpath(code.co_filename)
        return not guard.inside(path) or (path in trusted and path not in rewritten)

    class Reporter:
        """Per-test outcomes after an integrity check, then the session's end."""

        def __init__(self) -> None:
            self.failed: set[str] = set()
            self.bad: dict[str, str] = {}
            self.before: dict[object, tuple[object, ...]] = {}
            self.pm: Any = None
            self.final: list[str] = ["the test session did not finish"]
            self.faults = 0
            self.space: dict[str, dict[str, Any]] = {"palaestra_repo_runner": globals()}

        def check(self) -> list[str]:
            self.space["palaestra_reporter"] = dict(vars(Reporter))
            return tampered(self.before, snapshot(self.space, self.pm), conftests)

        @pytest.hookimpl(trylast=True)  # after pytest's own (the fixture manager's)
        def pytest_sessionstart(self, session: pytest.Session) -> None:
            proxy.install(remote, guard.inside, trusted)  # first again, before pytest's hook
            self.pm = session.config.pluginmanager
            self.space["palaestra_reporter"] = dict(vars(Reporter))
            self.before = snapshot(self.space, self.pm)

        def pytest_collection_finish(self, session: pytest.Session) -> None:
            send("COLLECTED", [item.nodeid for item in session.items])

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_setup(self, item: pytest.Item) -> None:
            if not isinstance(item, pytest.Function):
                return
            fn = item.obj.__func__ if isinstance(item.obj, types.MethodType) else item.obj
            if not isinstance(fn, types.FunctionType) or not from_the_task(fn.__code__):
                self.bad[item.nodeid] = "the test function is not the task's"

        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            if report.failed or (report.when == "call" and not report.passed):
                self.failed.add(report.nodeid)

        def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
            self.faults = len(remote.faults)

        def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
            problems = self.check()
            if nodeid in self.bad:
                problems.append(self.bad[nodeid])
            faults = remote.faults[self.faults :]  # the worker ended, hung or lied meanwhile
            ok = nodeid not in self.failed and not problems and not faults
            send("TEST", {"id": nodeid, "ok": ok, "tamper": problems, "faults": faults})

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(self, session: pytest.Session) -> None:
            self.final = self.check()

    reporter = Reporter()
    args = ["-q", "-p", "no:cacheprovider", "-c", ini, "--rootdir", workdir, "--assert=rewrite"]
    rc = pytest.main([*args, "--import-mode=append", "--", *ids], plugins=[reporter])
    problems = reporter.final if reporter.pm is not None else []
    remote.close()
    claims = int(strict.state["claims"]) + remote.claims
    faults = remote.faults[:10]
    end = {"rc": int(rc), "tamper": problems, "claims": claims, "refused": guard.refused}
    send("END", {**end, "faults": faults})
    out.close()


# -- the parent ---------------------------------------------------------------------------


def _messages(raw: bytes) -> list[tuple[str, Any]]:
    found = []
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            kind, data = json.loads(line)
        except (ValueError, TypeError):
            continue
        if isinstance(kind, str):
            found.append((kind, data))
    return found


def exec_tracer(worker: dict[str, Any], workdir: str) -> Any:
    """exec_guard.py's tracer for the test processes (a program of the agent's a test
    starts runs confined as the worker is), or None where it cannot run here."""
    module = worker["guard"]
    if module.available():
        return None
    jail = worker["config"]
    folder = os.path.dirname(jail["jail"])
    argv = module.jail_argv(
        sys.executable, worker["jail_source"], jail["hidden"], folder, "", (workdir,)
    )
    home = os.path.dirname(folder)
    policy = module.Policy([home], [workdir, "/tmp", "/var/tmp", "/dev/shm"], argv)
    return module.Tracer(policy)


def _read_all(fd: int, chunks: list[bytes]) -> None:
    size = 0
    while chunk := os.read(fd, 1 << 16):
        size += len(chunk)
        if size <= MAX_CHILD_OUTPUT:
            chunks.append(chunk)
    os.close(fd)


def run_file(
    ids: list[str], workdir: str, ini: str, trusted: set[str], guard: Guard, worker: dict[str, Any]
) -> tuple[list[str], dict[str, bool], str]:
    """Fork a child for one test file (traced by the exec guard where it can run);
    (collected ids, outcomes, problem or "")."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    r, w = os.pipe()
    tracer = exec_tracer(worker, workdir)
    pid = os.fork() if tracer is None else tracer.fork()
    if pid == 0:  # the child: nothing of the parent's but the report pipe and stdio
        try:
            os.close(r)
            os.closerange(3, w)
            os.closerange(w + 1, 1 << 16)
            child(w, workdir, ini, ids, trusted, guard, worker)
        finally:
            os._exit(0)
    os.close(w)
    chunks: list[bytes] = []
    if tracer is None:
        _read_all(r, chunks)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    else:  # the stops are served here while a thread drains the report pipe
        reader = threading.Thread(target=_read_all, args=(r, chunks), daemon=True)
        reader.start()
        code = tracer.wait(pid)
        reader.join()
    messages = _messages(b"".join(chunks))
    collected: list[str] = []
    outcomes: dict[str, bool] = {}
    end: dict[str, Any] | None = None
    tamper: list[str] = []
    for kind, data in messages:
        if kind == "COLLECTED" and isinstance(data, list):
            collected = [str(x) for x in data]
        elif kind == "TEST" and isinstance(data, dict):
            node = str(data.get("id"))
            outcomes[node] = outcomes.get(node, True) and data.get("ok") is True
            tamper += [str(t) for t in data.get("tamper") or ()]
        elif kind == "END" and isinstance(data, dict):
            end = data
    why = ""
    if end is None:
        why = f"the test process ended (status {code}) before its session finished"
        why += " (an early exit or a killed runner?)"
    else:
        tamper += [str(t) for t in end.get("tamper") or ()]
        if end.get("refused"):
            names = ", ".join(sorted(set(map(str, end["refused"]))))
            why = f"the code under test tried to load {names} from the workspace"
        if tamper:
            why = "the code under test changed the test runner: " + ", ".join(
                sorted(set(tamper))[:6]
            )
        elif code != 0:
            why = f"the test process exited with status {code} after its session"
        elif end.get("claims"):
            why = f"{end['claims']} comparison(s) with an object that claims to equal anything"
            why = why + " (an always-equal object)"
        elif end.get("faults"):
            why = "; ".join(dict.fromkeys(str(f) for f in end["faults"]))[:400]
        elif end.get("rc") not in (0, 1):
            why = f"pytest exit {end.get('rc')}"
    counted = end is not None and not tamper and code == 0 and not end.get("refused")
    if not counted:
        outcomes = {n: False for n in outcomes}
    return collected, outcomes, why


def load_helpers(cfg: dict[str, Any], home: str, workdir: str) -> dict[str, Any]:
    """Load the wire and the proxies here (before any workspace path is reachable) and
    write the worker's program to a folder of its own; what a test process needs to start
    the worker."""
    helpers = {str(k): str(v) for k, v in dict(cfg["helpers"]).items()}
    folder = os.path.join(home, "worker")
    os.mkdir(folder, 0o700)
    for name in HELPERS:
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(helpers[name])
    for name in HELPERS[:3]:
        module = types.ModuleType(name.removesuffix(".py"))
        sys.modules[module.__name__] = module
        exec(compile(helpers[name], name, "exec"), vars(module))
    guard = types.ModuleType("exec_guard")  # the parent's tracer of each test process
    exec(compile(helpers[HELPERS[5]], HELPERS[5], "exec"), vars(guard))
    # the task's own top-level names, which load from the workspace in the worker
    sources = sorted(str(n) for n in cfg.get("allowed") or ())
    timeout_s = float(cfg.get("call_timeout_s") or 30.0)
    # its Landlock jail: no test file or folder of the task's, nothing of the runner's
    tests = [*dict(cfg["files"]), *(d for d in cfg["test_dirs"] if d not in ("", "."))]
    hidden = [home, *(os.path.join(workdir, str(rel)) for rel in tests)]
    jail = {"jail": os.path.join(folder, HELPERS[4]), "hidden": hidden}
    program = os.path.join(folder, HELPERS[3])
    return {
        "program": program,
        "sources": sources,
        "timeout_s": timeout_s,
        "config": jail,
        "jail_source": helpers[HELPERS[4]],
        "guard": guard,
    }


def run(
    emit: Callable[[str, object], None],
    cfg: dict[str, Any],
    env: dict[str, str],
    home: str,
    kill_others: Callable[[], None],
) -> None:
    """The parent: restore, preload, guard, then one child per test file."""
    workdir = str(cfg["workdir"])
    ids = [str(i) for i in cfg["ids"]]
    files = {str(k): str(v) for k, v in dict(cfg["files"]).items()}
    test_dirs = [str(d) for d in cfg["test_dirs"]]
    ini = os.path.join(home, "pytest.ini")
    with open(ini, "w") as f:
        f.write(str(cfg.get("ini") or "[pytest]\n"))
    os.environ.clear()
    os.environ.update(env)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        removed = restore(workdir, files, test_dirs)
    except OSError as exc:
        emit("RESTORE", f"the tests could not be restored: {exc}")
        return
    if removed:
        emit("REMOVED", sorted(removed)[:20])
    os.chdir(workdir)
    sys.dont_write_bytecode = True
    preload()
    worker = load_helpers(cfg, home, workdir)
    guard = Guard(workdir, {str(n) for n in cfg.get("allowed") or ()})
    sys.meta_path.insert(0, guard)
    shadows = [e for e in sorted(os.listdir(workdir)) if e.split(".")[0] in guard.protected]
    if shadows:
        emit("SHADOW", shadows[:20])
    sys.path[:] = [p for p in sys.path if p and not guard.inside(p)]
    sys.path.append(workdir)
    trusted = {os.path.realpath(os.path.join(workdir, rel)) for rel in files}
    by_file: dict[str, list[str]] = {}
    for test_id in ids:
        by_file.setdefault(test_id.split("::")[0], []).append(test_id)
    for test_file, file_ids in by_file.items():
        restore(workdir, files, test_dirs)
        collected, outcomes, why = run_file(file_ids, workdir, ini, trusted, guard, worker)
        kill_others()
        emit("COLLECTED", collected)
        for node, ok in outcomes.items():
            emit("TEST", {"id": node, "ok": ok})
        emit("FILE", {"file": test_file, "note": why})
    emit("END", 0)
    emit("EXIT", 0)
