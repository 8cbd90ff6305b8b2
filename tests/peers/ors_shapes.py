"""Check palaestra's ORS answers against ors-sdk's own pydantic models (its venv).

    python ors_shapes.py ANSWERS_JSON

ANSWERS_JSON: {"call": RunToolOutput, "tools": ListToolsOutput, "splits": [Split]}.
Prints one JSON line: the models that accepted them, or the first error."""

from __future__ import annotations

import json
import sys

from ors.types import ListToolsOutput, RunToolOutput, Split
from pydantic import ValidationError


def main() -> None:
    answers = json.loads(sys.argv[1])
    try:
        call = RunToolOutput.model_validate(answers["call"]).root
        ListToolsOutput.model_validate(answers["tools"])
        for split in answers["splits"]:
            Split.model_validate(split)
    except ValidationError as exc:
        print(json.dumps({"error": str(exc)}))
        return
    blocks = [b.model_dump() for b in call.output.blocks] if call.ok else []
    print(json.dumps({"ok": call.ok, "blocks": blocks}))


if __name__ == "__main__":
    main()
