"""Hidden unit tests for function-level Python tasks, run in a fresh sandbox.

The test code (HumanEval's shape: `def check(candidate): assert ...`) is split into
individual test cases, one per top-level statement of `check` that asserts something
about `candidate`, so the reward can be the fraction passed. The runner reads its
configuration — including a per-run nonce — from stdin before any untrusted code runs,
and reports one letter per test on a line that starts with the nonce.

The untrusted solution never runs in the runner's process: a separate worker interpreter
(fresh memory, stdout/stderr to /dev/null, no nonce, no tests) loads it and answers each
`candidate(...)` call over a pipe with plain builtin data (tagged JSON). The assertions,
the prompt's helpers and the stdlib modules the tests use all live in the runner, which is
made non-dumpable so the worker cannot read its memory or open its stdout through /proc.
So the solution cannot forge the report (frames, gc, /proc), patch what the tests call
(builtins, `math`), redefine the prompt's helpers, or return an object whose `__eq__`
always says True: it can only choose return values.
"""

from __future__ import annotations

import ast
import json
import secrets
import time
from dataclasses import dataclass

from palaestra.sandbox import Sandbox

VERSION = "1.1.0"
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

# The worker: a separate, fresh interpreter that loads the untrusted solution and answers
# calls with plain data over a pipe. It never sees the tests, the nonce or the runner's stdout.
WORKER = (
    "import os, sys\n"
    + CODEC
    + r"""
def main():
    rfd, wfd, path, entry = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ns = {"__name__": "solution"}
    try:
        exec(compile(open(path, encoding="utf-8").read(), "solution.py", "exec"), ns)
        fn = ns.get(entry)
        ok = callable(fn)
    except BaseException:
        ok = False
    send(wfd, ["loaded" if ok else "noload"])
    if not ok:
        os._exit(0)
    while True:
        try:
            msg = recv(rfd)
        except EOFError:
            os._exit(0)
        try:
            value = fn(*dec(msg[0]), **dec(msg[1]))
        except BaseException as exc:
            send(wfd, ["raise", type(exc).__name__])
            continue
        try:
            send(wfd, ["ok", enc(value)])
        except TypeError:
            send(wfd, ["bad"])
main()
"""
)

# The runner is passed with `python3 -I -S -c`, so nothing the agent wrote is on its path. It
# runs only trusted code (the prompt, the tests); `candidate` is a proxy into the worker.
RUNNER = (
    "import builtins, io, os, signal, subprocess, sys\n"
    + CODEC
    + "WORKER = "
    + repr(WORKER)
    + r"""
def main():
    cfg = _json.loads(sys.stdin.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # fd 0 stays taken: pipes are never fd 0
    import ctypes
    # Not dumpable: the worker (same uid) can neither trace us nor open /proc/<us>/{mem,fd}.
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
    worker = {"proc": None, "busy": False}
    def stop():
        proc = worker["proc"]
        if proc is not None:
            for fd in (worker["to"], worker["from"]):
                os.close(fd)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        worker["proc"], worker["busy"] = None, False
    def spawn():
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WORKER, str(r1), str(w2), cfg["solution"],
             cfg["entry_point"]],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(r1, w2), start_new_session=True,
        )
        os.close(r1)
        os.close(w2)
        worker.update(proc=proc, to=w1, busy=True)
        worker["from"] = r2
        signal.setitimer(signal.ITIMER_REAL, cfg["load_timeout"])
        try:
            loaded = recv(r2, 64) == ["loaded"]
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
        if worker["proc"] is None and not spawn():
            raise RuntimeError("the solution did not load")
        request = [enc(list(args)), enc(kwargs)]
        worker["busy"] = True
        send(worker["to"], request)
        reply = recv(worker["from"])
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
    steps: list[tuple[str, str]]  # ("setup" | "test", source)

    @property
    def n_tests(self) -> int:
        return sum(1 for kind, _ in self.steps if kind == "test")


def split_tests(test_code: str, check_name: str = "check") -> TestPlan:
    """Split `def check(candidate): ...` into setup statements and individual tests."""
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
    return TestPlan(preamble=ast.unparse(ast.Module(body=preamble, type_ignores=[])), steps=steps)


@dataclass(frozen=True)
class TestRun:
    """Per-test letters: P passed, F assertion failed, E error, T timed out."""

    letters: str
    loaded: bool
    reported: bool
    timed_out: bool
    duration_s: float

    @property
    def passed(self) -> int:
        return self.letters.count("P")

    @property
    def total(self) -> int:
        return len(self.letters)

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
    sandbox: Sandbox,
    *,
    solution_path: str,
    plan: TestPlan,
    entry_point: str,
    context: str = "",
    test_timeout: float = 6.0,
    load_timeout: float = 6.0,
    total_timeout: float = 60.0,
) -> TestRun:
    """Run `plan` against the solution already written at `solution_path` in `sandbox`.

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
    result = await sandbox.exec(
        [PYTHON, "-I", "-S", "-c", RUNNER],
        stdin=json.dumps(config),
        timeout=total_timeout,
        max_output=1 << 20,
    )
    duration = time.perf_counter() - started
    for line in reversed(result.stdout.splitlines()):
        head, _, body = line.partition(" ")
        if head == nonce and body[:1] in ("L", "R"):
            letters = body[1:]
            if len(letters) == plan.n_tests and set(letters) <= set("PFET"):
                return TestRun(letters, body[0] == "R", True, result.timed_out, duration)
    return TestRun("E" * plan.n_tests, False, False, result.timed_out, duration)
