"""A task's environment image: its Docker build context, named by a digest of the context.

A terminal task that carries a build context (`[private] build`: the Dockerfile and the
files it copies, as the importer took them: text in the map, binary files as the pack's
blobs, `build/<path>` in `[private] blobs`) runs on the docker backend in the image built
from it. The image is named ``env-<digest>`` (docker: ``palaestra/env-<digest>:latest``)
where the digest is the SHA-256 of the context files (a blob by its digest), so tasks with
the same environment share one image and a built one is never rebuilt. The pack holds the
context; the image is derived from it.

Building (`build_env_image`) writes the context to a temporary folder -- never the pack --
rewrites its FROM lines through the operator's alias map (`Settings.image_aliases`, for
sites without a registry) or to its registry mirror (`Settings.image_registry_mirror`),
appends programs/snapshot.Dockerfile (a copy of the workdir outside the workspace mount)
and runs the legacy ``docker build`` under the build timeout.
A context that tries to reach outside itself (``..``, absolute sources, an ADD of a URL) or
is over the size limit is refused with its cause before anything is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from palaestra.envs.terminal.baseimages import BaseImages
from palaestra.envs.terminal.dockerfile import dockerfile_instructions

DOCKERFILE = "Dockerfile"
IMAGE_PREFIX = "env-"
SNAPSHOT_DIR = "/.palaestra-env/workdir"  # where snapshot.Dockerfile keeps the workdir
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://|^git@", re.IGNORECASE)
_NOISE = re.compile(r"^( ---> |Removing intermediate|Sending build context|DEPRECATED|\s*$)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LEGACY_NOTE = (
    "The legacy builder is deprecated", "Install the buildx", "https://docs.docker",
    "BuildKit is currently disabled", "DOCKER_BUILDKIT=0", "environment-variable.",
)  # fmt: skip


def context_digest(files: Mapping[str, str], blobs: Mapping[str, str] | None = None) -> str:
    """SHA-256 over the context's (path, text) pairs in path order, then its binary files'
    (path, {"blob": "sha256:<hex>"}) pairs (`blobs`; none: the text-only digest)."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(json.dumps([rel, files[rel]]).encode())
        h.update(b"\n")
    for rel in sorted(blobs or {}):
        h.update(json.dumps([rel, {"blob": (blobs or {})[rel]}]).encode())
        h.update(b"\n")
    return h.hexdigest()


def image_name(files: Mapping[str, str], blobs: Mapping[str, str] | None = None) -> str:
    """The sandbox image name of a context (both backends resolve it; docker adds palaestra/);
    `blobs`: its binary files' digests by path."""
    return f"{IMAGE_PREFIX}{context_digest(files, blobs)[:20]}"


def docker_tag(name: str) -> str:
    return f"palaestra/{name}:latest"


def _words(args: str) -> list[str]:
    if args.startswith("["):
        try:
            value = json.loads(args)
        except ValueError:
            value = None
        if isinstance(value, list):
            return [str(v) for v in value]
    try:
        return shlex.split(args)
    except ValueError:
        return args.split()


def context_problems(
    files: Mapping[str, str], max_bytes: int, blobs: Mapping[str, Path] | None = None
) -> list[str]:
    """Why this context cannot be built safely (empty: it can be tried)."""
    problems: list[str] = []
    if DOCKERFILE not in files:
        problems.append("the build context has no Dockerfile")
    size = sum(len(k) + len(v.encode()) for k, v in files.items())
    size += sum(len(k) + p.stat().st_size for k, p in (blobs or {}).items())
    if size > max_bytes:
        problems.append(
            f"the build context is {size / 2**20:.1f} MiB, over the limit of "
            f"{max_bytes / 2**20:.0f} MiB (env_context_max_mb)"
        )
    for rel in {*files, *(blobs or {})}:
        parts = rel.split("/")
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            problems.append(f"context file {rel!r} is not a plain relative path")
    for instr, args in dockerfile_instructions(files.get(DOCKERFILE, "")):
        if instr not in ("COPY", "ADD"):
            continue
        words = _words(args)
        if any(w.startswith("--from") for w in words):
            continue  # copies from an earlier stage, not from the context
        sources = [w for w in words if not w.startswith("--")][:-1]
        for src in sources:
            if _URL.match(src):
                problems.append(
                    f"{instr} {src}: a download at build time is not part of the pack "
                    "(put the file in the environment folder)"
                )
            elif src.startswith("/") or ".." in src.split("/"):
                problems.append(
                    f"{instr} {src}: the source must be a path inside the build context"
                )
    return problems


def _walk(folder: Path) -> list[Path]:
    """Every non-directory entry under `folder` (symlinks included, never followed)."""
    found: list[Path] = []
    for top, dirs, names in os.walk(folder, followlinks=False):
        base = Path(top)
        found += [base / d for d in dirs if (base / d).is_symlink()]
        found += [base / n for n in names]
    return sorted(found)


def collect_context(
    folder: Path, exclude: set[str], binaries: dict[str, Path] | None = None
) -> tuple[dict[str, str], list[str], list[str]]:
    """A task's build context as text files (files, problems, notes): symlinks are problems
    (a pack never holds what a link points at outside it), binary files go to `binaries`
    (the pack's blobs) where given, else they are problems; dotfiles are left out, as packs
    leave them out."""
    files: dict[str, str] = {}
    problems: list[str] = []
    dropped: list[str] = []
    for path in _walk(folder):  # never through a symlink
        rel = path.relative_to(folder).as_posix()
        if rel.split("/")[0] in exclude:
            continue
        if any(part.startswith(".") or part == "__pycache__" for part in rel.split("/")):
            dropped.append(rel)
            continue
        if path.is_symlink():
            problems.append(f"build context: {rel} is a symlink; a pack holds files only")
        elif path.is_file():
            try:
                files[rel] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                if binaries is not None:
                    binaries[rel] = path
                else:
                    problems.append(f"build context: {rel} is a binary file; not kept here")
    notes = [f"left out of the build context (dotfiles): {', '.join(dropped)}"] if dropped else []
    return files, problems, notes


def rewrite_from(
    text: str, aliases: Mapping[str, str], mirror: str | None = None
) -> tuple[str, list[str]]:
    """The Dockerfile with each FROM image mapped through `aliases`, or to the registry
    `mirror`'s copy where one is set (envs/terminal/baseimages.py); plus what was mapped."""
    bases = BaseImages(aliases, mirror)
    stages: set[str] = set()
    mapped: list[str] = []
    out: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            flags = [w for w in words[1:] if w.startswith("--")]
            rest = [w for w in words[1:] if not w.startswith("--")]
            if rest:
                ref = rest[0]
                if len(rest) >= 3 and rest[1].upper() == "AS":
                    stages.add(rest[2].lower())
                local = None if ref.lower() in stages else bases.resolve(ref)
                if local is not None and local != ref:
                    mapped.append(f"{ref} -> {local}")
                    plain = [f for f in flags if not f.startswith("--platform")]
                    line = " ".join(["FROM", *plain, local, *rest[1:]])
        out.append(line)
    return "\n".join(out) + "\n", mapped


def snapshot_step() -> str:
    return (resources.files("palaestra.envs.terminal.programs") / "snapshot.Dockerfile").read_text()


@dataclass
class BuildResult:
    """One environment's build: `status` built, cached or failed (with `cause`)."""

    image: str
    status: str
    cause: str = ""
    seconds: float = 0.0
    mapped: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "image": self.image,
            "tag": docker_tag(self.image),
            "status": self.status,
            "cause": self.cause,
            "seconds": round(self.seconds, 1),
            "aliases": self.mapped,
            "tasks": self.tasks,
        }


def build_cause(log: str, lines: int = 6) -> str:
    """The last meaningful lines of a build log (the failing step and its error)."""
    kept = [
        ln.rstrip()
        for ln in _ANSI.sub("", log).splitlines()
        if not _NOISE.match(ln) and not any(n in ln for n in _LEGACY_NOTE)
    ]
    steps = [i for i, ln in enumerate(kept) if ln.startswith("Step ")]
    if not steps:
        return "\n".join(kept[-lines:])[-1500:]
    last = steps[-1]
    return "\n".join([kept[last], *kept[last + 1 :][-lines:]])[-1500:]


def image_exists(tag: str) -> bool:
    probe = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.returncode == 0


def write_context(
    files: Mapping[str, str], dest: Path, workdir: str, blobs: Mapping[str, Path] | None = None
) -> None:
    """The context as files under `dest` (executable where the pack convention says), its
    binary files (`blobs`, path -> the file with their bytes) copied byte for byte."""
    for rel, text in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel.endswith(".sh") or text.startswith("#!"):
            path.chmod(0o755)
    for rel, source in (blobs or {}).items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = source.read_bytes()
        path.write_bytes(data)
        if data.startswith((b"#!", b"\x7fELF")):
            path.chmod(0o755)


def build_env_image(
    files: Mapping[str, str],
    *,
    workdir: str,
    aliases: Mapping[str, str],
    timeout_s: float,
    max_bytes: int,
    force: bool = False,
    blobs: Mapping[str, Path] | None = None,
    blob_refs: Mapping[str, str] | None = None,
    mirror: str | None = None,
) -> BuildResult:
    """Build the context's image unless it exists (see the module docstring); never raises
    for a bad context or a failed build: the result says why. `blobs`: its binary files
    (path -> the file), `blob_refs` their digests (path -> sha256:<hex>), which name it;
    `mirror`: the operator's registry mirror (Settings.image_registry_mirror)."""
    name = image_name(files, blob_refs)
    tag = docker_tag(name)
    problems = context_problems(files, max_bytes, blobs)
    if problems:
        return BuildResult(name, "failed", "; ".join(problems))
    if not force and image_exists(tag):
        return BuildResult(name, "cached")
    started = time.monotonic()
    dockerfile, mapped = rewrite_from(files[DOCKERFILE], aliases, mirror)
    with tempfile.TemporaryDirectory(prefix="palaestra-env-") as tmp:
        root = Path(tmp)
        write_context(files, root, workdir, blobs)
        (root / DOCKERFILE).write_text(dockerfile + snapshot_step(), encoding="utf-8")
        argv = [
            "docker", "build", "--network", "host", "--rm", "--force-rm", "--pull=false",
            "--build-arg", f"PALAESTRA_WORKDIR={workdir}", "-t", tag, str(root),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/local/bin:/usr/bin:/bin"},
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
            return BuildResult(
                name,
                "failed",
                f"the build ran past its timeout of {timeout_s:g} s (env_build_timeout_s); "
                f"last output:\n{build_cause(out)}",
                time.monotonic() - started,
                mapped,
            )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        return BuildResult(name, "failed", build_cause(done.stdout + done.stderr), seconds, mapped)
    return BuildResult(name, "built", "", seconds, mapped)


def export_rootfs(name: str, images_dir: Path) -> Path:
    """The built image `name` as a bwrap rootfs, `images_dir/<name>/rootfs` (kept when there;
    written beside it and renamed, so a half export is never used). Raises RuntimeError."""
    root = images_dir / name / "rootfs"
    if (root / "usr").is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    created = subprocess.run(
        ["docker", "create", docker_tag(name)], capture_output=True, text=True, check=False
    )
    if created.returncode != 0:
        raise RuntimeError(f"docker create {docker_tag(name)}: {created.stderr.strip()}")
    cid = created.stdout.strip()
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".rootfs-") as tmp:
        try:
            with subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE) as export:
                untar = subprocess.run(
                    ["tar", "-x", "-C", tmp, "--exclude=dev/*"],
                    stdin=export.stdout,
                    capture_output=True,
                    check=False,
                )
        finally:
            subprocess.run(["docker", "rm", cid], capture_output=True, check=False)
        if export.returncode != 0 or untar.returncode != 0:
            raise RuntimeError(f"docker export {name}: {untar.stderr.decode(errors='replace')}")
        Path(tmp).chmod(0o755)  # a temp dir is 0700; the rootfs is read by the sandbox uid
        Path(tmp).rename(root)
        Path(tmp).mkdir()  # for the context manager's cleanup
    return root
