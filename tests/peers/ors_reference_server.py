"""Serve an environment with the `ors-sdk` package's own reference server (`ors.Server`) on
loopback: a third-party ORS server for `palaestra conformance --protocol ors`
(tests/server/doors/test_door_nemo_gym.py).

    python ors_reference_server.py PORT

Its environment `echoenv` has one task (`echoenv:0`) and one tool, `echo`, that counts its
calls in the reply, so a call run twice shows."""

from __future__ import annotations

import sys

from ors.environment import Environment, tool
from ors.server import Server
from ors.types import TextBlock, ToolOutput
from pydantic import BaseModel


class EchoArgs(BaseModel):
    text: str = ""


class echoenv(Environment):  # ORS names an environment by its class
    def __init__(self, task_spec: dict | None = None, secrets: dict | None = None) -> None:
        super().__init__(task_spec or {}, secrets or {})
        self.calls = 0

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"say something (task {self.task_spec.get('id')})")]

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"id": "echoenv:0"}]

    @tool
    def echo(self, args: EchoArgs) -> ToolOutput:
        self.calls += 1
        return ToolOutput(blocks=[TextBlock(text=f"{args.text} #{self.calls}")], reward=0.0)


if __name__ == "__main__":
    Server([echoenv]).run(host="127.0.0.1", port=int(sys.argv[1]))
