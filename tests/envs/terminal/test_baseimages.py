"""Public base images without a registry (envs/terminal/baseimages.py), without an engine:
the default map sends each toolchain's images to its stand-in, a registry mirror replaces the
stand-ins, a tag asking for a newer toolchain than Debian bookworm's is refused (C/C++ noted),
and the import report names a task whose base image nothing here serves, counted by reason
(tests/fixtures/harbor-toolchains)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from palaestra.cli.envimages import Environment, stand_ins
from palaestra.cli.main import app
from palaestra.envs.terminal.baseimages import (
    BaseImages,
    base_problems,
    from_images,
    mirrored,
)
from palaestra.envs.terminal.envimage import rewrite_from
from palaestra.sandbox.docker.standins import DEFAULT_IMAGE_ALIASES, ON_DEMAND
from palaestra.server.config import Settings

FIXTURES = Path(__file__).parents[2] / "fixtures"
IMAGES = Path(__file__).parents[3] / "images"
BASES = BaseImages(DEFAULT_IMAGE_ALIASES)


def _why(dockerfile: str, bases: BaseImages = BASES) -> tuple[str, str]:
    problems, notes = base_problems(dockerfile, bases)
    return " | ".join(problems), " | ".join(notes)


def test_each_toolchain_has_a_stand_in_built_from_debian() -> None:
    want = {
        "golang:1.19": "golang", "golang:1.19-bookworm": "golang", "rust:1.63-slim": "rust",
        "node:18": "node", "node:18-bookworm-slim": "node", "openjdk:17-jdk-slim": "java",
        "eclipse-temurin:17": "java", "amazoncorretto:11": "java", "maven:3-openjdk-17": "java",
        "gcc:12": "gcc", "gcc:latest": "gcc", "ubuntu:22.04": "ubuntu", "debian:bookworm": "ubuntu",
        "python:3.11-slim": "python",
    }  # fmt: skip
    for ref, name in want.items():
        assert BASES.resolve(ref) == f"palaestra/{name}:latest", ref
        recipe = (IMAGES / name / "Dockerfile").read_text()
        assert "FROM palaestra/" in recipe and "apt-get install" in recipe
    assert set(ON_DEMAND) == {"gcc", "golang", "java", "node", "rust", "python3.13"}
    assert Settings().image_aliases == DEFAULT_IMAGE_ALIASES
    assert BASES.resolve("ziglang/zig:0.11") is None
    assert BASES.resolve("palaestra/base:bookworm") == "palaestra/base:bookworm"


def test_a_newer_toolchain_than_bookworms_is_refused_and_cc_noted() -> None:
    assert _why("FROM golang:1.19\n") == ("", "")
    refused = {
        "golang:1.22": "Go 1.22; its local stand-in has 1.19",
        "rust:1.75-slim-bookworm": "Rust 1.75; its local stand-in has 1.63",
        "node:20-bookworm": "Node.js 20; its local stand-in has 18",
        "eclipse-temurin:21-jdk": "Java (OpenJDK) 21; its local stand-in has 17",
    }
    for ref, asked in refused.items():
        problems, _ = _why(f"FROM {ref}\nWORKDIR /app\n")
        assert f"base image {ref} asks for {asked}" in problems
        assert "image_registry_mirror" in problems
    assert _why("FROM gcc:14\n") == ("", "base image gcc:14: runs on GCC 12")
    assert _why("FROM golang\n") == ("", "base image golang: runs on Go 1.19")
    assert _why("FROM maven:3.9-eclipse-temurin-17\n")[0] == ""  # Maven's version, noted
    # the operator's own image for that exact tag is theirs to vouch for
    own = BaseImages({**DEFAULT_IMAGE_ALIASES, "golang:1.22": "site/go:1.22"})
    assert _why("FROM golang:1.22\n", own) == ("", "")
    assert rewrite_from("FROM golang:1.22\n", own.aliases)[0] == "FROM site/go:1.22\n"


def test_a_base_with_no_stand_in_is_named_and_build_args_refused() -> None:
    problems, _ = _why("FROM ziglang/zig:0.11 AS build\nRUN true\nFROM build\nFROM node:18\n")
    assert problems == (
        "base image ziglang/zig:0.11 has no local stand-in (image_aliases) and no registry "
        "mirror is set (image_registry_mirror)"
    )
    assert from_images("FROM --platform=linux/amd64 a:1 AS x\nFROM x\nFROM b\n") == ["a:1", "b"]
    assert "build argument" in _why("ARG BASE=golang:1.22\nFROM ${BASE}\n")[0]


def test_a_registry_mirror_serves_every_public_image() -> None:
    assert (
        mirrored("golang:1.22", "mirror.internal:5000")
        == "mirror.internal:5000/library/golang:1.22"
    )
    assert mirrored("ziglang/zig:0.11", "m.example/hub/") == "m.example/hub/ziglang/zig:0.11"
    assert mirrored("ghcr.io/org/img:1", "m.example") == "m.example/ghcr.io/org/img:1"
    assert mirrored("docker.io/library/rust:1", "m.example") == "m.example/library/rust:1"
    bases = BaseImages(DEFAULT_IMAGE_ALIASES, "mirror.internal:5000")
    assert _why("FROM golang:1.22\nFROM ziglang/zig:0.11\n", bases) == ("", "")
    text, mapped = rewrite_from(
        "FROM golang:1.22 AS b\nFROM b\nFROM palaestra/base:bookworm\n",
        DEFAULT_IMAGE_ALIASES,
        "mirror.internal:5000",
    )
    assert text.splitlines() == [
        "FROM mirror.internal:5000/library/golang:1.22 AS b", "FROM b",
        "FROM palaestra/base:bookworm",
    ]  # fmt: skip
    assert mapped == ["golang:1.22 -> mirror.internal:5000/library/golang:1.22"]
    assert Settings(image_registry_mirror="mirror.internal:5000").image_registry_mirror
    for bad in ("https://m.example", "m.example/hub\nRUN id", "m example", "-m", "m:port"):
        with pytest.raises(ValidationError, match="host\\[:port\\]"):
            Settings(image_registry_mirror=bad)


def test_only_the_stand_ins_a_pack_uses_are_built() -> None:
    def env(dockerfile: str) -> Environment:
        return Environment({"Dockerfile": dockerfile}, "/app")

    envs = [env("FROM gcc:12\n"), env("FROM python:3.11-slim\n"), env("FROM zig:1\n")]
    assert stand_ins(Settings(), envs) == {"gcc", "python"}
    assert stand_ins(Settings(image_registry_mirror="m.example"), envs) == set()


def test_import_names_each_unserved_base_counted_by_reason(tmp_path: Path) -> None:
    out = tmp_path / "pack"
    src = FIXTURES / "harbor-toolchains"
    result = CliRunner().invoke(app, ["pack", "import", "harbor", str(src), str(out)])
    assert result.exit_code == 0, result.output
    assert (
        "5 imported, 2 skipped (1 × newer toolchain than its stand-in; "
        "1 × no stand-in for the base image)"
    ) in " ".join(result.output.split())
    report = json.loads((out / "import-report.json").read_text())
    skipped = {i["id"]: " ".join(i["reasons"]) for i in report["skipped"]}
    assert "base image ziglang/zig:0.11 has no local stand-in" in skipped["zig-hello"]
    assert "golang:1.22-bookworm asks for Go 1.22" in skipped["go-newer"]
    assert report["skipped_by_reason"] == {
        "newer toolchain than its stand-in": 1,
        "no stand-in for the base image": 1,
    }
    assert (out / "tasks" / "cpp-wordcount" / "build" / "Dockerfile").is_file()
