"""Tasks of the reasoning/gym pack: reasoning-gym's procedural datasets, one domain each.

Every dataset the installed reasoning-gym registers becomes the domain `reasoning/<name>`,
unless it is listed in SKIP (whole dataset) or SKIP_LEVELS (one level) below, or fails the
build-time checks (an entry that cannot be generated, an answer that is not a string, the
reference answer not scoring 1.0 with the dataset's own scorer):
those are left out and logged. README.md lists what is left out and why.

Seeds: a task is entry `index` of the dataset built with `seed` and `size`; reasoning-gym
draws entry i from seed + i (`item_seed`). Training tasks use item seeds in
[0, HELDOUT_SEED_START); held-out ones in [HELDOUT_SEED_START, 2**31). A trainer that
generates more training problems must stay below HELDOUT_SEED_START. On a server, each
held-out (dataset, level) starts at a seed derived from the server's held-out secret
(`load_tasks(secret=...)`, server/heldout.py), and held-out ids name no seed: the public code
and a task id do not give its answer.

Generating the ~1,900 tasks takes ~10-20 s, so the tasks are cached as JSON lines under
`$PALAESTRA_CACHE` (default `~/.cache/palaestra`)/packs/, keyed by the reasoning-gym
version and the bytes of this file, of pack.toml (its version) and of the family's modules
that pick the tasks (gym, canon, skew); a server start
with a warm cache reads the file and never imports reasoning-gym.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from palaestra.envs.reasoning import canon, gym, skew
from palaestra.server.packs.gencache import NotCached

log = logging.getLogger(__name__)
Progress = Callable[[int, int, str], None]  # (done, total, unit)

TRAIN_PER_DOMAIN = 12
HELDOUT_PER_DOMAIN = 6
HELDOUT_SEED_START = 2**30
SPLIT_SEED_BASE = {"train": 0, "heldout": HELDOUT_SEED_START}
LEVEL_SEED_STRIDE = 1_000_000  # each level's seeds start at base + slot * stride
# Each level's tasks are drawn from a pool this many times its size, the least-used answer
# first over the domain, so that no constant answer earns more than its share
# (envs/reasoning/skew.py: ≤ 1/k + 0.05 for k answers, 1/n + 0.05 where answers are
# open-ended). A level whose first SPREAD * size entries give `size` answers the domain
# lacks reads no more (most domains); any other reads its whole pool and takes the answers
# the domain's pools give least often first (balanced_indices).
POOL = 64
SPREAD = 2
# Datasets whose generation is too slow to read a whole pool: their levels read the first
# SHALLOW_POOL * size entries of it.
SHALLOW: dict[str, str] = {
    "zebra_puzzles": "~50 ms an entry (its answers, 2-4 names, all show in the first entries)",
}
SHALLOW_POOL = 16

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
    # Null-information play (envs/reasoning/skew.py): levels where one constant answer is
    # right on most tasks however they are drawn.
    ("game_of_life", "medium"): "the board always dies (10 cells on 25x25, 2 steps): every "
    "answer is the dead board",
    ("game_of_life", "hard"): "the board always dies: every answer is the dead board",
    ("game_of_life_halting", "hard"): "the question shows the 50x50 board cut by numpy "
    "('...'): every entry asks the same question, with either answer",
    ("n_queens", "easy"): "4x4 has 2 solutions: one constant board solves half the tasks",
    ("n_queens", "medium"): "6x6 has 4 solutions: one constant board solves a quarter or more",
}
# Entries that may be drawn at all. n_queens: a puzzle with one solution (with many queens
# removed, any of the 92 8x8 boards, so one constant board solved a third of the tasks).
ADMIT: dict[str, Callable[[dict[str, Any]], bool]] = {
    "n_queens": lambda entry: len(entry["metadata"].get("valid_answers") or ()) == 1,
}
# Scorers that check a plan or a placement rather than compare with the answer: one task's
# answer can solve another (jugs: the same jugs and target; sokoban: a long walk that pushes
# every box home), so no task is drawn that an answer the domain already has solves.
PLAN_SCORERS = frozenset({"jugs", "sokoban", "n_queens"})
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


def split_seed(
    split: str, name: str, level: str, slot: int, size: int, secret: bytes | None
) -> int:
    """The dataset seed of one (split, dataset, level): public for train (and for held-out
    without a server secret), else an HMAC of the server's secret inside the held-out range,
    which nobody without the secret can compute from this file and a task id."""
    if split == "train" or secret is None:
        return SPLIT_SEED_BASE[split] + slot * LEVEL_SEED_STRIDE
    label = f"reasoning/gym/{split}/{name}/{level}".encode()
    digest = hmac.new(secret, label, hashlib.sha256).digest()
    span = 2**31 - HELDOUT_SEED_START - size
    return HELDOUT_SEED_START + int.from_bytes(digest[:8], "big") % span


class Drawn:
    """What a domain's tasks drawn so far hold: answer key -> tasks, their questions and
    answers, (level, seed, size, index) of each, and answer key -> entries of the pools
    read whole (`seen`, balanced_indices). (A plain class: the pack loader and
    tests exec this file without registering it as a module, which dataclasses need.)"""

    def __init__(
        self,
        counts: dict[str, int] | None = None,
        questions: set[str] | None = None,
        answers: list[str] | None = None,
        refs: list[tuple[str, int, int, int]] | None = None,
        seen: Counter[str] | None = None,
    ) -> None:
        self.counts = counts or {}
        self.questions = questions or set()
        self.answers = answers or []
        self.refs = refs or []
        self.seen = seen or Counter()

    def add(self, question: str, answer: str, ref: tuple[str, int, int, int] | None = None) -> None:
        key = skew.answer_key(answer)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.questions.add(question)
        self.answers.append(answer)
        if ref is not None:
            self.refs.append(ref)

    def restore(self, saved: Drawn) -> None:
        self.counts, self.questions = saved.counts, saved.questions
        self.answers, self.refs, self.seen = saved.answers, saved.refs, saved.seen

    def copy(self) -> Drawn:
        return Drawn(
            dict(self.counts),
            set(self.questions),
            list(self.answers),
            list(self.refs),
            Counter(self.seen),
        )


def solved_by_drawn(name: str, level: str, seed: int, pool: int, index: int, drawn: Drawn) -> bool:
    """A plan-checking scorer (PLAN_SCORERS) accepts an answer the domain already has on
    this entry, or this entry's answer on a task the domain already has."""
    if name not in PLAN_SCORERS:
        return False
    mine = str(gym.entry(name, level, seed, pool, index)["answer"])
    checks = [((level, seed, pool, index), answer) for answer in drawn.answers]
    checks += [(ref, mine) for ref in drawn.refs]
    for (lv, sd, size, i), answer in checks:
        try:
            if gym.score(name, lv, sd, size, i, answer) >= 1.0:
                return True
        except Exception:  # the scorer cannot read that answer there: it does not solve it
            continue
    return False


def admitted(name: str, entry: dict[str, Any]) -> bool:
    """Whether an entry may be drawn at all (ADMIT)."""
    rule = ADMIT.get(name)
    return rule is None or rule(entry)


def _fresh_key(name: str, level: str, seed: int, pool: int, index: int, drawn: Drawn) -> str | None:
    """The entry's answer key, or None when it may not be drawn (not admitted, a question
    the domain already asks, or one its generator fails to make: tsumego's "Failed to
    generate a capture problem" at some indices, which a pool read whole meets)."""
    try:
        entry = gym.entry(name, level, seed, pool, index)
    except Exception:  # the dataset's own generator: any error means "not this entry"
        return None
    if entry["question"] in drawn.questions or not admitted(name, entry):
        return None
    return skew.answer_key(str(entry["answer"]))


def _passes(
    name: str, level: str, seed: int, pool: int, size: int, drawn: Drawn, order: Iterable[int]
) -> tuple[list[int], int]:
    """(indices taken, the last pass): pass t reads the pool in `order` and takes each entry
    whose answer has at most t tasks in the domain so far (`drawn`, updated), until `size`."""
    order = list(order) if not isinstance(order, range) else order
    keys: dict[int, str | None] = {}  # None: not admitted, or a question already asked
    chosen: list[int] = []
    most = 0
    while len(chosen) < size and most <= size + max(drawn.counts.values(), default=0):
        for index in order:
            if index not in keys:
                keys[index] = _fresh_key(name, level, seed, pool, index, drawn)
            key = keys[index]
            if key is None or drawn.counts.get(key, 0) > most:
                continue
            entry = gym.entry(name, level, seed, pool, index)
            if entry["question"] in drawn.questions or solved_by_drawn(
                name, level, seed, pool, index, drawn
            ):  # a twin taken in this pass, or solved by an answer the domain has
                keys[index] = None
                continue
            chosen.append(index)
            keys[index] = None
            drawn.add(entry["question"], str(entry["answer"]), (level, seed, pool, index))
            if len(chosen) == size:
                return chosen, most
        most += 1
    return chosen, most


def rarest_first(name: str, level: str, seed: int, pool: int, size: int, drawn: Drawn) -> list[int]:
    """The pool's drawable indices (of a SHALLOW dataset, the first SHALLOW_POOL * size), those
    whose answer the domain's pools read so far give least often first (ties in index
    order). The answers read are added to `drawn.seen`."""
    reach = min(pool, SHALLOW_POOL * size) if name in SHALLOW else pool
    keys = {i: _fresh_key(name, level, seed, pool, i, drawn) for i in range(reach)}
    drawn.seen.update(key for key in keys.values() if key is not None)
    drawable = [i for i, key in keys.items() if key is not None]
    return sorted(drawable, key=lambda i: (drawn.seen[keys[i]], i))


def balanced_indices(
    name: str, level: str, seed: int, pool: int, size: int, drawn: Drawn
) -> list[int]:
    """`size` entry indices of the pool (seed, pool) whose answers are the least used so
    far in the domain (`drawn`, updated), none asking a question the domain already asks.

    Passes over the pool (`_passes`): pass t takes each admitted entry whose answer (by
    skew.answer_key) has at most t tasks so far, until `size` are taken; a constant answer
    then holds about n/k of a domain's n tasks when its pools have k answers. The passes
    read the pool lazily in index order, and a level whose first SPREAD * size entries give
    `size` answers the domain lacks (most domains: answers rarely repeat) stops there.
    Otherwise the domain's answers come from a small set, and from then on (this level, its
    later levels and the held-out draw) each pool is read whole and the passes take first
    the answers the domain's pools give least often: a rare answer is drawn while a level
    can give it, and common ones are left to the levels and the held-out draw that come
    later (largest_island's easy grids give 5-10 cells, 6 in 1% of them, and its hard ones
    10 as rarely). Deterministic for a seed. A pool with fewer new questions than `size`
    gives what it has."""
    if not drawn.seen:
        before = drawn.copy()
        chosen, last = _passes(name, level, seed, pool, size, drawn, range(SPREAD * size))
        if len(chosen) == size and last == 0 and max(chosen) < SPREAD * size:
            return sorted(chosen)
        drawn.restore(before)
    order = rarest_first(name, level, seed, pool, size, drawn)
    chosen, _ = _passes(name, level, seed, pool, size, drawn, order)
    if not chosen:
        raise ValueError(f"the pool of {pool} entries has no question the domain lacks")
    return sorted(chosen)  # a small problem space: fewer tasks than asked


def _split_tasks(
    name: str,
    split: str,
    chosen: list[str],
    problems: dict[str, str],
    secret: bytes | None = None,
    drawn: Drawn | None = None,
) -> list[dict[str, Any]]:
    """One split's tasks of dataset `name` over the levels `chosen`; a level that fails is
    left out (and recorded in `problems`). Held-out ids name no seed (`<name>.<level>.h<i>`).
    `drawn` (the domain's tasks so far; updated): the training split's when drawing the
    held-out one, so that both together stay balanced and share no question."""
    tasks: list[dict[str, Any]] = []
    count = TRAIN_PER_DOMAIN if split == "train" else HELDOUT_PER_DOMAIN
    drawn = Drawn() if drawn is None else drawn
    for slot, level in enumerate(chosen):
        # `count` spread over the levels, the first levels taking the remainder.
        size = count // len(chosen) + (slot < count % len(chosen))
        pool = size * POOL
        seed = split_seed(split, name, level, slot, pool, secret)
        mine: list[dict[str, Any]] = []
        before = drawn.copy()
        try:
            indices = _scoring_draw(name, level, seed, pool, size, drawn)
            for ordinal, index in enumerate(indices):
                entry = gym.entry(name, level, seed, pool, index)
                answer = entry["answer"]
                tail = str(seed + index) if split == "train" else f"h{ordinal}"
                mine.append(
                    {
                        "id": f"{name}.{level}.{tail}",
                        "family": "reasoning",
                        "domain": f"reasoning/{name}",
                        "split": split,
                        "difficulty": level,
                        "public": {"question": entry["question"], "dataset": name},
                        "private": {
                            "dataset": name,
                            "level": level,
                            "seed": seed,
                            "size": pool,
                            "index": index,
                            "item_seed": seed + index,
                            "answer": answer,
                            "metadata": json_safe(entry.get("metadata", {})),
                        },
                    }
                )
        except Exception as exc:
            drawn.restore(before)  # the level is left out
            where = f"{name}/{level}" if split == "train" else f"{name}/{level} ({split})"
            problems[where] = (
                f"{type(exc).__name__}: {exc}"[:200] if split == "train" else type(exc).__name__
            )
            continue
        tasks.extend(mine)
    return tasks


REDRAWS = 8  # draws of a level that may meet entries whose own answer does not score 1.0


def _scoring_draw(
    name: str, level: str, seed: int, pool: int, size: int, drawn: Drawn
) -> list[int]:
    """balanced_indices, drawn again without the entries whose reference answer is not a
    string scoring 1.0 (tsumego's scorer refuses some of its own answers): the rarest-first
    order reaches deep into a pool, so one such entry must not cost the level its tasks."""
    ds = gym.dataset(name, level, seed, pool)
    start, excluded = drawn.copy(), set[str]()
    for _ in range(REDRAWS):
        drawn.restore(start.copy())
        drawn.questions |= excluded
        indices = balanced_indices(name, level, seed, pool, size, drawn)
        bad = set()
        for index in indices:
            entry = gym.entry(name, level, seed, pool, index)
            answer = entry["answer"]
            if not isinstance(answer, str) or ds.score_answer(answer=answer, entry=entry) != 1.0:
                bad.add(entry["question"])
        if not bad:
            return indices
        excluded |= bad
    raise ValueError(f"{len(excluded)} drawn entries' own answers do not score 1.0")


def build_train(
    problems: dict[str, str] | None = None, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """Every training task (slow: imports reasoning-gym and generates each entry);
    `progress(done, total, unit)` after each dataset."""
    problems = {} if problems is None else problems
    tasks: list[dict[str, Any]] = []
    names = [name for name in gym.dataset_names() if name not in SKIP]
    for done, name in enumerate(names, 1):
        tasks.extend(_split_tasks(name, "train", levels(name), problems))
        if progress is not None:
            progress(done, len(names), "train datasets")
    mark_common(tasks, tasks)
    _report(problems)
    return tasks


def mark_common(tasks: list[dict[str, Any]], train: list[dict[str, Any]]) -> None:
    """Give every task its domain's most common training answers (`common_answers`, private):
    the family plays them as constants (null-information play, envs/reasoning/cheats.py)."""
    answers: dict[str, list[str]] = {}
    for t in train:
        answers.setdefault(t["domain"], []).append(t["private"]["answer"])
    common = {domain: skew.common_answers(xs) for domain, xs in answers.items()}
    for t in tasks:
        t["private"]["common_answers"] = common.get(t["domain"], [])


def build_heldout(
    train: list[dict[str, Any]],
    secret: bytes | None,
    problems: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """The held-out tasks of the levels `train` has, none asking a training question."""
    problems = {} if problems is None else problems
    served: dict[str, set[str]] = {}
    questions: dict[str, set[str]] = {}
    drawn: dict[str, Drawn] = {}  # dataset -> its training tasks
    for t in train:
        name = t["private"]["dataset"]
        served.setdefault(name, set()).add(t["private"]["level"])
        questions.setdefault(name, set()).add(t["public"]["question"])
        p = t["private"]
        ref = (p["level"], p["seed"], p["size"], p["index"])
        drawn.setdefault(name, Drawn()).add(t["public"]["question"], p["answer"], ref)
    tasks: list[dict[str, Any]] = []
    for done, name in enumerate(sorted(served), 1):
        chosen = [lv for lv in levels(name) if lv in served[name]]
        held = _split_tasks(name, "heldout", chosen, problems, secret, drawn[name])
        # A small problem space can draw the same question from both ranges: held out, never.
        tasks.extend(t for t in held if t["public"]["question"] not in questions[name])
        if progress is not None:
            progress(done, len(served), "held-out datasets")
    mark_common(tasks, train)
    _report(problems)
    return tasks


def build(problems: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every task with public seeds (no server secret)."""
    train = build_train(problems)
    return train + build_heldout(train, None, problems)


def _report(problems: dict[str, str]) -> None:
    for where, why in sorted(problems.items()):
        log.warning("reasoning/gym: left out %s: %s", where, why)


def cache_key() -> str:
    h = hashlib.sha256(gym.rg_version().encode() + b"\0")
    here = Path(__file__)
    for path in (
        here,
        here.with_name("pack.toml"),
        *(Path(m.__file__) for m in (gym, canon, skew)),
    ):
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:24]


def cache_path(part: str = "train") -> Path:
    base = os.environ.get("PALAESTRA_CACHE") or Path.home() / ".cache" / "palaestra"
    return Path(base) / "packs" / f"reasoning-gym-{cache_key()}-{part}.jsonl"


def secret_fingerprint(secret: bytes | None) -> str:
    """Names the held-out cache of one secret without revealing it."""
    if secret is None:
        return "public"
    return hmac.new(secret, b"reasoning/gym cache", hashlib.sha256).hexdigest()[:16]


def _read_cache(path: Path) -> list[dict[str, Any]] | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        tasks = [json.loads(line) for line in lines]
    except (OSError, ValueError):
        return None
    if tasks and tasks[-1].get("end") == len(tasks) - 1:
        return tasks[:-1]
    log.warning("reasoning/gym: cache %s is incomplete; rebuilding", path)
    return None


def _write_cache(path: Path, tasks: list[dict[str, Any]], private: bool) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for task in tasks:
                out.write(json.dumps(task, ensure_ascii=False, allow_nan=False) + "\n")
            out.write(json.dumps({"end": len(tasks)}) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("reasoning/gym: cannot write the task cache %s: %s", path, exc)


STALE_AFTER_S = 7 * 86400  # another key's cache unused this long is deleted


def _drop_stale(folder: Path, prefix: str) -> None:
    """Delete caches of other keys not written for a week (checkouts of several versions
    may share one cache folder: each keeps its own while it is in use)."""
    now = time.time()
    for stale in folder.glob("reasoning-gym-*.jsonl"):
        with contextlib.suppress(OSError):
            if not stale.name.startswith(prefix) and now - stale.stat().st_mtime > STALE_AFTER_S:
                stale.unlink()


def load_tasks(
    secret: bytes | None = None, *, cached_only: bool = False, progress: Progress | None = None
) -> Iterator[dict[str, Any]]:
    """Training tasks, then held-out ones (seeded by the server's `secret` when given);
    each part cached on its own (the held-out part per secret, readable by its owner only).
    `cached_only`: raise NotCached instead of generating (a server starts at once and warms
    this pack in a process of its own, server/packs/warming.py)."""
    path = cache_path()
    held_path = cache_path(f"heldout-{secret_fingerprint(secret)}")
    train = _read_cache(path)
    held = _read_cache(held_path)
    if cached_only and (train is None or held is None):
        raise NotCached(f"reasoning/gym: {'held-out' if train else 'training'} tasks not cached")
    if train is None:
        train = build_train(progress=progress)
        _drop_stale(path.parent, f"reasoning-gym-{cache_key()}-")
        _write_cache(path, train, private=False)
    if held is None:
        held = build_heldout(train, secret, progress=progress)
        _write_cache(held_path, held, private=secret is not None)
    yield from train
    yield from held
