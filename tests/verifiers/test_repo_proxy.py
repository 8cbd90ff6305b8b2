"""The repository runner's proxies (verifiers/programs/repo_proxy.py) against a real worker
process (repo_worker.py) on a package written to a temporary workspace: what crosses back
is plain data of builtin types or a handle, exceptions keep their builtin type, plain
arguments changed in place are written back, a value of the test's cannot cross, and a
worker that ends, hangs or writes something that is not an answer is a fault that a fresh
worker follows. (The sandboxed end-to-end checks:
tests/envs/terminal/test_terminal_repo_cheats.py.)"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from palaestra.verifiers.programs import repo_wire

sys.modules.setdefault("repo_wire", repo_wire)  # as repo_runner.py registers it
from palaestra.verifiers.programs import repo_proxy  # noqa: E402

WORKER = Path(repo_wire.__file__).with_name("repo_worker.py")
PKG = "palaestra_probe_pkg"
CODE = """
import collections
import json
import os
import time


class Box:
    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)

    def __contains__(self, x):
        return x in self.items

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __add__(self, other):
        return Box(self.items + list(other))

    def total(self):
        return sum(self.items)


class BadInput(ValueError):
    pass


class Own(Exception):
    pass


class Liar(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


class Equal:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


Point = collections.namedtuple("Point", "x y")


def plain():
    return [1, -0.0, float("nan"), 2**80, "é", b"\\x00", (1, 2), {"k": {3}}, None, True]


def liar():
    return Liar("x")


def subclasses():
    return Point(1, 2), collections.Counter("aab")


def raise_(kind, *args):
    raise {"value": ValueError, "key": KeyError, "bad": BadInput, "own": Own}[kind](*args)


def mutate(xs, d):
    xs[0].append(7)
    xs.append(3)
    d["new"] = 1
    return None


def echo(x):
    return x


def gen(n):
    yield from range(n)


def die():
    os._exit(3)


def hang():
    time.sleep(600)


def lie():
    out = json.loads(__import__("sys").argv[1])["out"]
    os.write(out, b"not an answer\\n")
    return 1


def use_pytest():
    import pytest  # noqa: F401


def stdlib_values():
    import datetime as dt, decimal, fractions, zoneinfo
    class Half(fractions.Fraction):
        def __eq__(self, other):
            return True
    east = dt.timezone(dt.timedelta(hours=5, minutes=30))
    return (
        fractions.Fraction(3, 2), decimal.Decimal("1.10"), dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 12, 0, 1, 5), dt.datetime(2024, 1, 1, tzinfo=east),
        dt.time(23, 59), dt.timedelta(days=-1, seconds=3), Half(1, 2),
    )
"""


@pytest.fixture
def pkg(tmp_path: Path) -> Iterator[tuple[ModuleType, repo_proxy.Remote]]:
    (tmp_path / PKG).mkdir()
    (tmp_path / PKG / "__init__.py").write_text(CODE)
    workdir = os.path.realpath(tmp_path)
    remote = repo_proxy.Remote(str(WORKER), workdir, [PKG], timeout_s=5.0)
    saved = (list(sys.meta_path), list(sys.path))

    def inside(path: str) -> bool:
        return os.path.realpath(path).startswith(workdir + "/")

    repo_proxy.install(remote, inside, set())
    sys.path.append(workdir)
    try:
        import palaestra_probe_pkg as module  # type: ignore[import-not-found]

        assert isinstance(module, repo_proxy.ProxyModule)
        yield module, remote
    finally:
        remote.close()
        sys.meta_path[:], sys.path[:] = saved
        sys.modules.pop(PKG, None)


def test_plain_data_crosses_and_objects_stay_in_the_worker(
    pkg: tuple[ModuleType, repo_proxy.Remote],
) -> None:
    mod, _ = pkg
    got = mod.plain()
    assert type(got) is list and got[0] == 1 and math.copysign(1, got[1]) == -1
    assert math.isnan(got[2]) and got[3:] == [2**80, "é", b"\x00", (1, 2), {"k": {3}}, None, True]
    box = mod.Box([1, 2, 3])
    assert isinstance(box, repo_proxy.RemoteObject)
    assert len(box) == 3 and 2 in box and 9 not in box and list(box) == [1, 2, 3]
    assert box[1] == 2 and box.total() == 6 and box.items == [1, 2, 3]
    more = box + (4,)  # noqa: RUF005 -- the code's __add__, run in the worker
    assert len(more) == 4 and list(mod.gen(3)) == [0, 1, 2]
    assert mod.echo(box) is box  # the code's own object crosses back as the same handle


def test_subclasses_of_builtins_cross_as_builtin_values(
    pkg: tuple[ModuleType, repo_proxy.Remote],
) -> None:
    mod, remote = pkg
    got = mod.liar()
    assert type(got) is str and got == "x" and got != "y"
    assert remote.claims == 1  # the always-equal str was counted
    point, counter = mod.subclasses()
    assert type(point) is tuple and point == (1, 2)
    assert type(counter) is dict and counter == {"a": 2, "b": 1}
    assert remote.claims == 1
    equal = mod.Equal()  # not plain: stays a handle; against a fresh object it claims
    assert isinstance(equal, repo_proxy.RemoteObject) and (equal == object()) is True


def test_the_standard_librarys_numbers_and_times_cross_as_values(
    pkg: tuple[ModuleType, repo_proxy.Remote],
) -> None:
    # a repository's correct Fraction, Decimal or date return equals the test's own value
    # in a strict assert (a handle would equal nothing of the test's); a subclass of one
    # stays a handle
    import datetime as dt
    import decimal
    import fractions

    mod, _ = pkg
    got = mod.stdlib_values()
    east = dt.timezone(dt.timedelta(hours=5, minutes=30))
    want = (
        fractions.Fraction(3, 2), decimal.Decimal("1.10"), dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 12, 0, 1, 5), dt.datetime(2024, 1, 1, tzinfo=east),
        dt.time(23, 59), dt.timedelta(days=-1, seconds=3),
    )  # fmt: skip
    assert got[:7] == want and [type(x) for x in got[:7]] == [type(x) for x in want]
    assert str(got[1]) == "1.10" and got[4].utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert isinstance(got[7], repo_proxy.RemoteObject)


def test_exceptions_keep_their_builtin_type(pkg: tuple[ModuleType, repo_proxy.Remote]) -> None:
    mod, _ = pkg
    with pytest.raises(ValueError, match="no good"):
        mod.raise_("value", "no good")
    with pytest.raises(KeyError) as key:
        mod.raise_("key", "k")
    assert key.value.args == ("k",)
    with pytest.raises(ValueError) as bad:  # the code's own class: a local ValueError subclass
        mod.raise_("bad", 1, 2)
    assert isinstance(bad.value, mod.BadInput) and bad.value.args == (1, 2)
    with pytest.raises(repo_proxy.RemoteError):
        mod.raise_("own")
    with pytest.raises(AttributeError):
        _ = mod.missing_name


def test_plain_arguments_changed_in_place_are_written_back(
    pkg: tuple[ModuleType, repo_proxy.Remote],
) -> None:
    mod, _ = pkg
    inner: list[int] = [1]
    xs, d = [inner, 2], {"a": 1}
    mod.mutate(xs, d=d)
    assert xs == [[1, 7], 2, 3] and xs[0] is inner and d == {"a": 1, "new": 1}


def test_a_value_of_the_tests_cannot_cross(pkg: tuple[ModuleType, repo_proxy.Remote]) -> None:
    mod, _ = pkg
    with pytest.raises(TypeError, match="cannot be passed to the code under test"):
        mod.echo(lambda: 1)
    assert (mod.Box([1]) == object()) is False  # compared as a fresh object of the worker's


def test_a_worker_that_ends_hangs_or_lies_is_a_fault(
    pkg: tuple[ModuleType, repo_proxy.Remote],
) -> None:
    mod, remote = pkg
    box, echo = mod.Box([1]), mod.echo
    with pytest.raises(repo_proxy.WorkerGone):
        mod.die()
    assert remote.faults[-1] == "the code under test ended its own process (exit status 3)"
    assert echo(5) == 5  # a module-level name, looked up again in a fresh worker
    with pytest.raises(repo_proxy.WorkerGone):
        len(box)  # an object of the worker that ended
    with pytest.raises(repo_proxy.WorkerGone):
        mod.hang()
    assert remote.faults[-1] == "the code under test did not answer within 5 s (killed)"
    with pytest.raises(repo_proxy.WorkerGone):
        mod.lie()
    assert remote.faults[-1].startswith("the code under test wrote something that is not an answer")
    with pytest.raises(ImportError):
        mod.use_pytest()
    assert remote.faults[-1] == "the code under test tried to import pytest"
    assert mod.echo([1]) == [1]
