import functools
import random

from semverlib.version import compare

ORDER = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
         "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "1.10.0", "2.0.0-0",
         "2.0.0-9", "2.0.0-10", "2.0.0-a", "2.0.0"]


def test_spec_order():
    shuffled = ORDER[:]
    random.Random(4).shuffle(shuffled)
    assert sorted(shuffled, key=functools.cmp_to_key(compare)) == ORDER
    for a in ORDER:
        for b in ORDER:
            assert compare(a, b) == -compare(b, a)
