import pytest

from semverlib.version import compare, latest


def test_equal():
    assert compare("1.2.3", "1.2.3") == 0
    assert compare("1.2.3+build.5", "1.2.3+other") == 0


def test_simple_order():
    assert compare("1.2.3", "1.2.4") == -1
    assert compare("2.0.0", "1.9.9") == 1


def test_latest():
    assert latest(["0.1.0", "0.3.0", "0.2.0"]) == "0.3.0"


def test_invalid():
    for bad in ("1.2", "01.2.3", "1.2.3-", "v1.2.3"):
        with pytest.raises(ValueError):
            compare(bad, "1.0.0")


def test_numeric_components():
    assert compare("1.10.0", "1.9.0") == 1
    assert compare("10.0.0", "9.99.99") == 1
    assert latest(["1.2.10", "1.2.9", "1.2.1"]) == "1.2.10"


def test_prerelease_sorts_before_release():
    assert compare("1.0.0-alpha", "1.0.0") == -1
    assert compare("1.0.0", "1.0.0-rc.1") == 1


def test_prerelease_identifiers():
    assert compare("1.0.0-alpha.2", "1.0.0-alpha.10") == -1
    assert compare("1.0.0-alpha.1", "1.0.0-alpha.beta") == -1
    assert compare("1.0.0-alpha", "1.0.0-alpha.1") == -1
