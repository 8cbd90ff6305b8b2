"""The real model server (palaestra.sdk.train.openai_server over HFBackend) that also writes
down, one JSON line per chat completion, the token ids it generated: what a harness
episode's trajectory must hold exactly.

    python recording_model_server.py --model DIR --served-model-name NAME --port N --record F
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from palaestra.sdk.train.backends import HFBackend
from palaestra.sdk.train.openai_server import ChatRequest, OpenAIServer


class RecordingServer(OpenAIServer):
    def __init__(self, record: Path, *args: Any) -> None:
        super().__init__(*args)
        self.record = record

    async def chat(self, request: ChatRequest) -> dict[str, Any]:
        reply = await super().chat(request)
        line = {
            "prompt_token_ids": reply["prompt_token_ids"],
            "token_ids": reply["choices"][0]["token_ids"],
        }
        with self.record.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        return reply


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()

    import uvicorn
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    backend = HFBackend(model, pad_token_id=int(tokenizer.pad_token_id or 0))
    server = RecordingServer(args.record, backend, tokenizer, args.served_model_name)
    uvicorn.run(server.app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
