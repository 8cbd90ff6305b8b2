import pytest

from cachelib.lru import LRUCache


def test_put_get():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1
    assert c.get("zz") is None
    assert c.get("zz", 7) == 7


def test_evicts_oldest_without_access():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("c", 3)
    assert "a" not in c and c.get("b") == 2 and c.get("c") == 3


def test_len_and_contains():
    c = LRUCache(3)
    for k in "abcd":
        c.put(k, k.upper())
    assert len(c) == 3 and "d" in c and "a" not in c


def test_bad_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_get_refreshes_recency():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert "a" in c and "b" not in c


def test_put_existing_refreshes_and_updates():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    c.put("c", 3)
    assert c.get("a") == 10 and "b" not in c and len(c) == 2
