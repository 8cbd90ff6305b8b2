"""A pack author's binary files (blobs, server/packs/blobs.py) attacking the server at
publish, and a sealed task's blobs kept from train tokens and the agent.

Attacks on POST /v1/packs: a blob whose bytes are not its digest, blob names and task
references that climb out (`..`) or name folders, a blob over `max_pack_blob_bytes`, and
many small blobs to fill the disk (`max_pack_blobs_bytes`, each blob counted at least a
4 KiB block): each is refused with the contract's error naming what to fix, and nothing
of it stays in the store. A sealed task's verifier blob never reaches a train token (its
digest is a private field) nor the agent's sandbox; only its environment blob does.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings

from palaestra.sandbox.bwrap import bwrap_available
from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.archive import pack_archive

from .publishers import client, error, publish

OK, WHY = bwrap_available()
LIMIT = 64 * 1024
SECRET = b"\xffSEALED-BLOB-7c1e\x00" + bytes(range(256))
SHOWN = b"\x89PNG\r\n\x1a\n" + bytes(64)


def hexof(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "no-packs").mkdir()
    return make_settings(
        data_dir=tmp_path / "data",
        packs_dirs=[tmp_path / "no-packs"],
        pool_size=0,
        publish_check_tasks=0,
        max_pack_blob_bytes=LIMIT,
        max_pack_blobs_bytes=4 * LIMIT,
    )


def task(split: str = "train", public: dict[str, Any] | None = None,
         private: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    test_sh = 'cmp "$VERIFIER_DIR/secret.bin" secret.bin\n'
    return {
        "id": "t",
        "family": "terminal",
        "split": split,
        "public": {"instruction": "Write the file the tests want.", **(public or {})},
        "private": {"verifier": {"test.sh": test_sh}, **(private or {})},
    }


def pack_dir(root: Path, tasks: list[dict[str, Any]], blobs: dict[str, bytes]) -> Path:
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(
        'name = "acme/bin"\nversion = "1.0.0"\nfamilies = ["terminal"]\n\n'
        "[splits.train]\nsealed = false\n\n[splits.heldout]\nsealed = true\n"
    )
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (root / "blobs").mkdir()
    for name, data in blobs.items():
        (root / "blobs" / name).write_bytes(data)
    return root


def raw_archive(entries: dict[str, bytes]) -> bytes:
    """A tar.gz of exactly these entries (names as given, `..` included)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def stored(manager: EpisodeManager) -> list[Path]:
    packs = manager.settings.data_dir / "packs"
    return [p for p in packs.rglob("*") if p.is_file()] if packs.exists() else []


TOML = (
    b'name = "acme/bin"\nversion = "1.0.0"\nfamilies = ["terminal"]\n'
    b"[splits.train]\nsealed = false\n"
)
ref = f"sha256:{hexof(SHOWN)}"
# (the archive, the status, the error code, words the message must hold)
ATTACKS: list[tuple[str, Any, int, str, str]] = [
    ("tampered", lambda p: pack_archive(pack_dir(p, [task(public={"blobs": {
        "environment/a.png": ref}})], {hexof(SHOWN): SHOWN + b"!"})),
     400, "invalid_pack", "bytes do not match its digest"),
    ("not-a-digest-name", lambda p: pack_archive(pack_dir(p, [task()], {"evil.sh": SHOWN})),
     400, "invalid_pack", "named by the sha256 of its bytes"),
    ("dotdot-entry", lambda p: raw_archive({"pack.toml": TOML, "blobs/../../etc/x": SHOWN}),
     400, "invalid_archive", "'..' is refused"),
    ("folder-in-blobs", lambda p: raw_archive({"pack.toml": TOML, f"blobs/sub/{hexof(SHOWN)}":
     SHOWN, "tasks.jsonl": json.dumps(task()).encode() + b"\n"}),
     400, "invalid_pack", "blobs/ holds files only"),
    ("dotdot-reference", lambda p: pack_archive(pack_dir(p, [task(public={"blobs": {
        "environment/../../../etc/cron.d/x": ref}})], {hexof(SHOWN): SHOWN})),
     400, "invalid_pack", "public.blobs['environment/../../../etc/cron.d/x']"),
    ("unknown-reference", lambda p: pack_archive(pack_dir(p, [task(private={"blobs": {
        "verifier/x": "sha256:" + "a" * 64}})], {})),
     400, "invalid_pack", "is not a blob of this pack"),
    ("one-too-large", lambda p: pack_archive(pack_dir(p, [task()], {
        hexof(bytes(LIMIT + 1)): bytes(LIMIT + 1)})),
     413, "archive_too_large", f"is {LIMIT + 1} bytes, over the limit of {LIMIT} bytes"),
    ("many-small", lambda p: pack_archive(pack_dir(p, [task()], {
        hexof(i.to_bytes(2, "big")): i.to_bytes(2, "big") for i in range(70)})),
     413, "archive_too_large", "max_pack_blobs_bytes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "status", "code", "words"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS]
)
async def test_bad_blobs_are_refused_at_publish(
    manager: EpisodeManager, tmp_path: Path, make: Any, status: int, code: str, words: str
) -> None:
    async with client(manager, ["publish"], ("acme",)) as pub:
        reply = await publish(pub, make(tmp_path / "src"))
    got_status, got_code, message = error(reply)
    assert (got_status, got_code) == (status, code), reply.text
    assert words in message, message
    assert "acme/bin" not in {p.name for p in manager.packs.all()}
    assert stored(manager) == [], "a refused pack left files in the store"


@pytest.mark.skipif(not OK, reason=f"bwrap unavailable: {WHY}")
async def test_a_sealed_tasks_verifier_blob_reaches_neither_train_nor_the_agent(
    manager: EpisodeManager, tmp_path: Path
) -> None:
    sealed = task(
        "heldout",
        public={"blobs": {"environment/shown.png": f"sha256:{hexof(SHOWN)}"}},
        private={"blobs": {"verifier/secret.bin": f"sha256:{hexof(SECRET)}"}},
    )
    src = pack_dir(tmp_path / "src", [sealed], {hexof(SHOWN): SHOWN, hexof(SECRET): SECRET})
    async with client(manager, ["publish"], ("acme",)) as pub:
        assert (await publish(pub, pack_archive(src))).status_code == 201
    async with client(manager, ["train"]) as train:
        listed = await train.get("/v1/tasks", params={"pack": "acme/bin"})
        assert hexof(SECRET) not in listed.text, listed.text
        assert "secret.bin" not in listed.text, listed.text
        assert (await train.post("/v1/episodes", json={"task": "acme/bin:t"})).status_code == 403
        download = await train.get("/v1/packs/acme/bin/archive")
        assert download.status_code in (403, 404) and SECRET not in download.content
    async with client(manager, ["eval"]) as evaluator:
        started = await evaluator.post("/v1/episodes", json={"task": "acme/bin:t"})
        assert started.status_code == 200, started.text
        assert hexof(SECRET) not in started.text
        step = f"/v1/episodes/{started.json()['episode_id']}/step"
        hunt = (
            "sha256sum shown.png; grep -rla SEALED-BLOB-7c1e /work /tmp /home /var/tmp /dev/shm"
            " 2>/dev/null; echo hunted"
        )
        seen = await evaluator.post(
            step, json={"action": {"tool": "bash", "arguments": {"command": hunt}}}
        )
        output = seen.json()["observation"]["data"]["output"]
        assert hexof(SHOWN) in output and "hunted" in output
        assert output.strip().endswith("hunted") and output.count("\n") == 2, output
        # The verifier has it: writing the same bytes passes (so the blob is really there).
        write = "printf '\\377SEALED-BLOB-7c1e\\000' > secret.bin && python3 -c \"import sys;" \
            " sys.stdout.buffer.write(bytes(range(256)))\" >> secret.bin"  # fmt: skip
        await evaluator.post(
            step, json={"action": {"tool": "bash", "arguments": {"command": write}}}
        )
        ended = await evaluator.post(step, json={"action": {"tool": "submit", "arguments": {}}})
        assert ended.json()["reward"] == 1.0, ended.text
