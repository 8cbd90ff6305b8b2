"""The JSON nesting guard (server/jsondepth.py `json_depth`) against the nesting a real parse
finds, on random documents full of brackets, quotes and backslashes inside strings."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from palaestra.sdk.errors import InvalidActionError, TooLargeError
from palaestra.server.guards import check_json_depth
from palaestra.server.jsondepth import json_depth, json_shape, shape_by_passes, shape_by_scan

TEXT = ["a", "[", "]", "{", "}", '"', "\\", "\n", "\\\\", '\\"', "]]}}", "é"]


def parsed_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((parsed_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((parsed_depth(v) for v in value.values()), default=0)
    return 0


def document(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 8 or roll < 0.3:
        return rng.choice(["".join(rng.choices(TEXT, k=rng.randint(0, 6))), 1, None, 2.5])
    if roll < 0.65:
        return [document(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ("".join(rng.choices(TEXT, k=rng.randint(0, 4))) + str(i) for i in range(4))
    return {key: document(rng, depth + 1) for key in list(keys)[: rng.randint(0, 3)]}


def test_the_depth_is_the_parsed_depth_whatever_the_strings_hold() -> None:
    rng = random.Random(33)
    for _ in range(3000):
        value = document(rng)
        for raw in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
            assert json_depth(raw.encode()) == parsed_depth(value), raw


def test_brackets_in_strings_neither_hide_nor_fake_depth() -> None:
    hiding = json.dumps({"a": "]]]]]]]]" + '\\"' + "]]]]", "b": [[[[[[1]]]]]]}).encode()
    assert json_depth(hiding) == 7
    faking = json.dumps({"text": "[" * 500 + "{" * 500}).encode()
    assert json_depth(faking) == 1
    check_json_depth(faking, 8)  # passes: the brackets are text
    with pytest.raises(InvalidActionError) as refused:
        check_json_depth(b"[" * 100 + b"]" * 100, 64)
    assert refused.value.code == "too_deep"


def test_values_are_counted_outside_strings() -> None:
    assert json_shape(b"[0,0,0,0]") == (1, 5)  # an upper bound: the container and its commas
    assert json_shape(json.dumps({"a": ",,,,[" * 100, "b": [1, 2]}).encode()) == (2, 6)
    check_json_depth(b"[" + b"0," * 2000 + b"0]", 64, 5000)
    with pytest.raises(TooLargeError, match="max_json_values"):
        check_json_depth(b"[" + b"0," * 6000 + b"0]", 64, 5000)


def test_the_bytes_path_agrees_with_the_scan_on_any_text() -> None:
    """The path of few brackets (`shape_by_passes`) answers exactly what the vectorized scan
    does, or leaves it to the scan: on documents, and on random runs of the bytes that
    matter (escapes, unbalanced and mismatched brackets, unterminated strings)."""
    rng = random.Random(34)
    alphabet = ["[", "]", "{", "}", '"', "\\", ",", "a", "\\\\", '\\"', "[[", "]]"]
    texts = [json.dumps(document(rng)).encode() for _ in range(2000)]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(0, 40))).encode() for _ in range(5000)]
    answered = 0
    for raw in texts:
        quick = shape_by_passes(raw)
        if quick is not None:
            answered += 1
            assert quick == shape_by_scan(raw), raw
    assert answered > 2500  # it answers the common case itself
    deep = b"[" * 40 + b"]" * 40
    assert shape_by_passes(deep) is None and json_shape(deep) == (40, 80)
