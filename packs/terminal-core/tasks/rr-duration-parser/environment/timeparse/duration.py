"""Durations such as "1h30m" or "2d 4h 5s".

A duration is either a plain non-negative integer (seconds) or a sequence of
`<integer><unit>` parts with units d (days), h (hours), m (minutes) and s (seconds), in that
order (largest first), each unit at most once, optionally separated by spaces.
Anything else raises ValueError.
"""
import re

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)([hm])")


def parse_duration(text: str) -> int:
    """The number of seconds in `text`."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    compact = text.replace(" ", "")
    parts = _PART.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(n) * UNITS[u] for n, u in parts)


def format_duration(seconds: int) -> str:
    """The shortest form parse_duration reads back: 5400 -> "1h30m", 0 -> "0s"."""
    if seconds == 0:
        return "0s"
    out = []
    for unit, size in UNITS.items():
        if seconds >= size:
            out.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(out)
