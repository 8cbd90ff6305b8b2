"""The wire between a repository task's test process and the worker that runs the agent's
code (stdlib only; repo_proxy.py on the test side, repo_worker.py in the worker).

Why a wire of its own: what crosses it from the worker is decoded by the test process
into fresh objects of builtin types, so no object of the agent's (an always-equal `str`
subclass, a patched container) ever reaches the test process; anything else stays in the
worker and crosses as a reference (a handle), which the test process can only hand back.

One message a line: a JSON array. A value is a tagged array: ``["n"]`` None, ``["b", x]``,
``["i", x]``, ``["f", float.hex]``, ``["c", re, im]``, ``["s", x]``, ``["y", base64]``,
``["Y", base64]`` (bytearray), ``["l" | "t" | "S" | "F", [values]]`` (list, tuple, set,
frozenset), ``["d", [[key, value], …]]``, ``["q", num, den]`` (Fraction), ``["D", str]``
(Decimal), ``["Td" | "Tt" | "Tc", iso, utc offset s | null]`` (date, datetime, time with
no zone or a fixed one), ``["Tl", days, s, µs]`` (timedelta), ``["j", value]`` (a list or
dict holding only lists, dicts with string keys, str, int, float, bool and None: the JSON
value itself, which the JSON decoder already builds as fresh builtin objects, so a large
plain argument or result costs no walk of ours on the way in); the other tags (handles,
modules, exception classes, a fresh sentinel) are each side's own (`ref` and `deref`).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import fractions
import json
import os
import select
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_DEPTH = 100  # nesting of one value
MAX_LINE = 64 * 1024 * 1024  # one message
SEQUENCES: dict[type, str] = {list: "l", tuple: "t", set: "S", frozenset: "F"}
JSON_SCALARS = frozenset({str, int, float, bool, type(None)})
BUILDERS: dict[str, Callable[[list[Any]], Any]] = {"l": list, "t": tuple, "S": set, "F": frozenset}
# Values of the standard library's number and time types, by their parts (exact types).
TIME_TAGS: dict[type, str] = {datetime.date: "Td", datetime.datetime: "Tt", datetime.time: "Tc"}
TIME_BUILDERS: dict[str, Callable[[str], Any]] = {
    "Td": datetime.date.fromisoformat,
    "Tt": datetime.datetime.fromisoformat,
    "Tc": datetime.time.fromisoformat,
}
VALUE_TYPES = frozenset({fractions.Fraction, decimal.Decimal, datetime.timedelta, *TIME_TAGS})
OWN_TAGS = frozenset(
    {"n", "b", "s", "i", "f", "c", "y", "Y", "d", "j", "q", "D", "Tl", *TIME_BUILDERS}
)


class WireError(Exception):
    """A message that is not one of the protocol's (malformed, too large, too deep)."""


def encode(value: object, ref: Callable[[object], list[Any]], depth: int = 0) -> list[Any]:
    """`value` as a tagged array; `ref(value)` for anything that is not plain data
    (its exact type decides: a subclass of a builtin is not plain)."""
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested more than {MAX_DEPTH} deep (a cycle?)")
    kind = type(value)
    if value is None:
        return ["n"]
    if kind is bool or kind is str:
        return ["b" if kind is bool else "s", value]
    if kind is int:
        return ["i", value]
    if kind is float:
        return ["f", value.hex()]  # type: ignore[attr-defined]
    if kind is complex:
        return ["c", value.real.hex(), value.imag.hex()]  # type: ignore[attr-defined]
    if kind is bytes or kind is bytearray:
        tag = "y" if kind is bytes else "Y"
        return [tag, base64.b64encode(value).decode("ascii")]  # type: ignore[arg-type]
    if kind in VALUE_TYPES and (parts := _stdlib_value(value)) is not None:
        return parts
    if (kind is list or kind is dict) and _json_only(value, depth):
        return ["j", value]
    if kind in SEQUENCES:
        return [SEQUENCES[kind], [encode(x, ref, depth + 1) for x in value]]  # type: ignore[attr-defined]
    if kind is dict:
        items = value.items()  # type: ignore[attr-defined]
        return ["d", [[encode(k, ref, depth + 1), encode(v, ref, depth + 1)] for k, v in items]]
    return ref(value)


def _stdlib_value(value: Any) -> list[Any] | None:
    """A number or time value of the standard library's (exact type) by its parts; None
    for a time in a zone of its own (a handle then)."""
    kind = type(value)
    if kind is fractions.Fraction:
        return ["q", value.numerator, value.denominator]
    if kind is decimal.Decimal:
        return ["D", str(value)]
    if kind is datetime.timedelta:
        return ["Tl", value.days, value.seconds, value.microseconds]
    if kind is datetime.date:
        return ["Td", value.isoformat(), None]
    if type(value.tzinfo) not in (type(None), datetime.timezone):
        return None
    offset = value.utcoffset()
    seconds = None if offset is None else offset.days * 86400 + offset.seconds
    return [TIME_TAGS[kind], value.isoformat(), seconds]


def _json_only(value: object, depth: int) -> bool:
    """Whether `value` is made of JSON's own types only (exact types; string keys). A loop
    over one stack, not a recursion: a 100 000-record argument is checked in ~0.1 s."""
    scalars = JSON_SCALARS
    stack: list[tuple[object, int]] = [(value, depth)]
    pop, push = stack.pop, stack.append
    while stack:
        item, level = pop()
        if level > MAX_DEPTH:
            return False
        kind = type(item)
        if kind is list:
            for x in item:  # type: ignore[attr-defined]
                if type(x) not in scalars:
                    push((x, level + 1))
        elif kind is dict:
            for k, v in item.items():  # type: ignore[attr-defined]
                if type(k) is not str:
                    return False
                if type(v) not in scalars:
                    push((v, level + 1))
        elif kind not in scalars:
            return False
    return True


def decode(node: object, deref: Callable[[list[Any]], object], depth: int = 0) -> Any:
    """A fresh value of builtin types from a tagged array; `deref(node)` for the other tags."""
    if depth > MAX_DEPTH or not isinstance(node, list) or not node:
        raise WireError("not a value of the protocol")
    tag, args = node[0], node[1:]
    if tag == "n" and not args:
        return None
    if tag == "j" and len(args) == 1 and type(args[0]) in (list, dict):
        return args[0]  # built by the JSON decoder from this message alone
    if len(args) == 1 and (tag, type(args[0])) in (("b", bool), ("s", str), ("i", int)):
        return {"b": bool, "s": str, "i": int}[tag](args[0])
    if tag == "f" and len(args) == 1 and isinstance(args[0], str):
        return _float(args[0])
    if tag == "c" and len(args) == 2 and all(isinstance(a, str) for a in args):
        return complex(_float(args[0]), _float(args[1]))
    if tag in ("y", "Y") and len(args) == 1 and isinstance(args[0], str):
        data = base64.b64decode(args[0].encode("ascii"), validate=True)
        return bytes(data) if tag == "y" else bytearray(data)
    if tag == "q" and len(args) == 2 and all(type(a) is int for a in args) and args[1] > 0:
        return fractions.Fraction(args[0], args[1])
    if tag == "D" and len(args) == 1 and isinstance(args[0], str):
        return decimal.Decimal(args[0])
    if tag == "Tl" and len(args) == 3 and all(type(a) is int for a in args):
        return datetime.timedelta(days=args[0], seconds=args[1], microseconds=args[2])
    if tag in TIME_BUILDERS and len(args) == 2 and isinstance(args[0], str):
        value = TIME_BUILDERS[tag](args[0])
        offset = None if tag == "Td" else value.utcoffset()
        if args[1] is None if offset is None else args[1] == offset.days * 86400 + offset.seconds:
            return value
    if tag in BUILDERS and len(args) == 1 and isinstance(args[0], list):
        return BUILDERS[tag]([decode(x, deref, depth + 1) for x in args[0]])
    if tag == "d" and len(args) == 1 and isinstance(args[0], list):
        out = {}
        for pair in args[0]:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise WireError("not a dict item of the protocol")
            out[decode(pair[0], deref, depth + 1)] = decode(pair[1], deref, depth + 1)
        return out
    if isinstance(tag, str) and tag not in OWN_TAGS:
        return deref(node)
    raise WireError(f"not a value of the protocol (tag {str(tag)[:20]!r})")


def _float(text: str) -> float:
    try:
        return float.fromhex(text)
    except ValueError:
        if text in ("inf", "-inf", "nan"):
            return float(text)
        raise WireError("not a float of the protocol") from None


def send(fd: int, message: object) -> None:
    """Write one message (a whole line) to `fd`."""
    data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Reader:
    """Whole lines from a pipe, within a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def read(self, timeout_s: float | None = None) -> Any:
        """The next message; EOFError at the end, TimeoutError past `timeout_s`, WireError
        for anything that is not a message."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        chunks, size = [self.buffer], len(self.buffer)
        while b"\n" not in chunks[-1]:  # each chunk is searched once (a large message)
            if size > MAX_LINE:
                raise WireError(f"a message over {MAX_LINE} bytes")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.buffer = b"".join(chunks)
                raise TimeoutError
            if not poller.poll(None if left is None else max(1, int(left * 1000))):
                continue
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            size += len(chunk)
        line, _, self.buffer = b"".join(chunks).partition(b"\n")
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            raise WireError("a line that is not JSON") from None
