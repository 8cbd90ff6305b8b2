"""Tasks of the reasoning/gym pack: reasoning-gym's procedural datasets, one domain each.

Every dataset the installed reasoning-gym registers becomes the domain `reasoning/<name>`,
unless it is listed in SKIP (whole dataset) or SKIP_LEVELS (one level) below, or fails the
build-time checks (an entry that cannot be generated, an answer that is not a string, the
reference answer not scoring 1.0 with the dataset's own scorer):
those are left out and logged. README.md lists what is left out and why.

Seeds: a task is entry `index` of the dataset built with `seed` and `size`; reasoning-gym
draws entry i from seed + i (`item_seed`). Training tasks use item seeds in
[0, HELDOUT_SEED_START); held-out ones in [HELDOUT_SEED_START, 2**31). A trainer that
generates more training problems must stay below HELDOUT_SEED_START.

Generating the ~1,900 tasks takes ~10-20 s, so the tasks are cached as JSON lines under
`$PALAESTRA_CACHE` (default `~/.cache/palaestra`)/packs/, keyed by the reasoning-gym
version and the bytes of this file and of the family's generator module; a server start
with a warm cache reads the file and never imports reasoning-gym.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from palaestra.envs.reasoning import gym

log = logging.getLogger(__name__)

TRAIN_PER_DOMAIN = 12
HELDOUT_PER_DOMAIN = 6
HELDOUT_SEED_START = 2**30
SPLIT_SEED_BASE = {"train": 0, "heldout": HELDOUT_SEED_START}
LEVEL_SEED_STRIDE = 1_000_000  # each level's seeds start at base + slot * stride

SKIP: dict[str, str] = {
    "composite": "a mixture of other datasets (needs a list of datasets), not a dataset itself",
    "boxnet": "no reference answer (entry answer is None; the scorer checks a plan)",
    "graph_color": "no reference answer (entry answer is None; the scorer checks a colouring)",
    "propositional_logic": "no reference answer (entry answer is None)",
    "rubiks_cube": "no reference answer (entry answer is None; the scorer simulates moves)",
    "rush_hour": "no reference answer (entry answer is None; the scorer simulates moves)",
}
SKIP_LEVELS: dict[tuple[str, str], str] = {
    ("caesar_cipher", "hard"): "config invalid (rotation must be in range [1,25])",
    ("modulo_grid", "medium"): "config invalid (max_target must be greater than 0)",
    ("survo", "hard"): "config invalid (max_empty must be <= 9)",
    ("jugs", "medium"): "reference answer scores 0 on some entries",
    ("jugs", "hard"): "generation does not finish (> 20 s an entry)",
    ("sokoban", "easy"): "generation does not finish (> 20 s an entry)",
    ("number_sequence", "medium"): "slow generation (~0.5 s an entry)",
    ("number_sequence", "hard"): "generation does not finish (> 20 s an entry)",
    ("bf", "hard"): "slow generation (~0.5 s an entry)",
}
# Curriculum datasets whose curriculum configs are all invalid: served at their defaults.
DEFAULT_ONLY = {
    "arc_agi": "curriculum config fails (AttributeError in the generated config)",
    "rearc": "curriculum config fails (AttributeError in the generated config)",
    "knight_swap": "curriculum config fails (min_nodes must be >= 6)",
}


def json_safe(value: Any) -> Any:
    """Metadata as plain JSON: tuples and sets become lists, numpy scalars numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v) for v in value), key=repr)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    return str(value)


def levels(name: str) -> list[str]:
    if name in DEFAULT_ONLY:
        return [gym.DEFAULT_LEVEL]
    return [lv for lv in gym.levels_of(name) if (name, lv) not in SKIP_LEVELS]


def _domain_tasks(name: str, problems: dict[str, str]) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    chosen = levels(name)
    for split, count in (("train", TRAIN_PER_DOMAIN), ("heldout", HELDOUT_PER_DOMAIN)):
        for slot, level in enumerate(chosen):
            # `count` spread over the levels, the first levels taking the remainder.
            size = count // len(chosen) + (slot < count % len(chosen))
            seed = SPLIT_SEED_BASE[split] + slot * LEVEL_SEED_STRIDE
            try:
                ds = gym.dataset(name, level, seed, size)
                for index in range(size):
                    entry = gym.entry(name, level, seed, size, index)
                    answer = entry["answer"]
                    if not isinstance(answer, str):
                        raise ValueError(f"answer is {type(answer).__name__}, not str")
                    if ds.score_answer(answer=answer, entry=entry) != 1.0:
                        raise ValueError(f"reference answer does not score 1.0 (index {index})")
                    tasks.append(
                        {
                            "id": f"{name}.{level}.{seed + index}",
                            "family": "reasoning",
                            "domain": f"reasoning/{name}",
                            "split": split,
                            "difficulty": level,
                            "public": {"question": entry["question"], "dataset": name},
                            "private": {
                                "dataset": name,
                                "level": level,
                                "seed": seed,
                                "size": size,
                                "index": index,
                                "item_seed": seed + index,
                                "answer": answer,
                                "metadata": json_safe(entry.get("metadata", {})),
                            },
                        }
                    )
            except Exception as exc:
                problems[f"{name}/{level}"] = f"{type(exc).__name__}: {exc}"[:200]
                tasks = [t for t in tasks if t["private"]["level"] != level]
                chosen_left = [lv for lv in chosen if f"{name}/{lv}" not in problems]
                if not chosen_left:
                    return []
    return tasks


def build(problems: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Generate every task (slow: imports reasoning-gym and generates each entry)."""
    problems = {} if problems is None else problems
    tasks: list[dict[str, Any]] = []
    for name in gym.dataset_names():
        if name in SKIP:
            continue
        domain = _domain_tasks(name, problems)
        # A small problem space can draw the same question from both ranges: held out, never.
        train = {t["public"]["question"] for t in domain if t["split"] == "train"}
        tasks.extend(
            t for t in domain if t["split"] == "train" or t["public"]["question"] not in train
        )
    for where, why in sorted(problems.items()):
        log.warning("reasoning/gym: left out %s: %s", where, why)
    return tasks


def cache_key() -> str:
    h = hashlib.sha256(gym.rg_version().encode() + b"\0")
    for path in (Path(__file__), Path(gym.__file__)):
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:24]


def cache_path() -> Path:
    base = os.environ.get("PALAESTRA_CACHE") or Path.home() / ".cache" / "palaestra"
    return Path(base) / "packs" / f"reasoning-gym-{cache_key()}.jsonl"


def load_tasks() -> Iterator[dict[str, Any]]:
    path = cache_path()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        tasks = [json.loads(line) for line in lines]
        if tasks and tasks[-1].get("end") == len(tasks) - 1:
            yield from tasks[:-1]
            return
        log.warning("reasoning/gym: cache %s is incomplete; rebuilding", path)
    except (OSError, ValueError):
        pass
    tasks = build()
    for stale in path.parent.glob("reasoning-gym-*.jsonl"):
        stale.unlink(missing_ok=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with tmp.open("w", encoding="utf-8") as out:
            for task in tasks:
                out.write(json.dumps(task, ensure_ascii=False, allow_nan=False) + "\n")
            out.write(json.dumps({"end": len(tasks)}) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("reasoning/gym: cannot write the task cache %s: %s", path, exc)
    yield from tasks
