import copy

import pytest

from envconf.loader import load


def test_all_types():
    defaults = {"on": True, "off": False, "n": 1, "x": 1.0, "tags": [], "s": "", "deep": {"a": 1}}
    env = {"APP_ON": " False", "APP_OFF": "Yes", "APP_N": "-4", "APP_X": "2.5",
           "APP_TAGS": " , red,green ,, ", "APP_S": " keep spaces "}
    before_d, before_e = copy.deepcopy(defaults), dict(env)
    got = load(defaults, env)
    assert got == {"on": False, "off": True, "n": -4, "x": 2.5, "tags": ["red", "green"],
                   "s": " keep spaces ", "deep": {"a": 1}}
    assert defaults == before_d and env == before_e
    assert load({"tags": ["a"]}, {"APP_TAGS": ""})["tags"] == []
    assert load({"flag": True}, {"CFG_FLAG": "no"}, prefix="CFG_")["flag"] is False
    for bad in ("", "2", "truthy"):
        with pytest.raises(ValueError):
            load({"flag": True}, {"APP_FLAG": bad})
    with pytest.raises(ValueError):
        load({"n": 1}, {"APP_N": "one"})
