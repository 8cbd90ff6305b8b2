import pytest

from envconf.loader import load

DEFAULTS = {"debug": False, "workers": 2, "ratio": 0.5, "hosts": ["localhost"], "name": "app"}


def test_defaults_without_env():
    assert load(DEFAULTS, {}) == DEFAULTS


def test_int_and_str():
    got = load(DEFAULTS, {"APP_WORKERS": "8", "APP_NAME": "shop"})
    assert got["workers"] == 8 and got["name"] == "shop"


def test_other_variables_ignored():
    assert load(DEFAULTS, {"HOME": "/root", "APP_UNKNOWN": "1"}) == DEFAULTS


def test_true_booleans():
    for text in ("1", "true", "YES", " on "):
        assert load(DEFAULTS, {"APP_DEBUG": text})["debug"] is True


def test_false_booleans():
    base = dict(DEFAULTS, debug=True)
    for text in ("0", "false", "No", "OFF "):
        assert load(base, {"APP_DEBUG": text})["debug"] is False


def test_invalid_boolean_raises():
    with pytest.raises(ValueError):
        load(DEFAULTS, {"APP_DEBUG": "maybe"})


def test_lists_are_split():
    got = load(DEFAULTS, {"APP_HOSTS": "a.example, b.example,,c.example "})
    assert got["hosts"] == ["a.example", "b.example", "c.example"]
