"""A task as the server holds it: public fields the agent may see, private ones it never does."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.sdk.blobs import BlobSource
from palaestra.sdk.models import TaskInfo


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Task:
    """One verifiable problem. `ref` is `org/name@version:id`; `digest` covers every field."""

    id: str
    family: str
    domain: str
    split: str
    pack: str
    version: str
    public: dict[str, Any]
    private: dict[str, Any] = field(repr=False)
    difficulty: str = ""
    sealed: bool = False
    digest: str = ""
    # The held-out draw of a sealed generated task (server/draws.py); None for any other.
    draw: int | None = None
    # A family's typed views of the fields, validated once (envs/base.py `TaskFields.of`) and
    # kept as long as the task is: not a field of the task's content.
    views: dict[type, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    # Where the bytes of the binary files its `blobs` fields name live (its pack's blobs,
    # server/packs/blobs.py), set by the pack loader: not a field of the task's content.
    blob_source: BlobSource | None = field(default=None, repr=False, compare=False, hash=False)

    @property
    def ref(self) -> str:
        return f"{self.pack}@{self.version}:{self.id}"

    @staticmethod
    def compute_digest(
        family: str, domain: str, public: dict[str, Any], private: dict[str, Any]
    ) -> str:
        body = canonical_json(
            {"family": family, "domain": domain, "public": public, "private": private}
        )
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def blob_refs(self, folder: str) -> dict[str, str]:
        """The binary files of one of its file maps (`environment`, `verifier`, …):
        relative path -> `sha256:<hex>`."""
        out: dict[str, str] = {}
        for fields in (self.public, self.private):
            for key, ref in (fields.get("blobs") or {}).items():
                rel = key.removeprefix(f"{folder}/")
                if rel != key:
                    out[rel] = str(ref)
        return out

    def blobs_of(self, folder: str) -> dict[str, Path]:
        """The same files: relative path -> the file that holds its bytes."""
        source = self.blob_source
        if source is None:
            return {}
        refs = self.blob_refs(folder)
        return {rel: source.path(ref.removeprefix("sha256:")) for rel, ref in refs.items()}

    def info(self) -> TaskInfo:
        return TaskInfo(
            id=self.ref,
            family=self.family,
            domain=self.domain,
            split=self.split,
            difficulty=self.difficulty,
            public=self.public,
        )
