"""Binary files in packs (server/packs/blobs.py): content-addressed blobs named by a task's
`public.blobs` / `private.blobs`, deduplicated under `blobs/`, checked against their digest
and the size limits wherever a pack is loaded, and carried into a terminal task's
environment and verifier byte for byte."""

from __future__ import annotations

import hashlib
import io
import json
import sqlite3
import tarfile
from pathlib import Path
from typing import Any

import pytest

from palaestra.envs.terminal.importer import import_tasks
from palaestra.sdk.packwriter import write_blobs
from palaestra.server.packs.archive import extract_archive, pack_archive
from palaestra.server.packs.loader import load_pack
from palaestra.server.packs.lock import write_lock
from palaestra.server.packs.manifest import PackError
from palaestra.server.packs.taskfields import HostPolicy
from palaestra.verifiers.terminal import files_tar

# Bytes that are not UTF-8 (a PNG's signature and a NUL): a text file map cannot hold them.
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))


def sqlite_db(path: Path, rows: int = 3) -> bytes:
    with sqlite3.connect(path) as db:
        db.execute("create table t (n integer)")
        db.executemany("insert into t values (?)", [(i,) for i in range(rows)])
    return path.read_bytes()


def hexof(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def terminal_task(task_id: str = "t", **fields: Any) -> dict[str, Any]:
    public = {"instruction": "Look at the files.", **fields.pop("public", {})}
    private = {"verifier": {"test.sh": "exit 0\n"}, **fields.pop("private", {})}
    return {"id": task_id, "family": "terminal", "split": "train", "public": public,
            "private": private, **fields}  # fmt: skip


def compact_pack(root: Path, tasks: list[dict[str, Any]], blobs: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pack.toml").write_text(
        'name = "test/blobs"\nversion = "1.0.0"\nfamilies = ["terminal"]\n\n'
        "[splits.train]\nsealed = false\n"
    )
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    for name, data in blobs.items():
        (root / "blobs").mkdir(exist_ok=True)
        (root / "blobs" / name).write_bytes(data)
    return root


def test_a_compact_task_names_its_binary_files_by_digest(tmp_path: Path) -> None:
    ref = f"sha256:{hexof(PNG)}"
    task = terminal_task(
        public={"blobs": {"environment/img/logo.png": ref}},
        private={"blobs": {"verifier/expected.png": ref}},
    )
    pack = load_pack(compact_pack(tmp_path / "p", [task], {hexof(PNG): PNG}), ["terminal"])
    loaded = pack.tasks["t"]
    assert loaded.blobs_of("environment")["img/logo.png"].read_bytes() == PNG
    assert loaded.blobs_of("verifier")["expected.png"].read_bytes() == PNG
    assert loaded.blobs_of("solution") == {}
    assert pack.files[f"blobs/{hexof(PNG)}"] == ref  # the pack digest covers the bytes
    # The task digest covers the blob digest: other bytes, another task.
    other = bytes(reversed(PNG))
    task2 = terminal_task(public={"blobs": {"environment/img/logo.png": f"sha256:{hexof(other)}"}})
    task2["private"]["blobs"] = {"verifier/expected.png": ref}
    pack2 = load_pack(
        compact_pack(tmp_path / "q", [task2], {hexof(PNG): PNG, hexof(other): other}),
        ["terminal"],
    )
    assert pack2.tasks["t"].digest != loaded.digest and pack2.digest != pack.digest


def test_files_tar_carries_blobs_byte_exact(tmp_path: Path) -> None:
    blob = tmp_path / "b"
    blob.write_bytes(PNG)
    elf = tmp_path / "e"
    elf.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    data = files_tar({"a.txt": "hi\n"}, blobs={"img/logo.png": blob, "bin/tool": elf})
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile(members["img/logo.png"]).read() == PNG  # type: ignore[union-attr]
        assert members["img/logo.png"].mode == 0o644 and members["bin/tool"].mode == 0o755
        assert members["img"].isdir() and members["a.txt"].isfile()


def test_directory_form_binary_files_stay_in_place(tmp_path: Path) -> None:
    root = compact_pack(tmp_path / "p", [], {})
    (root / "tasks.jsonl").unlink()
    task = root / "tasks" / "t"
    (task / "environment").mkdir(parents=True)
    (task / "verifier").mkdir()
    (task / "task.toml").write_text('family = "terminal"\nsplit = "train"\n')
    (task / "instruction.md").write_text("Count the rows.\n")
    db = sqlite_db(task / "environment" / "data.db")
    (task / "environment" / "notes.txt").write_text("text stays text\n")
    (task / "verifier" / "test.sh").write_text("exit 0\n")
    loaded = load_pack(root, ["terminal"]).tasks["t"]
    assert loaded.public["blobs"] == {"environment/data.db": f"sha256:{hexof(db)}"}
    assert loaded.public["environment"] == {"notes.txt": "text stays text\n"}
    assert loaded.blobs_of("environment")["data.db"].read_bytes() == db
    assert "blobs" not in loaded.private  # no binary file: the field is absent
    write_lock(root)
    (task / "environment" / "data.db").write_bytes(db + b"x")  # the lock sees the change
    with pytest.raises(PackError, match=r"data\.db differs from its locked sha256"):
        load_pack(root, ["terminal"])


def test_the_writer_deduplicates_blobs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(PNG)
    b.write_bytes(PNG)
    refs = write_blobs(tmp_path / "out", {"environment/a.png": a, "verifier/b.png": b})
    assert set(refs.values()) == {f"sha256:{hexof(PNG)}"}
    assert [p.name for p in (tmp_path / "out" / "blobs").iterdir()] == [hexof(PNG)]


# (the task's blobs fields, the blobs/ files, the words the refusal must hold)
BAD: list[tuple[dict[str, Any], dict[str, bytes], str]] = [
    ({"public": {"blobs": {"environment/x": "sha256:" + "0" * 64}}}, {}, "not a blob of this pack"),
    ({"public": {"blobs": {"environment/x": "md5:abc"}}}, {}, "is not a blob reference"),
    ({"public": {"blobs": {"verifier/x": f"sha256:{hexof(PNG)}"}}}, {hexof(PNG): PNG},
     "must start with one of assets/, environment/"),
    ({"private": {"blobs": {"environment/x": f"sha256:{hexof(PNG)}"}}}, {hexof(PNG): PNG},
     "must start with one of build/, solution/, verifier/"),
    ({"public": {"blobs": {"environment/../../etc/x": f"sha256:{hexof(PNG)}"}}},
     {hexof(PNG): PNG}, "no '..'"),
    ({"public": {"blobs": ["environment/x"]}}, {}, "a table of"),
    ({}, {hexof(PNG): PNG + b"tampered"}, "bytes do not match its digest"),
    ({}, {"logo.png": PNG}, "named by the sha256 of its bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "blobs", "words"), BAD)
def test_bad_blobs_are_refused_naming_what_to_fix(
    tmp_path: Path, fields: dict[str, Any], blobs: dict[str, bytes], words: str
) -> None:
    task = terminal_task()
    for side, values in fields.items():
        task[side].update(values)
    with pytest.raises(PackError, match=words.replace("(", r"\(").replace(".", r"\.")):
        load_pack(compact_pack(tmp_path / "p", [task], blobs), ["terminal"])


def test_size_limits_name_the_file_its_size_and_the_setting(tmp_path: Path) -> None:
    big = bytes(range(256)) * 40  # 10240 bytes
    task = terminal_task(public={"blobs": {"environment/big.bin": f"sha256:{hexof(big)}"}})
    root = compact_pack(tmp_path / "p", [task], {hexof(big): big})
    narrow = HostPolicy.default()
    one = HostPolicy(narrow.images, narrow.toolchains, max_blob_bytes=10_000)
    with pytest.raises(PackError) as info:
        load_pack(root, ["terminal"], one)
    assert f"blobs/{hexof(big)}: the blob is 10240 bytes" in str(info.value)
    assert "max_pack_blob_bytes" in str(info.value)
    # Many small blobs: each counts a 4 KiB block against the pack's total.
    smalls = {hexof(bytes([i])): bytes([i]) for i in range(10)}
    small_task = terminal_task(
        public={"blobs": {f"environment/{i}": f"sha256:{h}" for i, h in enumerate(smalls)}}
    )
    root = compact_pack(tmp_path / "q", [small_task], smalls)
    total = HostPolicy(narrow.images, narrow.toolchains, max_blobs_bytes=9 * 4096)
    with pytest.raises(PackError, match=r"come to 40960 bytes \(10 blobs.*max_pack_blobs_bytes"):
        load_pack(root, ["terminal"], total)
    assert load_pack(root, ["terminal"]).tasks["t"].public["blobs"]  # the defaults take it


def test_the_extractor_applies_the_blob_limits_before_the_bytes_land(tmp_path: Path) -> None:
    from palaestra.server.packs.archive import ArchiveLimits, ArchiveTooLarge

    smalls = {hexof(bytes([i])): bytes([i]) for i in range(10)}
    data = pack_archive(compact_pack(tmp_path / "p", [terminal_task()], smalls))
    with pytest.raises(ArchiveTooLarge, match="max_pack_blobs_bytes"):
        extract_archive(data, tmp_path / "x", ArchiveLimits(max_blobs=9 * 4096))
    assert len(list((tmp_path / "x" / "blobs").iterdir())) <= 9
    with pytest.raises(ArchiveTooLarge, match=r"the blob is 1 bytes.*max_pack_blob_bytes"):
        extract_archive(data, tmp_path / "y", ArchiveLimits(max_blob=0))
    root = extract_archive(data, tmp_path / "z")
    assert {p.name for p in (root / "blobs").iterdir()} == set(smalls)


def harbor_task(src: Path, blob: bytes, big: bytes = b"") -> Path:
    folder = src / "bin-task"
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n')
    (folder / "instruction.md").write_text("Copy logo.png to out.png.\n")
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY logo.png /app/logo.png\n"
    )
    (folder / "environment" / "logo.png").write_bytes(blob)
    (folder / "tests" / "expected.png").write_bytes(blob + big)
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\ncmp /app/out.png /tests/expected.png && echo 1 > /logs/verifier/reward.txt"
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\ncp /app/logo.png /app/out.png\n")
    return folder


def test_the_importer_keeps_binary_files_as_blobs(tmp_path: Path) -> None:
    harbor_task(tmp_path / "src", PNG)
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out", name="test/bin")
    assert list(report.imported) == ["bin-task"], report.skipped
    assert [p.name for p in (tmp_path / "out" / "blobs").iterdir()] == [hexof(PNG)]  # one copy
    task = load_pack(tmp_path / "out", ["terminal"]).tasks["bin-task"]
    assert task.blobs_of("environment")["logo.png"].read_bytes() == PNG
    assert task.blobs_of("verifier")["tests/expected.png"].read_bytes() == PNG


def test_the_importer_refuses_a_binary_file_over_the_limit(tmp_path: Path) -> None:
    harbor_task(tmp_path / "src", PNG, big=bytes(5000))
    report = import_tasks(
        "harbor", tmp_path / "src", tmp_path / "out", name="test/bin", max_blob_bytes=5000
    )
    (reason,) = report.skipped["bin-task"]
    size = len(PNG) + 5000
    assert f"verifier/tests/expected.png (from expected.png) is {size} bytes" in reason
    assert "over the limit of 5000 bytes" in reason and "max_pack_blob_bytes" in reason
    report = import_tasks(
        "harbor", tmp_path / "src", tmp_path / "out2", name="test/bin", max_blobs_bytes=4096
    )
    assert "max_pack_blobs_bytes" in report.skipped["bin-task"][0]


def test_a_build_contexts_binary_files_are_blobs_that_name_its_image(tmp_path: Path) -> None:
    from palaestra.envs.terminal.envimage import image_name, write_context
    from palaestra.envs.terminal.family import TerminalFamily
    from palaestra.envs.terminal.fields import TerminalPrivate

    folder = harbor_task(tmp_path / "src", PNG)
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim-bookworm\nRUN apt-get update && apt-get install -y cowsay\n"
        "WORKDIR /app\nCOPY logo.png /app/logo.png\n"
    )
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out", name="test/bin")
    assert list(report.imported) == ["bin-task"], report.skipped
    task = load_pack(tmp_path / "out", ["terminal"]).tasks["bin-task"]
    build = TerminalPrivate.of(task).build
    assert "Dockerfile" in build and "logo.png" not in build  # text map: text only
    assert task.blob_refs("build") == {"logo.png": f"sha256:{hexof(PNG)}"}
    assert task.blobs_of("environment") == {}  # the image holds the environment
    image = TerminalFamily().sandbox_spec(task).image  # type: ignore[union-attr]
    assert image == image_name(build, task.blob_refs("build")) != image_name(build)
    write_context(build, tmp_path / "ctx", "/app", task.blobs_of("build"))
    assert (tmp_path / "ctx" / "logo.png").read_bytes() == PNG


def test_harbor_export_writes_the_bytes_and_imports_back(tmp_path: Path) -> None:
    from palaestra.envs.terminal.harbor.writer import export_tasks

    harbor_task(tmp_path / "src", PNG)
    import_tasks("harbor", tmp_path / "src", tmp_path / "out", name="test/bin")
    task = load_pack(tmp_path / "out", ["terminal"]).tasks["bin-task"]
    report = export_tasks([task], tmp_path / "harbor", pack="test/bin", version="1.0.0")
    assert list(report.exported) == ["bin-task"], report.skipped
    written = [p for p in (tmp_path / "harbor" / "bin-task").rglob("*") if p.is_file()]
    assert sum(p.read_bytes() == PNG for p in written) == 2  # environment and tests
    again = import_tasks("harbor", tmp_path / "harbor", tmp_path / "back", name="test/bin")
    assert list(again.imported) == ["bin-task"], again.skipped
    back = load_pack(tmp_path / "back", ["terminal"]).tasks["bin-task"]
    assert back.public["blobs"] == task.public["blobs"]
    assert back.private["blobs"] == task.private["blobs"]


def test_a_large_text_file_stays_text_and_a_large_binary_one_is_refused(tmp_path: Path) -> None:
    root = compact_pack(tmp_path / "p", [], {})
    (root / "tasks.jsonl").unlink()
    task = root / "tasks" / "t"
    (task / "environment").mkdir(parents=True)
    (task / "task.toml").write_text(
        'family = "terminal"\nsplit = "train"\n[private.verifier]\n"test.sh" = "exit 0"\n'
    )
    (task / "environment" / "log.txt").write_text("é" * 3000)  # 6000 bytes of text
    base = HostPolicy.default()
    small = HostPolicy(base.images, base.toolchains, max_blob_bytes=5000)
    loaded = load_pack(root, ["terminal"], small).tasks["t"]
    assert loaded.public["environment"]["log.txt"] == "é" * 3000
    (task / "environment" / "big.bin").write_bytes(PNG * 40)
    with pytest.raises(PackError) as info:
        load_pack(root, ["terminal"], small)
    assert f"big.bin: the file is {len(PNG) * 40} bytes, over the limit of 5000" in str(info.value)
    assert "max_pack_blob_bytes" in str(info.value)


def test_a_terminal_bench_task_keeps_its_binary_files(tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "src" / "grep-errors"
    fixture = Path(__file__).parents[2] / "fixtures" / "terminal-bench" / "grep-errors"
    shutil.copytree(fixture, src)
    (src / "logs" / "server.db").write_bytes(PNG)
    with (src / "Dockerfile").open("a") as dockerfile:
        dockerfile.write("COPY logs/server.db /app/logs/server.db\n")
    (src / "tests" / "golden.bin").write_bytes(PNG[::-1])
    report = import_tasks("terminal-bench", tmp_path / "src", tmp_path / "out", name="t/b")
    assert list(report.imported) == ["grep-errors"], report.skipped
    task = load_pack(tmp_path / "out", ["terminal"]).tasks["grep-errors"]
    assert task.blobs_of("environment")["logs/server.db"].read_bytes() == PNG
    assert task.blobs_of("verifier")["tests/golden.bin"].read_bytes() == PNG[::-1]


def test_a_harbor_solutions_binary_file_is_carried_by_the_oracle(tmp_path: Path) -> None:
    import subprocess

    from palaestra.envs.terminal.family import TerminalFamily

    folder = harbor_task(tmp_path / "src", PNG)
    (folder / "solution" / "answer.png").write_bytes(PNG[::-1])
    (folder / "solution" / "note.txt").write_text("text too\n")  # (lost before: not exported)
    (folder / "solution" / "solve.sh").write_text(
        "#!/bin/bash\ncp /solution/answer.png out.png\ncp /solution/note.txt note.txt\n"
    )
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out", name="test/bin")
    assert list(report.imported) == ["bin-task"], report.skipped
    task = load_pack(tmp_path / "out", ["terminal"]).tasks["bin-task"]
    command = TerminalFamily().oracle(task)[0].arguments["command"]
    (tmp_path / "run").mkdir()
    subprocess.run(["bash", "-c", command], cwd=tmp_path / "run", check=True, timeout=30)
    assert (tmp_path / "run" / "out.png").read_bytes() == PNG[::-1]
    assert (tmp_path / "run" / "note.txt").read_text() == "text too\n"
    # Too large for the oracle's one command: refused at import, naming why.
    (folder / "solution" / "answer.png").write_bytes(bytes(200_000))
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out2", name="test/bin")
    assert "over the 190000 one oracle command may carry" in report.skipped["bin-task"][0]
