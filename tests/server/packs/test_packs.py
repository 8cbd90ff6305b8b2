"""Task packs on disk: the three forms, the pack.toml schema, pack.lock, digests, generators."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from palaestra.server.config import REPO_PACKS
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.gencache import GeneratedTaskCache, NotCached
from palaestra.server.packs.loader import generator_seeds, inspect_pack, load_pack
from palaestra.server.packs.lock import (
    LOCK_FILE,
    file_hashes,
    files_digest,
    pack_digest,
    write_lock,
)
from palaestra.server.packs.manifest import PackError, PackManifest, manifest_schema, semver_key

FAMILIES = ["echo", "coding"]
DOCS = Path(__file__).resolve().parents[3] / "docs"

PACK_TOML = """\
name = "acme/demo"
version = "1.2.3"
families = ["echo"]

[splits.train]

[splits.heldout]
sealed = true
"""


def echo_line(task_id: str, split: str = "train", answer: str = "olleh", **extra: object) -> str:
    task = {
        "id": task_id,
        "family": "echo",
        "domain": "demo/say",
        "split": split,
        "public": {"instruction": "Submit 'hello' reversed."},
        "private": {"answer": answer},
        **extra,
    }
    return json.dumps(task) + "\n"


def make_pack(root: Path, toml: str = PACK_TOML, lines: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pack.toml").write_text(toml)
    if lines is None:
        lines = echo_line("a") + echo_line("b", "heldout")
    (root / "tasks.jsonl").write_text(lines)
    return root


# -- the built-in packs and the forms ------------------------------------------------------------
@pytest.mark.parametrize("name", ["echo", "humaneval"])
def test_builtin_packs_load_without_problems(name: str) -> None:
    pack, problems = inspect_pack(REPO_PACKS / name, FAMILIES)
    assert problems == []
    assert pack is not None and pack.tasks
    assert all(pack.expected_reward(t) == 1.0 for t in pack.tasks)


def test_compact_form(tmp_path: Path) -> None:
    lines = echo_line("a", expected_reward=0.5, difficulty=3) + echo_line("b", "heldout")
    pack = load_pack(make_pack(tmp_path / "p", lines=lines), FAMILIES)
    assert sorted(pack.tasks) == ["a", "b"]
    assert pack.expected_reward("a") == 0.5 and pack.expected_reward("b") == 1.0
    assert pack.tasks["a"].difficulty == "3"
    assert pack.tasks["b"].sealed and not pack.tasks["a"].sealed
    assert pack.tasks["a"].ref == "acme/demo@1.2.3:a"


def test_directory_form_loads_file_maps(tmp_path: Path) -> None:
    root = make_pack(tmp_path / "p", lines="")
    (root / "tasks.jsonl").unlink()
    task = root / "tasks" / "fix-bug"
    for rel, text in {
        "task.toml": (
            'family = "echo"\ndomain = "demo/fix"\nsplit = "heldout"\ndifficulty = "hard"\n'
            "expected_reward = 0.75\n[public]\nhint = 'look at main.py'\n"
            "[private]\nanswer = '42'\n"
        ),
        "instruction.md": "Fix the bug.\n",
        "environment/src/main.py": "print(41)\n",
        "assets/notes.txt": "notes\n",
        "verifier/tests.py": "assert True\n",
        "solution/patch.diff": "-41\n+42\n",
        "verifier/__pycache__/x.pyc": "junk",
        "environment/.hidden": "skipped",
    }.items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    pack = load_pack(root, FAMILIES)
    loaded = pack.tasks["fix-bug"]
    assert loaded.public == {
        "hint": "look at main.py",
        "instruction": "Fix the bug.\n",
        "environment": {"src/main.py": "print(41)\n"},
        "assets": {"notes.txt": "notes\n"},
    }
    assert loaded.private == {
        "answer": "42",
        "verifier": {"tests.py": "assert True\n"},
        "solution": {"patch.diff": "-41\n+42\n"},
    }
    assert loaded.domain == "demo/fix" and loaded.split == "heldout" and loaded.sealed
    assert pack.expected_reward("fix-bug") == 0.75


def test_directory_form_problems(tmp_path: Path) -> None:
    root = make_pack(tmp_path / "p")
    bad = root / "tasks" / "x"
    bad.mkdir(parents=True)
    (bad / "task.toml").write_text(
        'id = "y"\nfamily = "echo"\nsplit = "train"\n[public]\ninstruction = "a"\n[private]\n'
        'answer = "b"\n'
    )
    (bad / "instruction.md").write_text("also a")
    (bad / "stray.txt").write_text("?")
    (root / "tasks" / "empty").mkdir()
    with pytest.raises(PackError) as info:
        load_pack(root, FAMILIES)
    text = str(info.value)
    assert "differs from its folder name" in text
    assert "instruction.md exists; keep one" in text
    assert "stray.txt: not part of the directory form" in text
    assert "empty: no task.toml" in text
    assert len(info.value.problems) == 4


def test_source_form_still_works(tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    (root / "pack.toml").write_text(PACK_TOML + '[source]\npython = "src.py"\n')
    (root / "src.py").write_text(
        "def load_tasks():\n"
        "    for i in range(3):\n"
        "        yield {'id': f't{i}', 'family': 'echo', 'split': 'train',\n"
        "               'public': {'instruction': 'x'}, 'private': {'answer': str(i)}}\n"
    )
    pack = load_pack(root, FAMILIES)
    assert sorted(pack.tasks) == ["t0", "t1", "t2"]
    assert pack.tasks["t0"].domain == "demo/echo"
    # Its data lives outside the directory, so the task digests are part of the pack digest.
    assert pack.digest != pack_digest(root)


# -- schema --------------------------------------------------------------------------------------
def test_schema_errors_are_all_listed_with_what_to_fix(tmp_path: Path) -> None:
    toml = (
        'name = "Acme Demo"\nversion = "1.0"\ncolour = "red"\n'
        '[splits.train]\nsealed = "maybe"\n[defaults]\nexpected_reward = 2\n'
    )
    with pytest.raises(PackError) as info:
        load_pack(make_pack(tmp_path / "p", toml=toml), FAMILIES)
    problems = info.value.problems
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert "name: name must look like 'org/name'" in text
    assert "version: version must be semver MAJOR.MINOR.PATCH" in text
    assert "colour: unknown key: remove it or fix its spelling" in text
    assert "splits.train.sealed:" in text
    assert "defaults.expected_reward:" in text
    assert all(p.startswith(str(tmp_path / "p" / "pack.toml")) for p in problems)


def test_missing_fields_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(PackError, match=r"splits: required: add it"):
        load_pack(make_pack(tmp_path / "a", toml='name = "a/b"\nversion = "1.0.0"\n'), FAMILIES)
    with pytest.raises(PackError, match="invalid TOML"):
        load_pack(make_pack(tmp_path / "b", toml="name = "), FAMILIES)
    with pytest.raises(PackError, match=r"no pack\.toml"):
        load_pack(tmp_path / "nothing", FAMILIES)


@pytest.mark.parametrize(
    "version",
    ["0.0.0", "1.2.3", "10.20.30", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-0.3.7",
     "1.0.0-x.7.z.92", "1.0.0+20130313144700", "1.0.0-beta+exp.sha.5114f85", "1.0.0-rc.1+build.1"],
)  # fmt: skip
def test_semver_accepted(version: str) -> None:
    PackManifest.model_validate({"name": "a/b", "version": version, "splits": {"train": {}}})


@pytest.mark.parametrize(
    "version",
    ["1", "1.0", "1.0.0.0", "01.0.0", "1.02.0", "1.0.0-", "1.0.0-01", "1.0.0+", "v1.0.0",
     "1.0.0-alpha..1", "1.0.0 ", "1.0.0-al pha"],
)  # fmt: skip
def test_semver_refused(version: str) -> None:
    with pytest.raises(ValueError, match="semver"):
        PackManifest.model_validate({"name": "a/b", "version": version, "splits": {"train": {}}})


def test_semver_precedence_in_registry(tmp_path: Path) -> None:
    catalog = PackCatalog()
    versions = ["1.0.0-rc.1", "1.0.0", "0.9.10", "1.0.0-alpha", "0.10.0"]
    for i, version in enumerate(versions):
        toml = PACK_TOML.replace("1.2.3", version)
        catalog.add(load_pack(make_pack(tmp_path / str(i), toml=toml), FAMILIES))
    assert catalog.get("acme/demo").version == "1.0.0"
    assert catalog.get("acme/demo@1.0.0-rc.1").version == "1.0.0-rc.1"
    ordered = sorted(versions, key=semver_key)
    assert ordered == ["0.9.10", "0.10.0", "1.0.0-alpha", "1.0.0-rc.1", "1.0.0"]


def test_published_schema_matches_the_model() -> None:
    """docs/pack.schema.json is generated from PackManifest; regenerate it when this fails:
    python -c 'import json; from palaestra.server.packs.manifest import manifest_schema as m;
    print(json.dumps(m(), indent=2, sort_keys=True))' > docs/pack.schema.json"""
    published = json.loads((DOCS / "pack.schema.json").read_text())
    assert published == json.loads(json.dumps(manifest_schema()))


def test_built_in_pack_tomls_validate_against_the_schema() -> None:
    import tomllib

    for name in ("echo", "humaneval"):
        meta = tomllib.loads((REPO_PACKS / name / "pack.toml").read_text())
        PackManifest.model_validate(meta)


# -- lock and digest -----------------------------------------------------------------------------
def test_lock_round_trip_and_every_difference_named(tmp_path: Path) -> None:
    root = make_pack(tmp_path / "p")
    (root / "README.md").write_text("demo\n")
    (root / "extra.txt").write_text("locked\n")
    digest = write_lock(root)
    lock = json.loads((root / LOCK_FILE).read_text())
    assert sorted(lock["files"]) == ["README.md", "extra.txt", "pack.toml", "tasks.jsonl"]
    assert lock["digest"] == digest == load_pack(root, FAMILIES).digest
    (root / "README.md").write_text("changed\n")
    (root / "extra.txt").unlink()
    (root / "new.txt").write_text("new\n")
    with pytest.raises(PackError) as info:
        load_pack(root, FAMILIES)
    problems = info.value.problems
    assert len(problems) == 3, problems
    assert "README.md differs from its locked sha256" in problems[0]
    assert "extra.txt is locked but missing from the pack" in problems[1]
    assert "new.txt is in the pack but not in the lock" in problems[2]
    write_lock(root)
    assert load_pack(root, FAMILIES).digest != digest


def test_corrupt_lock(tmp_path: Path) -> None:
    root = make_pack(tmp_path / "p")
    (root / LOCK_FILE).write_text("{not json")
    with pytest.raises(PackError, match="not a pack lock"):
        load_pack(root, FAMILIES)
    write_lock(root)
    lock = json.loads((root / LOCK_FILE).read_text())
    lock["digest"] = "sha256:" + "0" * 64
    (root / LOCK_FILE).write_text(json.dumps(lock))
    with pytest.raises(PackError, match="digest does not match its file list"):
        load_pack(root, FAMILIES)


def test_digest_is_stable_and_covers_only_pack_files(tmp_path: Path) -> None:
    a = make_pack(tmp_path / "a")
    b = tmp_path / "b"
    b.mkdir()
    # Same files written in the other order, plus things the digest ignores.
    (b / "tasks.jsonl").write_text((a / "tasks.jsonl").read_text())
    (b / "pack.toml").write_text((a / "pack.toml").read_text())
    (b / "__pycache__").mkdir()
    (b / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (b / ".DS_Store").write_text("x")
    (b / ".git").mkdir()
    (b / ".git" / "HEAD").write_text("ref")
    write_lock(b)  # pack.lock itself is not covered
    assert pack_digest(a) == pack_digest(b) == load_pack(b, FAMILIES).digest
    assert file_hashes(a) == file_hashes(b)
    assert load_pack(a, FAMILIES).digest == load_pack(a, FAMILIES).digest
    (b / "tasks.jsonl").write_text((a / "tasks.jsonl").read_text() + "\n")
    assert pack_digest(a) != pack_digest(b)
    # The rule: sha256 over sorted (path, sha256(bytes)) — recomputable from the lock alone.
    assert files_digest(dict(reversed(file_hashes(a).items()))) == pack_digest(a)


def test_copied_pack_has_the_same_digest(tmp_path: Path) -> None:
    copy = tmp_path / "echo"
    shutil.copytree(REPO_PACKS / "echo", copy)
    assert load_pack(copy, FAMILIES).digest == load_pack(REPO_PACKS / "echo", FAMILIES).digest


# -- generators ----------------------------------------------------------------------------------
GENERATOR = """\
import random

def generate(seed: int, index: int, level: int) -> dict:
    rng = random.Random(seed)
    word = "".join(rng.choice("abcdefgh") for _ in range(2 + level))
    return {"public": {"instruction": f"reverse {word}", "seed": seed, "index": index,
                       "level": level},
            "private": {"answer": word[::-1]}}
"""

GEN_TOML = (
    PACK_TOML
    + """
[generators.rev]
module = "generators/rev.py"
family = "echo"
domain = "demo/reverse"
levels = [1, 2, 3]
splits.train = { seeds = [0, 100000], count = 50 }
splits.heldout = { seeds = [1000000, 1001000], count = 20 }
"""
)


def make_generator_pack(root: Path, toml: str = GEN_TOML, source: str = GENERATOR) -> Path:
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(toml)
    (root / "generators").mkdir()
    (root / "generators" / "rev.py").write_text(source)
    return root


def test_generators_draw_each_split_from_its_seed_range(tmp_path: Path) -> None:
    pack = load_pack(make_generator_pack(tmp_path / "g"), FAMILIES)
    train = [t for t in pack.tasks.values() if t.split == "train"]
    heldout = [t for t in pack.tasks.values() if t.split == "heldout"]
    assert len(train) == 50 and len(heldout) == 20
    assert all(0 <= t.public["seed"] < 100000 for t in train)
    assert all(1000000 <= t.public["seed"] < 1001000 for t in heldout)
    assert {t.public["seed"] for t in train}.isdisjoint(t.public["seed"] for t in heldout)
    assert all(t.sealed for t in heldout) and not any(t.sealed for t in train)
    assert {t.public["level"] for t in train} == {1, 2, 3}
    one = train[0]
    assert one.id == f"rev-{one.public['seed']}"
    assert one.domain == "demo/reverse" and one.family == "echo"
    assert one.difficulty == f"level-{one.public['level']}"
    # Deterministic: the same pack generates the same tasks, in another process too.
    again = load_pack(tmp_path / "g", FAMILIES)
    assert {k: t.digest for k, t in again.tasks.items()} == {
        k: t.digest for k, t in pack.tasks.items()
    }
    spec = pack.manifest.generators["rev"].splits["train"] if pack.manifest else None
    assert spec is not None
    seeds = generator_seeds("acme/demo", "rev", "train", spec)
    assert seeds == sorted(random.Random("acme/demo/rev/train").sample(range(0, 100000), 50))


COUNTING = GENERATOR.replace(
    "def generate(seed: int, index: int, level: int) -> dict:\n",
    "def generate(seed: int, index: int, level: int) -> dict:\n"
    "    with open(CALLS, 'a') as log:\n"
    "        log.write('x')\n",
)


def test_generated_tasks_are_cached_by_everything_they_depend_on(tmp_path: Path) -> None:
    """A second load reads the cache (no generator call) and gives the same tasks; a changed
    generator, another secret or a failing call is never served from it."""
    calls = tmp_path / "calls"
    source = f"CALLS = {str(calls)!r}\n" + COUNTING
    root = make_generator_pack(tmp_path / "g", source=source)
    cache = GeneratedTaskCache(tmp_path / "cache")
    first = load_pack(root, FAMILIES, secret=b"k" * 32, cache=cache)
    assert calls.read_text() == "x" * 70
    entries = sorted((tmp_path / "cache").iterdir())
    assert len(entries) == 2 and all(e.stat().st_mode & 0o077 == 0 for e in entries)
    again = load_pack(root, FAMILIES, secret=b"k" * 32, cache=cache)
    assert calls.read_text() == "x" * 70  # nothing generated again
    assert {k: t.digest for k, t in again.tasks.items()} == {
        k: t.digest for k, t in first.tasks.items()
    }
    other = load_pack(root, FAMILIES, secret=b"o" * 32, cache=cache)
    assert calls.read_text() == "x" * 90  # new sealed seeds: the held-out split again
    assert {t.id for t in other.tasks.values() if t.sealed} == {
        t.id for t in first.tasks.values() if t.sealed
    }
    assert {t.digest for t in other.tasks.values() if t.sealed}.isdisjoint(
        t.digest for t in first.tasks.values() if t.sealed
    )
    (root / "generators" / "rev.py").write_text(source.replace("reverse", "flip"))
    changed = load_pack(root, FAMILIES, secret=b"k" * 32, cache=cache)
    assert calls.read_text() == "x" * 160
    assert all(t.public["instruction"].startswith("flip") for t in changed.tasks.values())
    # A corrupt entry is a miss, not an error.
    for entry in (tmp_path / "cache").iterdir():
        entry.write_text("[1, 2")
    load_pack(root, FAMILIES, secret=b"k" * 32, cache=cache)
    assert calls.read_text() == "x" * 230


def test_cached_only_never_imports_or_calls_a_generator(tmp_path: Path) -> None:
    """A server start's load (`cached_only`) raises NotCached where a split is not cached,
    before importing its generator; once cached, the pack loads without importing it
    (the generator's module is imported only for a split the cache lacks)."""
    calls = tmp_path / "calls"
    source = f"CALLS = {str(calls)!r}\nopen(CALLS, 'a').write('i')\n" + COUNTING
    root = make_generator_pack(tmp_path / "g", source=source)
    cache = GeneratedTaskCache(tmp_path / "cache")
    with pytest.raises(NotCached, match="split train"):
        load_pack(root, FAMILIES, secret=b"k" * 32, cache=cache, cached_only=True)
    assert not calls.exists()
    first = load_pack(root, FAMILIES, secret=b"k" * 32, cache=cache)
    assert calls.read_text() == "i" + "x" * 70  # imported once, 70 calls
    warm = load_pack(root, FAMILIES, secret=b"k" * 32, cache=cache, cached_only=True)
    assert calls.read_text() == "i" + "x" * 70  # neither imported nor called
    assert {k: t.digest for k, t in warm.tasks.items()} == {
        k: t.digest for k, t in first.tasks.items()
    }
    with pytest.raises(NotCached, match="split heldout"):  # another secret: new sealed seeds
        load_pack(root, FAMILIES, secret=b"o" * 32, cache=cache, cached_only=True)


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        (
            "splits.train = { seeds = [0, 1000], count = 5 }\n"
            "splits.heldout = { seeds = [500, 2000], count = 5 }\n",
            "overlap",
        ),
        ("splits.train = { seeds = [0, 10], count = 11 }\n", "count 11 is more than the 10 seeds"),
        ("splits.train = { seeds = [10, 10], count = 1 }\n", "0 <= first < end"),
        ("splits.dev = { seeds = [0, 10], count = 1 }\n", "split 'dev' is not declared"),
    ],
)
def test_generator_seed_ranges_are_validated(tmp_path: Path, splits: str, message: str) -> None:
    toml = PACK_TOML + (
        '\n[generators.rev]\nmodule = "generators/rev.py"\nfamily = "echo"\n'
        'domain = "demo/reverse"\n' + splits
    )
    with pytest.raises(PackError, match=message):
        load_pack(make_generator_pack(tmp_path / "g", toml=toml), FAMILIES)


def test_generator_failures_are_problems(tmp_path: Path) -> None:
    broken = (
        "def generate(seed, index, level):\n    if index == 1:\n        raise KeyError(seed)\n"
        "    return {'public': {}, 'private': {'answer': 'x'}}\n"
    )
    toml = GEN_TOML.replace("count = 50", "count = 3").replace("count = 20", "count = 1")
    with pytest.raises(PackError) as info:
        load_pack(make_generator_pack(tmp_path / "g", toml=toml, source=broken), FAMILIES)
    assert len(info.value.problems) == 1
    assert (
        "generate(seed=" in info.value.problems[0] and "raised KeyError" in info.value.problems[0]
    )
    with pytest.raises(PackError, match=r"needs `generate\(seed, index, level\) -> dict`"):
        load_pack(make_generator_pack(tmp_path / "h", source="x = 1\n"), FAMILIES)
    bad_module = GEN_TOML.replace("generators/rev.py", "../rev.py")
    with pytest.raises(PackError, match=r"must be a \.py file inside the pack directory"):
        load_pack(make_generator_pack(tmp_path / "i", toml=bad_module), FAMILIES)


# -- bad input -----------------------------------------------------------------------------------
def test_unknown_family_duplicate_id_undeclared_split_all_listed(tmp_path: Path) -> None:
    lines = (
        echo_line("a")
        + echo_line("a")
        + echo_line("c", split="dev")
        + json.dumps({"id": "d", "family": "chess", "split": "train", "public": {}, "private": {}})
        + "\n{broken\n"
        + json.dumps({"id": "bad id", "family": "echo", "split": "train", "public": {}})
        + "\n"
    )
    toml = PACK_TOML.replace('families = ["echo"]', 'families = ["echo", "chess"]')
    with pytest.raises(PackError) as info:
        load_pack(make_pack(tmp_path / "p", toml=toml, lines=lines), FAMILIES)
    text = str(info.value)
    assert "duplicate task id 'a'" in text
    assert "split 'dev' is not declared" in text
    assert "unknown family 'chess'" in text
    assert "not JSON" in text
    assert "tasks.jsonl:6: id: task id 'bad id'" in text
    assert "tasks.jsonl:6: private: required: add it" in text
    assert len(info.value.problems) == 6


def test_family_not_listed_in_pack_toml(tmp_path: Path) -> None:
    line = json.dumps(
        {"id": "x", "family": "coding", "split": "train", "public": {}, "private": {}}
    )
    with pytest.raises(PackError, match=r"not listed in pack\.toml's families"):
        load_pack(make_pack(tmp_path / "p", lines=line + "\n"), FAMILIES)


def test_registry_records_broken_packs(tmp_path: Path) -> None:
    make_pack(tmp_path / "packs" / "good")
    make_pack(tmp_path / "packs" / "bad", lines=echo_line("a") + echo_line("a"))
    catalog = PackCatalog()
    catalog.load_dirs([tmp_path / "packs"], FAMILIES)
    assert [p.name for p in catalog.all()] == ["acme/demo"]
    assert "duplicate task id" in catalog.errors[str(tmp_path / "packs" / "bad")]


def test_packs_dirs_take_a_pack_folder_itself_and_name_a_missing_one(tmp_path: Path) -> None:
    one = make_pack(tmp_path / "one")  # a pack folder named directly, not its parent
    catalog = PackCatalog()
    (tmp_path / "empty-is-fine").mkdir()
    catalog.load_dirs([one, tmp_path / "empty-is-fine", tmp_path / "nowhere"], FAMILIES)
    assert [p.name for p in catalog.all()] == ["acme/demo"]
    assert list(catalog.errors) == [str(tmp_path / "nowhere")]
    assert "not a folder" in catalog.errors[str(tmp_path / "nowhere")]
