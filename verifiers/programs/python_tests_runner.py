"""The hidden-test runner of `palaestra.verifiers.python_tests` (stdlib only).

It runs as ``python3 -I -S -c <this file>`` (or from the fork server, as such), so nothing
the agent wrote is on its path. It runs only trusted code (the prompt, the tests);
`candidate` is a proxy into a worker process that loads the untrusted solution and answers
calls with plain data over a socket (tagged JSON, exact for every builtin scalar: ints in
hex, floats as float.hex, so inf/nan/-0.0 survive). Workers are forked from a template
forked before the runner reads its configuration, so they never held the tests or the nonce.
"""

from __future__ import annotations

import builtins
import io
import json as _json
import os
import signal
import socket
import struct as _struct
import sys

TYPE_CHECKING = False  # no `typing` import at run time: it costs an interpreter milliseconds
if TYPE_CHECKING:
    from types import CodeType, FrameType
    from typing import Any

_TAGS: dict[type, str] = {list: "l", tuple: "t", set: "S", frozenset: "F"}
_TYPES = {v: k for k, v in _TAGS.items()}
_PLAIN = {type(None), bool, int, float, complex, str, bytes, dict, *_TAGS}


# A subclass of a builtin (a Counter, a namedtuple, an IntEnum...) travels as its base value,
# read through the base type's own slots, never through methods the subclass can override:
# HumanEval's `candidate(x) == expected` accepts such returns, and the runner then compares
# the plain value, so a subclass whose `__eq__` (or `__iter__`, `items`...) lies gains nothing.
_BASES: tuple[tuple[type, Any], ...] = (
    (int, int.__int__),
    (float, float.__float__),
    (complex, lambda v: complex(complex.real.__get__(v), complex.imag.__get__(v))),
    (str, str.__str__),
    (bytes, lambda v: bytes.__getitem__(v, slice(None))),
    (list, list.copy),
    (tuple, lambda v: tuple.__getitem__(v, slice(None))),
    (dict, lambda v: dict(dict.items(v))),
    (set, set.copy),
    (frozenset, frozenset.copy),
)


def base_value(v: Any) -> Any:
    """`v`, a subclass instance of a builtin, as a plain instance of that builtin."""
    t = type(v)
    for base, plain in _BASES:
        if issubclass(t, base):
            return plain(v)
    raise TypeError("not plain data: " + t.__name__)


def enc(v: Any, depth: int = 0) -> list[Any]:
    t = type(v)
    if depth > 50:
        raise TypeError("nested too deep")
    if t not in _PLAIN:
        v = base_value(v)
        t = type(v)
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


def dec(x: Any, depth: int = 0) -> Any:
    if depth > 52 or type(x) is not list or not x or type(x[0]) is not str:
        raise ValueError("malformed value")
    tag, rest = x[0], x[1:]
    if tag == "n" and not rest:
        return None
    if tag == "b" and len(rest) == 1 and type(rest[0]) is bool:
        return rest[0]
    if tag in ("i", "f", "s", "y") and len(rest) == 1 and type(rest[0]) is str:
        s = rest[0]
        return (
            int(s, 16)
            if tag == "i"
            else float.fromhex(s)
            if tag == "f"
            else (s if tag == "s" else bytes.fromhex(s))
        )
    if tag == "c" and len(rest) == 2 and all(type(s) is str for s in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag in _TYPES and len(rest) == 1 and type(rest[0]) is list:
        return _TYPES[tag](dec(i, depth + 1) for i in rest[0])
    if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
        return {
            dec(p[0], depth + 1): dec(p[1], depth + 1)
            for p in rest[0]
            if type(p) is list and len(p) == 2
        }
    raise ValueError("malformed value")


def send(fd: int, msg: Any) -> None:
    data = _json.dumps(msg).encode()
    data = _struct.pack(">Q", len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def recv(fd: int, limit: int = 1 << 26) -> Any:
    def exact(n: int) -> bytes:
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


def worker_main(fd: int, path: str, entry: str) -> None:
    # As HumanEval's "prompt plus completion": the prompt (public: its imports and helpers)
    # runs first, then the solution, whose definitions win. The solution is compiled from
    # its bytes, as Python reads a source file (a UTF-8 BOM, a coding cookie, CRLF), and
    # without this file's `from __future__ import annotations`, as HumanEval compiles it.
    ns: dict[str, Any] = {"__name__": "solution"}
    try:
        (context,) = recv(fd)
        exec(compile(context, "<prompt>", "exec", dont_inherit=True), ns)
    except BaseException:
        pass  # the prompt is trusted and ran in the runner; here it only lends names
    stub = ns.get(entry)  # the prompt's own docstring-only function is not an answer
    try:
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec", dont_inherit=True), ns)
        fn = ns.get(entry)
        ok = callable(fn) and fn is not stub
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
            value = fn(*dec(msg[0]), **dec(msg[1]))  # type: ignore[misc]  # callable: loaded
        except BaseException as exc:
            send(fd, ["raise", type(exc).__name__])
            continue
        try:
            reply = ["ok", enc(value)]
        except Exception:  # not plain data, or a subclass whose hash or copy raised
            reply = ["bad"]
        send(fd, reply)


def template_main(ctl: socket.socket) -> None:
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


def main() -> None:
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

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise Timeout()

    signal.signal(signal.SIGALRM, on_alarm)
    real_out, real_err = sys.stdout, sys.stderr

    def guarded(seconds: float, code: CodeType, ns: dict[str, Any]) -> str:
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
    worker: dict[str, Any] = {"pid": None, "fd": None, "busy": False}

    def stop() -> None:
        if worker["pid"] is not None:
            os.close(worker["fd"])
            try:  # noqa: SIM105 (no contextlib import: the runner stays lean)
                os.killpg(worker["pid"], signal.SIGKILL)
            except OSError:
                pass
        worker.update(pid=None, fd=None, busy=False)

    def spawn() -> bool:
        signal.setitimer(signal.ITIMER_REAL, cfg["load_timeout"])
        loaded = False
        try:
            ctl.send(_json.dumps([cfg["solution"], cfg["entry_point"]]).encode())
            msg, fds, _, _ = socket.recv_fds(ctl, 64, 1)
            if len(fds) != 1:
                raise OSError("the worker template did not answer")
            worker.update(pid=int(_json.loads(msg)), fd=fds[0], busy=True)
            send(fds[0], [cfg["context"]])
            loaded = recv(fds[0], 64) == ["loaded"]
        except BaseException:
            loaded = False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        worker["busy"] = False
        if not loaded:
            stop()
        return loaded

    def candidate(*args: Any, **kwargs: Any) -> Any:
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
    tests: dict[str, Any] = {"__name__": "__check__", "__builtins__": dict(clean)}
    exec(compile(cfg["context"], "<prompt>", "exec"), tests)
    exec(preamble, tests)
    tests["candidate"] = tests[cfg["entry_point"]] = candidate
    letters: list[str] = []
    for kind, code in steps:
        if "T" in letters:  # after a timeout nothing more runs: one hang costs one timeout
            if kind == "test":
                letters.append("T")
            continue
        tests["__builtins__"] = dict(clean)
        result = guarded(cfg["test_timeout"], code, tests)
        if kind == "test":
            letters.append(result)
    stop()
    os.write(1, ("\n" + nonce + " R" + "".join(letters) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
