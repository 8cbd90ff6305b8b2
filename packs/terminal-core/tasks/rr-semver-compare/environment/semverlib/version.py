"""Compare semantic versions (semver.org, section 11).

A version is MAJOR.MINOR.PATCH with an optional -PRERELEASE (dot-separated identifiers of
[0-9A-Za-z-]) and an optional +BUILD, which is ignored when comparing. Precedence:

1. MAJOR, MINOR and PATCH are compared numerically, in that order;
2. when they are equal, a version with a pre-release sorts before the same version without
   one (1.0.0-alpha < 1.0.0);
3. two pre-releases are compared identifier by identifier, left to right: identifiers made
   only of digits compare numerically, others in ASCII order, and a numeric identifier sorts
   before a non-numeric one; if all shared identifiers are equal, the one with fewer
   identifiers sorts first.
"""
import functools
import re

_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


def _parse(version: str):
    m = _RE.match(version)
    if not m:
        raise ValueError(f"not a semantic version: {version!r}")
    return m.groups()


def compare(a: str, b: str) -> int:
    """-1 if a < b, 0 if they have the same precedence, 1 if a > b."""
    ka, kb = _parse(a), _parse(b)
    ka = tuple(x or "" for x in ka)
    kb = tuple(x or "" for x in kb)
    return (ka > kb) - (ka < kb)


def latest(versions):
    """The version with the highest precedence."""
    return max(versions, key=functools.cmp_to_key(compare))
