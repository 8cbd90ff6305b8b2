import pytest

from timeparse.duration import format_duration, parse_duration


def test_hours_minutes():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2h 5m") == 7500


def test_plain_number():
    assert parse_duration("90") == 90
    assert parse_duration(" 0 ") == 0


def test_invalid():
    for bad in ("", "h", "1x", "1.5h", "-3m", "1h 30"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_format_roundtrip():
    for n in (1, 59, 60, 3600, 5400, 86399):
        assert format_duration(n) in ("1s", "59s", "1m", "1h", "1h30m", "23h59m59s")


def test_seconds_unit():
    assert parse_duration("45s") == 45
    assert parse_duration("1m 5s") == 65


def test_days():
    assert parse_duration("2d") == 172800
    assert parse_duration("1d 1h 1m 1s") == 90061


def test_any_order_rejected():
    for bad in ("30m1h", "1s1m", "1h1h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
