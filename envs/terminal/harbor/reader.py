"""`palaestra pack import harbor`: one Harbor task folder as a terminal task.

A Harbor task is `task.toml` (config.py maps its fields), `instruction.md`,
`environment/Dockerfile` (or `[environment] docker_image`), `tests/test.sh` (+ files; it
writes `/logs/verifier/reward.txt`) and `solution/solve.sh` (+ files). The tests go to
`verifier/harbor-test.sh` with `/tests` → `$VERIFIER_DIR/tests` and `/logs/verifier` →
`$VERIFIER_LOGS`; the task declares `reward_file`, so that file decides. A folder listed in
the source's `dataset.toml` must match its pinned content digest (digest.py). Schema 1.4's
network policy, artifacts, separate verifier and seeded `trajectory.json` are read by
phases.py (what palaestra cannot give refuses the task, naming why).

A folder that `pack export harbor` wrote (`[metadata.palaestra]`, writer.py) is read back
exactly: `environment/files/`, `tests/palaestra/` and `solution/` are the task's own file
maps, so import(export(pack)) gives the same tasks.
"""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

from palaestra.envs.terminal import testpaths
from palaestra.envs.terminal.dockerfile import EnvPlan, convert_dockerfile, within
from palaestra.envs.terminal.harbor import phases
from palaestra.envs.terminal.harbor.config import Ceilings, Mapped, map_config
from palaestra.envs.terminal.harbor.digest import content_digest, has_ignore_rules, pinned_digests
from palaestra.envs.terminal.importer import (
    TaskOut,
    Unsupported,
    build_context,
    category_of,
    clean_test_script,
    compose_problems,
    difficulty_of,
    network_problems,
    solution_problems,
    task_out,
    tests_network_problems,
    text_files,
    verifier_image_for,
    verifier_wrapper,
    wheel_notes,
)
from palaestra.envs.terminal.installs import installs_problems, verifier_installs
from palaestra.envs.terminal.solvefiles import file_writes

EXPORT_KEY = "palaestra"  # [metadata.palaestra]: written by writer.py
NETWORK_FIELDS = ("allow_internet", "allowed_hosts")  # its `network`: the task's own
ENV_FILES, VERIFIER_DIR = "files", "palaestra"  # environment/files/, tests/palaestra/
COMPOSE = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml"}


class HarborReader:
    """Converts the Harbor task folders of one source (its dataset.toml pins, if any)."""

    def __init__(self, src: Path, ceilings: Ceilings | None) -> None:
        self.ceilings = ceilings
        self.pins, self.problems = pinned_digests(src) if src.is_dir() else ({}, [])

    def split_of(self, folder: Path) -> str | None:
        """The split an exported task was in (`[metadata.palaestra] split`), or None."""
        try:
            meta = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None
        info = meta.get("metadata")
        export = info.get(EXPORT_KEY) if isinstance(info, dict) else None
        split = export.get("split") if isinstance(export, dict) else None
        return split if isinstance(split, str) and split else None

    def convert(self, folder: Path, split: str, pack_short: str) -> TaskOut:
        """One Harbor task folder as a terminal task; raises Unsupported naming each cause."""
        links = [n for n in ("task.toml", "instruction.md") if not within(folder / n, folder)]
        if links:
            raise Unsupported([f"{n} is a symlink; packs hold files only" for n in links])
        try:
            meta = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise Unsupported([f"task.toml cannot be read: {exc}"]) from None
        problems, notes = list(self.problems), list[str]()
        self._check_digest(folder, meta, problems, notes)
        info = meta.get("metadata") if isinstance(meta.get("metadata"), dict) else {}
        assert isinstance(info, dict)
        export = info.get(EXPORT_KEY)
        if isinstance(export, dict):
            meta = _without_generated(meta, export)
        mapped = map_config(meta, self.ceilings)
        if isinstance(export, dict) and isinstance(export.get("network"), dict):
            given = export["network"]  # the task's own network fields (writer.py)
            mapped.public.update({k: v for k, v in given.items() if k in NETWORK_FIELDS})
        problems += mapped.problems
        notes += mapped.notes
        try:
            instruction = (folder / "instruction.md").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            problems.append("no instruction.md")
            instruction = ""
        plan, build = _environment(folder, meta, problems, notes, exported=isinstance(export, dict))
        workdir = mapped.public.get("workdir")
        if workdir and workdir != plan.workdir and plan.files:
            problems.append(
                f"[environment] workdir {workdir} differs from the Dockerfile's WORKDIR "
                f"{plan.workdir}, where its files are copied"
            )
        if "env" in mapped.public:  # set at run time, over the Dockerfile's ENV
            mapped.public["env"] = {**plan.env, **mapped.public["env"]}
        seeded = phases.Run()
        phases.trajectory(folder, seeded)
        problems += seeded.problems
        egress = self.ceilings.egress_allow if self.ceilings else None
        if isinstance(export, dict):
            parts = _exported(folder, export, mapped, plan, problems)
            problems += installs_problems(parts[2], egress)
        else:
            parts = _native(folder, meta, workdir or plan.workdir, problems, notes, egress)
            image = parts[2].get("verifier_image")
            staged = testpaths.harbor(folder, meta, parts[0], parts[1], plan, build, image)
            if staged.own_image is not None:  # newer Python than 3.11's (pyminor.py)
                build = _own_image(folder, meta, plan, staged, notes)
            problems += staged.problems
            notes += staged.notes
        if problems:
            raise Unsupported(problems)
        verifier, solution, private, blobs = parts
        out = task_out(
            folder,
            plan,
            build=build,
            split=split,
            domain=f"{pack_short}/{category_of(mapped.category)}",
            difficulty=difficulty_of(mapped.difficulty),
            timeout=None,
            instruction=instruction,
            verifier=verifier,
            solve=solution.get("solve.sh", ""),
            notes=notes,
            public_extra=mapped.public,
            private={**private, **mapped.private},
            blobs=blobs,
        )
        out.solution = solution
        if isinstance(export, dict):
            out.toml["domain"] = str(export.get("domain") or out.toml["domain"])
            out.toml["difficulty"] = str(export.get("difficulty") or out.toml["difficulty"])
        return out

    def _check_digest(
        self, folder: Path, meta: dict[str, Any], problems: list[str], notes: list[str]
    ) -> None:
        task = meta.get("task") if isinstance(meta.get("task"), dict) else {}
        assert isinstance(task, dict)
        name = str(task.get("name") or folder.name).rsplit("/", 1)[-1]
        pin = self.pins.get(name) or self.pins.get(folder.name)
        if not pin:
            return
        if has_ignore_rules(folder):
            notes.append("dataset.toml digest not verified: the folder has ignore rules")
            return
        digest = content_digest(folder)
        if digest != pin:
            problems.append(
                f"content digest {digest[:19]}… does not match dataset.toml's pin "
                f"{pin[:19]}…: the task changed after it was pinned"
            )
        else:
            notes.append(f"content digest {digest[:19]}… matches dataset.toml")


def _environment(
    folder: Path, meta: dict[str, Any], problems: list[str], notes: list[str], *, exported: bool
) -> tuple[EnvPlan, dict[str, str]]:
    """The environment a Dockerfile (or `docker_image`) describes, and the build context of
    the task's own image where the terminal image cannot stand in for it (`build_context`);
    an export's own files are read as they are (`_exported`), not through its COPY."""
    env_dir = folder / "environment"
    problems.extend(compose_problems(env_dir, "environment/"))
    dockerfile = env_dir / "Dockerfile"
    synthetic = _synthetic(folder, meta)
    if dockerfile.exists():
        exclude = COMPOSE | ({ENV_FILES} if exported else set())
        plan = convert_dockerfile(dockerfile.read_text(encoding="utf-8"), env_dir, exclude)
    elif synthetic is not None:
        plan = convert_dockerfile(synthetic, env_dir, exclude=set())
    else:
        plan = EnvPlan()
        problems.append("no environment/Dockerfile and no [environment] docker_image")
    notes += plan.notes
    build: dict[str, str] = {}
    if not exported:
        build, bad, more = build_context(plan, env_dir, COMPOSE - {"Dockerfile"}, synthetic)
        problems += bad
        notes += more
    problems += plan.problems
    return plan, build


def _synthetic(folder: Path, meta: dict[str, Any]) -> str | None:
    """The Dockerfile `[environment] docker_image` stands for, where the task has none."""
    env = meta.get("environment")
    image = env.get("docker_image") if isinstance(env, dict) else None
    if (folder / "environment" / "Dockerfile").exists() or not isinstance(image, str):
        return None
    return f"FROM {image}\n"


def _own_image(
    folder: Path,
    meta: dict[str, Any],
    plan: EnvPlan,
    staged: testpaths.Checked,
    notes: list[str],
) -> dict[str, str]:
    """The build context of a task whose Python needs its own image on the 3.13 stand-in
    (`staged.own_image` says why), as `_environment` makes one for other needs."""
    assert staged.own_image is not None
    env_dir, synthetic = folder / "environment", _synthetic(folder, meta)
    plan.problems.append(staged.own_image)
    build, bad, more = build_context(plan, env_dir, COMPOSE - {"Dockerfile"}, synthetic)
    staged.problems += bad
    notes += more
    return build


# The longest solve.sh (quoted) the oracle's bash command takes (its 200,000 characters).
MAX_SOLVE = 190_000
# verifier, solution, private, binary files ("<folder>/<path>" -> file: the pack's blobs)
Parts = tuple[dict[str, str], dict[str, str], dict[str, Any], dict[str, Path]]


def _native(
    folder: Path,
    meta: dict[str, Any],
    workdir: str,
    problems: list[str],
    notes: list[str],
    egress_allow: tuple[str, ...] | None = None,
) -> Parts:
    """A Harbor task as Harbor writes it (see the module docstring); its separate verifier
    and artifacts as phases.py reads them; its test-time pip installs for the verifier where
    the operator's `egress_allow` has their hosts (envs/terminal/installs.py)."""
    solution_bin: dict[str, Path] = {}
    solution, bad = text_files(folder / "solution", binaries=solution_bin)
    problems += bad
    solve = solution.pop("solve.sh", None)
    if solve is None:
        problems.append("no solution/solve.sh")
        solve = ""
    problems += solution_problems(solve)
    if solution or solution_bin:
        solve = _embed_solution_files(solve, solution, solution_bin)
        embedded = ", ".join(sorted({*solution, *solution_bin}))
        notes.append(f"solution files embedded in solve.sh: {embedded}")
        if len(shlex.quote(solve)) > MAX_SOLVE:
            problems.append(
                f"the solution's files take solve.sh to {len(solve)} characters, over the "
                f"{MAX_SOLVE} one oracle command may carry (binary files go in base64)"
            )
    binaries: dict[str, Path] = {}
    tests, bad = text_files(folder / "tests", binaries=binaries)
    problems += bad + tests_network_problems(tests)
    run = phases.Run()
    phases.verifier_environment(meta, run, "Dockerfile" in tests)
    phases.artifacts(meta, workdir, tests, run)
    problems += run.problems
    notes += run.notes
    if run.verifier_dockerfile is not None:  # the image `palaestra images build` makes
        tests["Dockerfile"] = run.verifier_dockerfile
    test_sh = tests.pop("test.sh", None)
    if test_sh is None:
        bundled = " (an image holding its own tests is not read)" if run.separate else ""
        problems.append(f"no tests/test.sh{bundled}")
        test_sh = ""
    script, bad = clean_test_script(
        test_sh, tests_dir="$VERIFIER_DIR/tests", logs_dir="$VERIFIER_LOGS"
    )
    script, bad, installs, more = verifier_installs(script, bad, egress_allow, network_problems)
    problems += bad
    notes += more
    verifier = {f"tests/{k}": v for k, v in tests.items()}
    verifier["harbor-test.sh"] = script
    verifier["test.sh"] = verifier_wrapper("harbor", "harbor-test.sh")
    # Harbor's tests/test.sh decides through $VERIFIER_LOGS/reward.txt (or reward.json): the
    # task says so, and only a task that says so has its reward file read (docs/terminal.md).
    private: dict[str, Any] = {"reward_file": True, **installs}
    image = verifier_image_for(verifier, script)
    if image is not None:  # its own tests/Dockerfile, or uv/uvx in its tests
        private["verifier_image"] = image
        notes += wheel_notes(script)
    return (
        verifier,
        {"solve.sh": solve},
        private,
        {f"verifier/tests/{k}": v for k, v in binaries.items()},
    )


def _exported(
    folder: Path, export: dict[str, Any], mapped: Mapped, plan: EnvPlan, problems: list[str]
) -> Parts:
    """A folder `pack export harbor` wrote: its file maps as they were."""
    env_bin: dict[str, Path] = {}
    environment, bad = text_files(folder / "environment" / ENV_FILES, binaries=env_bin)
    problems += bad
    plan.files, plan.binaries, plan.setup = environment, env_bin, []
    binaries: dict[str, Path] = {}
    verifier, bad = text_files(folder / "tests" / VERIFIER_DIR, binaries=binaries)
    problems += bad
    solution, bad = text_files(folder / "solution")
    problems += bad
    if "solve.sh" not in solution:
        problems.append("no solution/solve.sh")
    private: dict[str, Any] = {"reward_file": bool(export.get("reward_file", False))}
    for key in ("verifier_installs", "verifier_hosts"):
        if isinstance(export.get(key), list):
            private[key] = [str(v) for v in export[key]]
    image = export.get("verifier_image")
    if isinstance(image, str) and image:
        private["verifier_image"] = image
    return verifier, solution, private, {f"verifier/{k}": v for k, v in binaries.items()}


def _without_generated(meta: dict[str, Any], export: dict[str, Any]) -> dict[str, Any]:
    """task.toml less what the writer generated (the task did not give it) and its marker."""
    meta = copy.deepcopy(meta)
    generated = export.get("generated")
    for dotted in [*(generated if isinstance(generated, list) else []), "metadata." + EXPORT_KEY]:
        *sections, key = str(dotted).split(".")
        table: Any = meta
        for name in sections:
            table = table.get(name) if isinstance(table, dict) else None
        if isinstance(table, dict):
            table.pop(key, None)
    added = export.get("added_artifacts")
    if isinstance(added, list) and added and isinstance(meta.get("artifacts"), list):
        meta["artifacts"] = [a for a in meta["artifacts"] if a not in added]
    return {k: v for k, v in meta.items() if v not in ({}, [])}


def _embed_solution_files(solve: str, files: dict[str, str], binaries: dict[str, Path]) -> str:
    """solve.sh that first writes Harbor's other solution files (its /solution) to a temp dir
    (binary ones in base64: the oracle's one command carries them)."""
    lines = ["#!/bin/bash", "export SOLUTION_DIR=$(mktemp -d)"]  # the inner bash reads it
    lines += file_writes(files, binaries, lambda rel: f'"$SOLUTION_DIR"/{shlex.quote(rel)}')
    body = re.sub(r"(?<![\w/$])/solution(?=/|\b)", '"$SOLUTION_DIR"', solve)
    lines.append(f"bash -c {shlex.quote(body)}")
    return "\n".join(lines) + "\n"
