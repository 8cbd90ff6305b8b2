import copy
import random

from intervals.merge import merge, total_length


def expected(intervals):
    """Sort, then sweep: the docstring's definition, independently written."""
    if not intervals:
        return []
    ivs = sorted([list(iv) for iv in intervals])
    out = [ivs[0][:]]
    for s, e in ivs[1:]:
        if s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def test_against_brute_force():
    rng = random.Random(12)
    for _ in range(300):
        data = []
        for _ in range(rng.randint(0, 8)):
            s = rng.randint(-20, 20)
            data.append([s, s + rng.randint(0, 6)])
        before = copy.deepcopy(data)
        got = merge(data)
        assert data == before
        assert got == expected(data)
        covered = {x for s, e in data for x in range(s, e + 1)}
        assert total_length(data) == len(covered)
