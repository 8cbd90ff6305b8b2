"""Build-time downloads judged at import (envs/terminal/downloads.py), without an engine, over
real aider_polyglot Dockerfiles (tests/fixtures/polyglot-downloads, tb-adapters): a vendor's
toolchain download on a generic base is served by its stand-in when the task's own files
declare a minimum it meets, refused naming both versions when not, served from the registry
mirror at the version asked when one is set; any other download from a host builds do not
reach is refused naming the host and build_hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.cli.pack_import import reason_class
from palaestra.envs.terminal.baseimages import BaseImages, base_problems
from palaestra.envs.terminal.downloads import engines_minimum, serve_downloads
from palaestra.envs.terminal.envimage import DOCKERFILE
from palaestra.envs.terminal.importer import import_tasks
from palaestra.sandbox.docker.standins import DEFAULT_BUILD_HOSTS, DEFAULT_IMAGE_ALIASES
from palaestra.server.config import Settings

FIXTURES = Path(__file__).parents[2] / "fixtures"
GO_TASK = FIXTURES / "tb-adapters" / "aider_polyglot-polyglot_go_octal"
BASES = BaseImages(DEFAULT_IMAGE_ALIASES)
MIRROR = BaseImages(DEFAULT_IMAGE_ALIASES, "registry.internal:5000")


def _context(folder: Path) -> dict[str, str]:
    """A task's build context as the importer holds it: relative path -> text."""
    return {
        p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in ("", ".mod", ".toml", ".json")
    }


def _judge(build: dict[str, str], bases: BaseImages = BASES) -> tuple[str, str]:
    problems, notes = serve_downloads(build, bases)
    return " | ".join(problems), " | ".join(notes)


def _froms(dockerfile: str) -> list[str]:
    return [ln.split()[1] for ln in dockerfile.splitlines() if ln.startswith("FROM ")]


def test_go_download_runs_on_the_stand_in_go_mod_allows() -> None:
    build = _context(GO_TASK)
    problems, notes = _judge(build)
    assert problems == ""
    assert "downloads Go 1.21.5" in notes and "workspace/go.mod `go 1.18` needs 1.18" in notes
    assert "palaestra/golang:latest (Go 1.19" in notes and "buildpack-deps:jammy" in notes
    dockerfile = build[DOCKERFILE]
    assert _froms(dockerfile) == ["palaestra/golang:latest"]
    assert "golang.org/dl" not in dockerfile and "apt-get install -y" in dockerfile
    assert "RUN go version" in dockerfile  # the rest of the build is kept
    assert base_problems(dockerfile, BASES) == ([], [])
    # without go.mod the download's own version decides: newer than Go 1.19, refused
    build = {k: v for k, v in _context(GO_TASK).items() if not k.endswith("go.mod")}
    problems, _ = _judge(build)
    assert "downloads Go 1.21.5" in problems and "palaestra/golang:latest (Go 1.19" in problems
    assert "go.mod's `go` line" in problems and "image_registry_mirror" in problems
    assert "golang:1.21.5" in problems and "image_aliases" in problems
    assert "golang.org/dl" in build[DOCKERFILE]  # a refused task's Dockerfile is untouched


def test_rustup_with_no_version_runs_on_the_edition_minimum() -> None:
    build = _context(FIXTURES / "polyglot-downloads" / "rust-accumulate")
    problems, notes = _judge(build)
    assert problems == ""
    assert "downloads Rust (the latest)" in notes and "edition 2021 needs 1.56" in notes
    assert _froms(build[DOCKERFILE]) == ["palaestra/rust:latest"]
    assert "rustup" not in build[DOCKERFILE] and "libssl-dev" in build[DOCKERFILE]
    # rust-version decides over the edition; newer than rustc 1.63: refused, naming both
    cargo = build["workspace/Cargo.toml"] = '[package]\nedition = "2021"\nrust-version = "1.70"\n'
    build[DOCKERFILE] = (FIXTURES / "polyglot-downloads/rust-accumulate/Dockerfile").read_text()
    problems, _ = _judge(build)
    assert 'rust-version = "1.70"` needs 1.70' in problems and "Rust 1.63" in problems
    # no Cargo.toml at all: the latest stable, refused
    del build["workspace/Cargo.toml"]
    problems, _ = _judge(build)
    assert "Rust (the latest)" in problems and "declare no minimum" in problems
    assert cargo


def test_node_setup_20_with_no_engines_is_refused_naming_both_versions() -> None:
    folder = FIXTURES / "polyglot-downloads" / "javascript-affine-cipher"
    build = _context(folder)
    problems, notes = _judge(build)
    assert notes == ""
    assert "downloads Node.js 20" in problems and "deb.nodesource.com/setup_20.x" in problems
    assert "palaestra/node:latest (Node.js 18" in problems
    assert "package.json's engines.node" in problems and "node:20" in problems
    assert reason_class(problems) == "toolchain download newer than its stand-in"
    # a package.json whose engines admit Node 18 runs on the stand-in
    build["workspace/package.json"] = '{"engines": {"node": ">=16 <21"}}'
    problems, notes = _judge(build)
    assert problems == "" and "engines.node `>=16 <21` needs 16" in notes
    assert _froms(build[DOCKERFILE]) == ["palaestra/node:latest"]
    assert "nodesource" not in build[DOCKERFILE]


@pytest.mark.parametrize(
    ("spec", "low"),
    [(">=18.0.0", (18, 0, 0)), ("^20", (20,)), ("18.x || 16", (16,)), ("*", (0,)),
     ("<19", (0,)), ("latest-ish", None)],
)  # fmt: skip
def test_engines_minimum(spec: str, low: tuple[int, ...] | None) -> None:
    assert engines_minimum(spec) == low


def test_the_mirror_serves_the_version_asked_and_refuses_nothing() -> None:
    build = _context(GO_TASK)
    problems, notes = _judge(build, MIRROR)
    assert problems == "" and "registry mirror" in notes
    assert _froms(build[DOCKERFILE]) == ["golang:1.21.5"]
    assert "golang.org/dl" not in build[DOCKERFILE]
    node = _context(FIXTURES / "polyglot-downloads" / "javascript-affine-cipher")
    assert _judge(node, MIRROR)[0] == "" and _froms(node[DOCKERFILE]) == ["node:20"]
    rust = _context(FIXTURES / "polyglot-downloads" / "rust-accumulate")
    assert _judge(rust, MIRROR)[0] == "" and _froms(rust[DOCKERFILE]) == ["rust:latest"]
    # an exact image_aliases key for the version asked is the operator's own image
    own = BaseImages({**DEFAULT_IMAGE_ALIASES, "node:20": "site/node:20"})
    node = _context(FIXTURES / "polyglot-downloads" / "javascript-affine-cipher")
    problems, notes = _judge(node, own)
    assert problems == "" and _froms(node[DOCKERFILE]) == ["site/node:20"]


def test_another_download_is_refused_naming_the_host_and_build_hosts() -> None:
    dockerfile = (
        "FROM ubuntu:22.04\nWORKDIR /app\n"
        "RUN apt-get update && apt-get install -y curl \\\n"
        "    && curl -fsSL https://example.com/x.tar.gz | tar xz\n"
        "ADD https://downloads.example.org/data.bin /app/\n"
        'RUN echo "see https://docs.example.net" && pip install requests\n'
        "RUN curl -s http://localhost:8000/health || true\n"
    )
    build = {DOCKERFILE: dockerfile}
    problems, _ = serve_downloads(build, BASES)
    assert len(problems) == 2, problems
    assert "downloads from example.com" in problems[0]
    assert "`https://example.com/x.tar.gz`" in problems[0] and "build_hosts" in problems[0]
    assert "downloads.example.org" in problems[1]  # not docs.example.net (text), not localhost
    assert {reason_class(p) for p in problems} == {"build-time download (build_hosts)"}
    assert serve_downloads(build, BaseImages(DEFAULT_IMAGE_ALIASES, build_hosts=("*",))) == (
        [],
        [],
    )
    wild = BaseImages(DEFAULT_IMAGE_ALIASES, build_hosts=("*.example.com", "*.example.org"))
    (left,) = serve_downloads(build, wild)[0]  # *.domain: its subdomains, not the domain
    assert "downloads from example.com" in left
    # the aider_polyglot downloads are toolchains: none is refused for its host
    assert not _judge(_context(GO_TASK))[0]


def test_a_newer_tag_runs_where_the_declared_minimum_allows() -> None:
    build = {DOCKERFILE: "FROM golang:1.22\nWORKDIR /app\n", "go.mod": "module m\n\ngo 1.18\n"}
    problems, notes = serve_downloads(build, BASES)
    assert problems == [] and "go.mod `go 1.18` needs 1.18" in notes[0]
    assert _froms(build[DOCKERFILE]) == ["palaestra/golang:latest"]
    assert base_problems(build[DOCKERFILE], BASES) == ([], [])
    newer = {DOCKERFILE: "FROM golang:1.22\n", "go.mod": "module m\n\ngo 1.21\n"}
    assert serve_downloads(newer, BASES) == ([], [])  # left to the tag rule: refused there
    assert "asks for Go 1.22" in base_problems(newer[DOCKERFILE], BASES)[0][0]


def test_build_hosts_setting_defaults_to_the_package_registries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().build_hosts == list(DEFAULT_BUILD_HOSTS)
    monkeypatch.setenv("PALAESTRA_BUILD_HOSTS", "deb.debian.org,example.com")
    from palaestra.server.config import load_settings

    assert load_settings().build_hosts == ["deb.debian.org", "example.com"]


def test_the_import_writes_the_served_dockerfile_and_notes(tmp_path: Path) -> None:
    report = import_tasks("terminal-bench", GO_TASK, tmp_path / "pack")
    (notes,) = report.imported.values()
    assert any("served by palaestra/golang:latest" in n for n in notes), notes
    built = (tmp_path / "pack" / "tasks" / GO_TASK.name / "build" / DOCKERFILE).read_text()
    assert _froms(built) == ["palaestra/golang:latest"] and "golang.org" not in built


def test_a_version_the_stand_in_has_is_served_and_only_on_a_generic_base() -> None:
    run = "RUN curl -L https://go.dev/dl/go1.19.3.linux-amd64.tar.gz | tar -C /usr/local -xz\n"
    build = {DOCKERFILE: f"FROM python:3.11-slim AS build\n{run}FROM build\nRUN go version\n"}
    problems, notes = serve_downloads(build, BASES)
    assert problems == [] and "it asks for 1.19.3" in notes[0]
    assert _froms(build[DOCKERFILE]) == ["palaestra/golang:latest", "build"]
    # on a toolchain's own image the installer is a plain download: refused by its host
    other = {DOCKERFILE: "FROM node:18\nRUN curl https://sh.rustup.rs | sh -s -- -y\n"}
    (problem,) = serve_downloads(other, BASES)[0]
    assert "downloads from sh.rustup.rs" in problem


def test_a_launchpad_ppa_is_taken_out_on_the_debian_stand_in() -> None:
    """aider_polyglot's Python tasks add ppa:deadsnakes/ppa for python3.11 on Ubuntu jammy; the
    stand-in is Debian bookworm, whose own python3.11 serves the apt install that follows."""
    build = _context(FIXTURES / "tb-adapters" / "aider_polyglot-polyglot_python_robot-name")
    problems, notes = _judge(build)
    assert problems == ""
    assert "Launchpad PPA (ppa:deadsnakes/ppa)" in notes
    dockerfile = build[DOCKERFILE]
    assert "add-apt-repository" not in dockerfile and "ppa:" not in dockerfile
    assert "&& true" in dockerfile and "python3.11-venv" in dockerfile
    # on a base that is not a stand-in of ours, the Dockerfile is left as it is
    own = {DOCKERFILE: "FROM registry.example/ubuntu:22.04\nRUN add-apt-repository -y ppa:a/b\n"}
    assert _judge(own) == ("", "") and "ppa:a/b" in own[DOCKERFILE]


def test_a_crate_or_module_with_registry_dependencies_is_refused() -> None:
    """aider_polyglot's Rust `gigasecond` depends on the `time` crate, which `cargo test`
    would fetch from crates.io with no network: refused at import, not an oracle 0."""
    cargo = '[package]\nedition = "2021"\nname = "gigasecond"\n\n[dependencies]\ntime = "0.3"\n'
    go_mod = "module m\n\ngo 1.18\n\nrequire (\n\tgithub.com/a/b v1.2.3 // indirect\n)\n"
    for name, text, said in (
        ("workspace/Cargo.toml", cargo, "depends on crates (time)"),
        ("workspace/go.mod", go_mod, "requires modules (github.com/a/b)"),
    ):
        build = {DOCKERFILE: "FROM rust:1.63\nCOPY workspace/ /app/\n", name: text}
        problems, _ = _judge(build)
        assert said in problems and reason_class(problems) == "crate or module dependencies"
        # fetched into the image by the Dockerfile (its build then needs the registry)
        build[DOCKERFILE] += "RUN cd /app && cargo fetch && go mod download\n"
        assert _judge(build)[0] == ""
    local = cargo.replace('time = "0.3"', 'helper = { path = "../helper" }')
    assert _judge({DOCKERFILE: "FROM rust:1.63\n", "Cargo.toml": local}) == ("", "")
