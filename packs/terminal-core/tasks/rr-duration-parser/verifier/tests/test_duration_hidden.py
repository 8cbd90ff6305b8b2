import pytest

from timeparse.duration import format_duration, parse_duration


def test_full():
    assert parse_duration("3d4h") == 273600
    assert parse_duration("10m 0s") == 600
    assert parse_duration(" 7d ") == 604800
    for n in (0, 1, 61, 3601, 90061, 10**6):
        assert parse_duration(format_duration(n)) == n
    for bad in ("1d1d", "5s 1d", "1 h", "d1"):
        with pytest.raises(ValueError):
            parse_duration(bad)
