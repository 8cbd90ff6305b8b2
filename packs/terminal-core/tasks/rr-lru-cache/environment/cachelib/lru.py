"""A least-recently-used cache.

`get(key)` and `put(key, value)` both count as a use of `key`. When `put` adds a new key to a
full cache, the least recently used key is evicted first. `get` of a missing key returns
`default` (and is not a use of anything).
"""


class LRUCache:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data: dict = {}
        self._order: list = []  # least recently used first

    def get(self, key, default=None):
        if key not in self._data:
            return default
        return self._data[key]

    def put(self, key, value) -> None:
        if key in self._data:
            self._data[key] = value
            return
        if len(self._data) >= self.capacity:
            oldest = self._order.pop(0)
            del self._data[oldest]
        self._data[key] = value
        self._order.append(key)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key) -> bool:
        return key in self._data
