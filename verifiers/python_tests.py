"""Hidden unit tests for function-level Python tasks, run in a fresh sandbox.

The test code (HumanEval's shape: `def check(candidate): assert ...`) is split into
individual test cases, one per top-level statement of `check` that asserts something
about `candidate`, so each is reported apart (the coding family pays only when all pass: a
fraction pays constant and echo answers, docs/decisions.md). The runner reads its
configuration — including a per-run nonce — from stdin before any untrusted code runs,
and reports one letter per test on a line that starts with the nonce.

The untrusted solution never runs in the runner's process: a worker process (stdout and
stderr to /dev/null, no nonce, no tests) loads it and answers each `candidate(...)` call over
a socket with plain builtin data (tagged JSON). Workers are forked from a template that the
runner forks before it reads its configuration, so their memory never held the tests or the
nonce, and a worker costs a fork rather than a fresh interpreter. The assertions,
the prompt's helpers and the stdlib modules the tests use all live in the runner, which is
made non-dumpable so the worker cannot read its memory or open its stdout through /proc.
So the solution cannot forge the report (frames, gc, /proc), patch what the tests call
(builtins, `math`), redefine the prompt's helpers, or return an object whose `__eq__`
always says True: it can only choose return values.
"""

from __future__ import annotations

import ast
import functools
import json
import secrets
import time
from dataclasses import dataclass

from palaestra.sandbox.forkserver import PythonRunner

VERSION = "1.4.0"
PYTHON = "/usr/bin/python3"

# Plain-data codec shared by the runner and the worker: tagged JSON, exact for every
# builtin scalar (ints in hex, floats as float.hex, so inf/nan/-0.0 survive).
CODEC = r"""
import json as _json, struct as _struct
_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
_TYPES = {v: k for k, v in _TAGS.items()}
def enc(v, depth=0):
    t = type(v)
    if depth > 50:
        raise TypeError("nested too deep")
    if v is None:
        return ["n"]
    if t is bool:
        return ["b", v]
    if t is int:
        return ["i", format(v, "x")]
    if t is float:
        return ["f", v.hex()]
    if t is complex:
        return ["c", v.real.hex(), v.imag.hex()]
    if t is str:
        return ["s", v]
    if t is bytes:
        return ["y", v.hex()]
    if t in _TAGS:
        return [_TAGS[t], [enc(x, depth + 1) for x in v]]
    if t is dict:
        return ["d", [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]]
    raise TypeError("not plain data: " + t.__name__)
def dec(x, depth=0):
    if depth > 52 or type(x) is not list or not x or type(x[0]) is not str:
        raise ValueError("malformed value")
    tag, rest = x[0], x[1:]
    if tag == "n" and not rest:
        return None
    if tag == "b" and len(rest) == 1 and type(rest[0]) is bool:
        return rest[0]
    if tag in ("i", "f", "s", "y") and len(rest) == 1 and type(rest[0]) is str:
        s = rest[0]
        return int(s, 16) if tag == "i" else float.fromhex(s) if tag == "f" else (
            s if tag == "s" else bytes.fromhex(s))
    if tag == "c" and len(rest) == 2 and all(type(s) is str for s in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag in _TYPES and len(rest) == 1 and type(rest[0]) is list:
        return _TYPES[tag](dec(i, depth + 1) for i in rest[0])
    if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
        return {dec(p[0], depth + 1): dec(p[1], depth + 1) for p in rest[0]
                if type(p) is list and len(p) == 2}
    raise ValueError("malformed value")
def send(fd, msg):
    data = _json.dumps(msg).encode()
    data = _struct.pack(">Q", len(data)) + data
    while data:
        data = data[os.write(fd, data):]
def recv(fd, limit=1 << 26):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("the other side closed the pipe")
            buf += chunk
        return buf
    (n,) = _struct.unpack(">Q", exact(8))
    if n > limit:
        raise ValueError("message too large")
    return _json.loads(exact(n))
"""

# The worker side, run in processes forked from a template (see RUNNER): it loads the untrusted
# solution and answers calls with plain data over a socket. It never sees the tests, the nonce
# or the runner's stdout.
WORKER = r"""
def worker_main(fd, path, entry):
    ns = {"__name__": "solution"}
    try:
        exec(compile(open(path, encoding="utf-8").read(), "solution.py", "exec"), ns)
        fn = ns.get(entry)
        ok = callable(fn)
    except BaseException:
        ok = False
    send(fd, ["loaded" if ok else "noload"])
    if not ok:
        os._exit(0)
    while True:
        try:
            msg = recv(fd)
        except BaseException:
            os._exit(0)
        try:
            value = fn(*dec(msg[0]), **dec(msg[1]))
        except BaseException as exc:
            send(fd, ["raise", type(exc).__name__])
            continue
        try:
            send(fd, ["ok", enc(value)])
        except TypeError:
            send(fd, ["bad"])
def template_main(ctl):
    # Forked before the runner read its config: this process holds no tests and no nonce, so
    # neither do the workers forked from it (a fork costs far less than a fresh interpreter).
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    while True:
        try:
            request = ctl.recv(1 << 16)
        except OSError:
            os._exit(0)
        if not request:
            os._exit(0)
        path, entry = _json.loads(request)
        mine, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ctl.close()
            mine.close()
            os.setsid()
            worker_main(theirs.detach(), path, entry)
            os._exit(0)
        theirs.close()
        socket.send_fds(ctl, [_json.dumps(pid).encode()], [mine.fileno()])
        mine.close()
"""

# The runner is passed with `python3 -I -S -c` (or run by the fork server as such), so nothing
# the agent wrote is on its path. It runs only trusted code (the prompt, the tests);
# `candidate` is a proxy into a worker process.
RUNNER = (
    "import builtins, io, os, signal, socket, sys\n"
    + CODEC
    + WORKER
    + r"""
def main():
    ctl, ctl_template = socket.socketpair()
    if os.fork() == 0:
        ctl.close()
        template_main(ctl_template)
        os._exit(0)
    ctl_template.close()
    cfg = _json.loads(sys.stdin.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # fd 0 stays taken: sockets are never fd 0
    import ctypes
    # Not dumpable: workers (same uid) can neither trace us nor open /proc/<us>/{mem,fd}.
    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")
    nonce = cfg["nonce"]
    clean = dict(builtins.__dict__)
    class Timeout(BaseException):
        pass
    def on_alarm(signum, frame):
        raise Timeout()
    signal.signal(signal.SIGALRM, on_alarm)
    real_out, real_err = sys.stdout, sys.stderr
    def guarded(seconds, code, ns):
        sys.stdout = sys.stderr = io.StringIO()
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            exec(code, ns)
            return "P"
        except Timeout:
            return "T"
        except AssertionError:
            return "F"
        except BaseException:
            return "E"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stderr = real_out, real_err
    steps = [(kind, compile(code, "<test>", "exec")) for kind, code in cfg["steps"]]
    preamble = compile(cfg["preamble"], "<tests>", "exec")
    n_tests = sum(1 for kind, _ in steps if kind == "test")
    worker = {"pid": None, "fd": None, "busy": False}
    def stop():
        if worker["pid"] is not None:
            os.close(worker["fd"])
            try:
                os.killpg(worker["pid"], signal.SIGKILL)
            except OSError:
                pass
        worker.update(pid=None, fd=None, busy=False)
    def spawn():
        signal.setitimer(signal.ITIMER_REAL, cfg["load_timeout"])
        loaded = False
        try:
            ctl.send(_json.dumps([cfg["solution"], cfg["entry_point"]]).encode())
            msg, fds, _, _ = socket.recv_fds(ctl, 64, 1)
            if len(fds) != 1:
                raise OSError("the worker template did not answer")
            worker.update(pid=int(_json.loads(msg)), fd=fds[0], busy=True)
            loaded = recv(fds[0], 64) == ["loaded"]
        except BaseException:
            loaded = False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        worker["busy"] = False
        if not loaded:
            stop()
        return loaded
    def candidate(*args, **kwargs):
        if worker["busy"]:
            stop()  # a call was cut short (timeout): that worker's state is unknown
        if worker["pid"] is None and not spawn():
            raise RuntimeError("the solution did not load")
        request = [enc(list(args)), enc(kwargs)]
        worker["busy"] = True
        send(worker["fd"], request)
        reply = recv(worker["fd"])
        worker["busy"] = False
        if reply[:1] == ["ok"] and len(reply) == 2:
            return dec(reply[1])
        if reply[:1] == ["raise"] and len(reply) == 2 and type(reply[1]) is str:
            kind = clean.get(reply[1])
            if isinstance(kind, type) and issubclass(kind, Exception):
                raise kind("raised by the solution")
            raise RuntimeError("the solution raised " + reply[1][:100])
        raise TypeError("the solution returned something that is not plain data")
    if not spawn():
        os.write(1, ("\n" + nonce + " L" + "E" * n_tests + "\n").encode())
        os._exit(0)
    tests = {"__name__": "__check__", "__builtins__": dict(clean)}
    exec(compile(cfg["context"], "<prompt>", "exec"), tests)
    exec(preamble, tests)
    tests["candidate"] = tests[cfg["entry_point"]] = candidate
    letters = []
    for kind, code in steps:
        tests["__builtins__"] = dict(clean)
        result = guarded(cfg["test_timeout"], code, tests)
        if kind == "test":
            letters.append(result)
    stop()
    os.write(1, ("\n" + nonce + " R" + "".join(letters) + "\n").encode())
    os._exit(0)
main()
"""
)


class TestSplitError(ValueError):
    """The test code has no `check(candidate)` function to split."""


@dataclass(frozen=True)
class TestPlan:
    preamble: str
    steps: tuple[tuple[str, str], ...]  # ("setup" | "test", source)

    @property
    def n_tests(self) -> int:
        return sum(1 for kind, _ in self.steps if kind == "test")


@functools.lru_cache(maxsize=4096)
def split_tests(test_code: str, check_name: str = "check") -> TestPlan:
    """Split `def check(candidate): ...` into setup statements and individual tests (cached)."""
    module = ast.parse(test_code)
    check: ast.FunctionDef | None = None
    preamble: list[ast.stmt] = []
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == check_name:
            check = node
        else:
            preamble.append(node)
    if check is None:
        raise TestSplitError(f"test code defines no {check_name}(candidate) function")
    steps: list[tuple[str, str]] = []
    for stmt in check.body:
        asserts = any(isinstance(n, ast.Assert) for n in ast.walk(stmt))
        uses_candidate = any(
            isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(stmt)
        )
        steps.append(("test" if asserts and uses_candidate else "setup", ast.unparse(stmt)))
    if not any(kind == "test" for kind, _ in steps):
        raise TestSplitError("check(candidate) asserts nothing about candidate")
    preamble_source = ast.unparse(ast.Module(body=preamble, type_ignores=[]))
    return TestPlan(preamble=preamble_source, steps=tuple(steps))


def _call_args(node: ast.expr, callee: str | None) -> tuple[object, ...] | None:
    """The literal arguments of `callee(...)` (any name when None), or None."""
    if not isinstance(node, ast.Call) or node.keywords or not isinstance(node.func, ast.Name):
        return None
    if callee is not None and node.func.id != callee:
        return None
    try:
        return tuple(ast.literal_eval(arg) for arg in node.args)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _checked_case(source: str) -> tuple[tuple[object, ...], object] | None:
    """(args, expected) of a test of the form `assert candidate(ARGS) == EXPECTED` (also
    `is True/False`, bare `assert candidate(ARGS)` and `assert not candidate(ARGS)`)."""
    try:
        stmt = ast.parse(source).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(stmt, ast.Assert):
        return None
    test = stmt.test
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        args = _call_args(test.operand, "candidate")
        return None if args is None else (args, False)
    if isinstance(test, ast.Call):
        args = _call_args(test, "candidate")
        return None if args is None else (args, True)
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq | ast.Is)
    ):
        args = _call_args(test.left, "candidate")
        try:
            expected = ast.literal_eval(test.comparators[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        return None if args is None else (args, expected)
    return None


def public_duplicates(plan: TestPlan, examples: list[tuple[str, str]]) -> tuple[bool, ...]:
    """For each test of `plan`, whether it only re-checks a public example.

    `examples` are the task's public (source, want) doctest pairs, like `("f(1, 2)", "3")`.
    Such a test checks nothing the agent was not shown, so it is left out of the reward:
    otherwise hard-coding the docstring's outputs earns partial credit.
    """
    shown: list[tuple[tuple[object, ...], object]] = []
    for source, want in examples:
        try:
            call = ast.parse(source.strip(), mode="eval").body
            expected = ast.literal_eval(want.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        args = _call_args(call, None)
        if args is not None:
            shown.append((args, expected))
    flags = []
    for kind, source in plan.steps:
        if kind != "test":
            continue
        case = _checked_case(source)
        flags.append(case is not None and any(_same(case, seen) for seen in shown))
    return tuple(flags)


def _same(a: object, b: object) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


@dataclass(frozen=True)
class TestRun:
    """Per-test letters: P passed, F assertion failed, E error, T timed out."""

    letters: str
    loaded: bool
    reported: bool
    timed_out: bool
    duration_s: float
    oom_killed: bool = False

    @property
    def failure(self) -> str | None:
        """The failure class (sdk.models.FAILURE_CLASSES) when the solution failed as a whole
        rather than on some tests; every one of them is the solution's doing."""
        if not self.reported:
            return "timeout" if self.timed_out else "oom" if self.oom_killed else "crash"
        if not self.loaded:
            return "load_error"
        if self.letters and set(self.letters) == {"T"}:
            return "timeout"
        return None

    @property
    def passed(self) -> int:
        return self.letters.count("P")

    @property
    def total(self) -> int:
        return len(self.letters)

    @property
    def all_passed(self) -> bool:
        """The coding family's reward rule: 1 only when every hidden test passed."""
        return self.reported and self.loaded and self.total > 0 and self.passed == self.total

    def hidden_fraction(self, duplicates: tuple[bool, ...]) -> float:
        """The reward: the fraction of tests passed, leaving out re-checked public examples
        (all tests count when every one of them is a public example)."""
        kept = [c for c, dup in zip(self.letters, duplicates, strict=False) if not dup]
        if len(duplicates) != len(self.letters) or not kept:
            kept = list(self.letters)
        return kept.count("P") / len(kept) if kept else 0.0

    def summary(self) -> str:
        if not self.reported:
            why = "it timed out" if self.timed_out else "the solution ended the test process"
            return f"the hidden tests did not report: {why}"
        if not self.loaded:
            return (
                "the solution did not load (missing, syntax error, exception or no such function)"
            )
        counts = {
            name: self.letters.count(c)
            for c, name in (("F", "failed"), ("E", "raised"), ("T", "timed out"))
        }
        rest = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
        return f"{self.passed}/{self.total} hidden tests passed" + (f" ({rest})" if rest else "")


async def run_python_tests(
    run_python: PythonRunner,
    *,
    solution_path: str,
    solution: bytes,
    plan: TestPlan,
    entry_point: str,
    context: str = "",
    test_timeout: float = 6.0,
    load_timeout: float = 6.0,
    total_timeout: float = 60.0,
    memory_mb: int = 1024,
    workspace_mb: int = 64,
) -> TestRun:
    """Run `plan` against `solution` (its bytes) in a one-shot sandbox whose /work holds only
    `solution_path`, through `run_python` (an episode's `Sandboxes.run_python`).

    `context` is trusted public code the tests may call (HumanEval's prompt: helpers such as
    `encode_shift`); it runs in the tests' namespace, so a solution cannot redefine it.
    """
    nonce = secrets.token_hex(16)
    config = {
        "nonce": nonce,
        "solution": solution_path,
        "entry_point": entry_point,
        "context": context,
        "preamble": plan.preamble,
        "steps": plan.steps,
        "test_timeout": test_timeout,
        "load_timeout": load_timeout,
    }
    started = time.perf_counter()
    result = await run_python(
        RUNNER,
        files={solution_path: solution},
        stdin=json.dumps(config).encode(),
        timeout=total_timeout,
        max_output=1 << 20,
        memory_mb=memory_mb,
        workspace_mb=workspace_mb,
    )
    duration = time.perf_counter() - started
    for line in reversed(result.stdout.splitlines()):
        head, _, body = line.partition(" ")
        if head == nonce and body[:1] in ("L", "R"):
            letters = body[1:]
            if len(letters) == plan.n_tests and set(letters) <= set("PFET"):
                return TestRun(
                    letters, body[0] == "R", True, result.timed_out, duration, result.oom_killed
                )
    return TestRun("E" * plan.n_tests, False, False, result.timed_out, duration, result.oom_killed)
