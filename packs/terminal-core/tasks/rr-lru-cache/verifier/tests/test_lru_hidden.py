import random
from collections import OrderedDict

from cachelib.lru import LRUCache


def test_long_sequence():
    rng = random.Random(9)
    cache, model = LRUCache(5), OrderedDict()
    for _ in range(3000):
        key = rng.randrange(12)
        if rng.random() < 0.5:
            got = cache.get(key, "missing")
            want = model.get(key, "missing")
            if key in model:
                model.move_to_end(key)
            assert got == want
        else:
            value = rng.random()
            cache.put(key, value)
            model[key] = value
            model.move_to_end(key)
            if len(model) > 5:
                model.popitem(last=False)
        assert len(cache) == len(model)
        assert all(k in cache for k in model)
