"""`palaestra pack init`: a pack scaffold with working example tasks for a family.

Scaffolds exist for `echo` (directory, jsonl or generators form) and `coding` (directory
form: task.toml, instruction.md, verifier/tests.py, solution/solution.py). Each passes
`palaestra pack check` as written.
"""

from __future__ import annotations

import json
from pathlib import Path

from palaestra.server.packs.manifest import NAME_RE

FORMS = ("directory", "jsonl", "generators")
SCAFFOLDS = {"echo": FORMS, "coding": ("directory",)}


class ScaffoldError(ValueError):
    pass


PACK_TOML = """\
# {name}: see docs/writing-a-pack.md (the schema is docs/pack.schema.json).
name = "{name}"
version = "0.1.0"
description = "{description}"
license = "Apache-2.0"
families = ["{family}"]

[splits.train]
sealed = false

[splits.heldout]
sealed = true          # private fields and solutions never leave the server

[defaults]
expected_reward = 1.0  # the least the oracle must score on every task

[checks]
timeout_s = 60         # per episode of `palaestra pack check`
cheat_max_reward = 0.1
"""

GENERATORS_TOML = """
[generators.reverse]
module = "generators/reverse.py"
family = "echo"
domain = "{short}/reverse"
levels = [1, 2, 3]
# Seeds are drawn from each split's own range [first, end); ranges never overlap.
splits.train = {{ seeds = [0, 100000], count = 20 }}
splits.heldout = {{ seeds = [1000000, 1001000], count = 5 }}
"""

REVERSE_GENERATOR = '''\
"""Procedural echo tasks: reverse a random word; longer words at higher levels."""

from __future__ import annotations

import random
import string


def generate(seed: int, index: int, level: int) -> dict:
    rng = random.Random(seed)
    while True:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(3 + 2 * level))
        if word != word[::-1]:
            break
    return {
        "public": {"instruction": f"Submit the word '{word}' in reverse order of its letters."},
        "private": {"answer": word[::-1]},
    }
'''

ECHO_WORDS = (("train", "lantern"), ("train", "meadow"), ("heldout", "quartz"))

CODING_TASKS = {
    "add-numbers": {
        "split": "train",
        "entry_point": "add",
        "prompt": '''def add(a: int, b: int) -> int:
    """Return the sum of a and b.

    >>> add(2, 3)
    5
    """
''',
        "instruction": "Implement `add(a, b)`: return the sum of the two integers.\n",
        "tests": """def check(candidate):
    assert candidate(-1, 1) == 0
    assert candidate(0, 0) == 0
    assert candidate(10, 32) == 42
    assert candidate(-7, -8) == -15
    assert candidate(123456789, 987654321) == 1111111110
""",
        "solution": '''def add(a: int, b: int) -> int:
    """Return the sum of a and b."""
    return a + b
''',
    },
    "count-vowels": {
        "split": "heldout",
        "entry_point": "count_vowels",
        "prompt": '''def count_vowels(text: str) -> int:
    """Count the vowels (a, e, i, o, u, either case) in text.

    >>> count_vowels("banana")
    3
    """
''',
        "instruction": "Implement `count_vowels(text)`: how many of its letters are vowels.\n",
        "tests": """def check(candidate):
    assert candidate("") == 0
    assert candidate("rhythm") == 0
    assert candidate("AEIOU") == 5
    assert candidate("Hello, World") == 3
    assert candidate("queueing") == 5
""",
        "solution": '''def count_vowels(text: str) -> int:
    """Count the vowels (a, e, i, o, u, either case) in text."""
    return sum(ch in "aeiouAEIOU" for ch in text)
''',
    },
}


def _toml_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def _echo_task(word: str, split: str, short: str) -> dict[str, object]:
    return {
        "id": f"reverse-{word}",
        "family": "echo",
        "domain": f"{short}/reverse",
        "split": split,
        "difficulty": "easy",
        "public": {"instruction": f"Submit the word '{word}' in reverse order of its letters."},
        "private": {"answer": word[::-1]},
    }


def scaffold(root: Path, *, name: str, family: str, form: str = "directory") -> list[Path]:
    """Write the scaffold; returns the files written. Refuses a non-empty directory."""
    if not NAME_RE.match(name):
        raise ScaffoldError(f"--name must look like 'org/name' (lowercase), got {name!r}")
    if family not in SCAFFOLDS:
        raise ScaffoldError(
            f"no scaffold for family {family!r}; there are scaffolds for {sorted(SCAFFOLDS)}: "
            "start from one (e.g. --family echo --form jsonl), then set `families` in "
            "pack.toml to yours and replace the tasks (docs/writing-a-pack.md, step 5)"
        )
    if form not in SCAFFOLDS[family]:
        raise ScaffoldError(f"the {family} scaffold comes in forms {list(SCAFFOLDS[family])}")
    if root.exists() and any(root.iterdir()):
        raise ScaffoldError(f"{root} exists and is not empty; pick a new directory")
    short = name.split("/")[1]
    files: dict[str, str] = {}
    description = f"Example {family} tasks ({form} form)."
    files["pack.toml"] = PACK_TOML.format(name=name, description=description, family=family)
    if family == "echo" and form == "generators":
        files["pack.toml"] += GENERATORS_TOML.format(short=short)
        files["generators/reverse.py"] = REVERSE_GENERATOR
    elif family == "echo" and form == "jsonl":
        files["tasks.jsonl"] = "".join(
            json.dumps(_echo_task(word, split, short)) + "\n" for split, word in ECHO_WORDS
        )
    elif family == "echo":
        for split, word in ECHO_WORDS:
            task = _echo_task(word, split, short)
            base = f"tasks/{task['id']}"
            files[f"{base}/task.toml"] = (
                f'family = "echo"\ndomain = "{short}/reverse"\nsplit = "{split}"\n'
                f'difficulty = "easy"\n\n[private]\nanswer = {_toml_str(word[::-1])}\n'
            )
            files[f"{base}/instruction.md"] = (
                f"Submit the word '{word}' in reverse order of its letters.\n"
            )
    else:
        for task_id, spec in CODING_TASKS.items():
            base = f"tasks/{task_id}"
            files[f"{base}/task.toml"] = (
                f'family = "coding"\ndomain = "{short}/python-function"\n'
                f'split = "{spec["split"]}"\ndifficulty = "easy"\n\n[public]\n'
                f'entry_point = "{spec["entry_point"]}"\n'
                f"prompt = '''\n{spec['prompt']}'''\n"
            )
            files[f"{base}/instruction.md"] = spec["instruction"]
            files[f"{base}/verifier/tests.py"] = spec["tests"]
            files[f"{base}/solution/solution.py"] = spec["solution"]
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
