"""An OpenAI-compatible server over `HFBackend`: `/v1/chat/completions` and `/v1/completions`.

`python -m palaestra.sdk.train.openai_server --model DIR --port N` serves a transformers
model directory (its tokenizer and chat template included) on 127.0.0.1. Replies carry
what vLLM's server adds for token-exact training: `prompt_token_ids` and `token_ids`, and
with `return_tokens_as_token_ids` logprob tokens spelled `token_id:<id>`, so
`CompletionsBackend`, `ChatPolicy` (`--policy openai`) and any OpenAI client can use it.
Tool calls are parsed from the model's hermes output (`<tool_call>{json}</tool_call>`).
`stream: true` answers server-sent events in OpenAI's chunk shape; the reply is generated
whole first (HFBackend is not incremental), then sent a token a chunk.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from palaestra.sdk.train.backends import HFBackend
from palaestra.sdk.train.types import Generation, SamplingParams

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = ""
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = 1.0
    n: int = 1
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # torch's range
    stop_token_ids: list[int] = []
    logprobs: Any = None
    stream: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    logprobs: bool = False
    top_logprobs: int = 0


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0)


class RequestError(Exception):
    """A request the server refuses, answered as OpenAI's error object."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def _utf8(name: object) -> bool:
    """A str that UTF-8 can write: a lone surrogate (`"\\ud800"` in the model's JSON) would
    make the reply unencodable, a 500 the model's own text caused."""
    if not isinstance(name, str):
        return False
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Hermes tool calls in `text`: (the content outside them or None, OpenAI tool_calls).
    A block whose JSON is not `{"name": str, "arguments": object}` stays in the content."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if not isinstance(call, dict) or not _utf8(call.get("name")):
            continue
        if not isinstance(arguments, dict):
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(arguments)},
            }
        )
    kept.append(text[last:])
    content = "".join(kept).strip()
    return (content or None), calls


class OpenAIServer:
    """The routes over one backend and its tokenizer (a transformers tokenizer)."""

    def __init__(self, backend: HFBackend, tokenizer: Any, model_name: str) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.created = int(time.time())

    def app(self, api_key: str | None = None) -> FastAPI:
        app = FastAPI(title=f"palaestra OpenAI-compatible server ({self.model_name})")

        @app.middleware("http")
        async def _auth(request: Request, call_next: Any) -> Any:
            wanted = f"Bearer {api_key}"
            guarded = api_key and request.url.path.startswith("/v1/")
            if guarded and request.headers.get("authorization") != wanted:
                return _error("invalid API key", None, 401, "invalid_api_key")
            return await call_next(request)

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            card = {"id": self.model_name, "object": "model", "created": self.created}
            return {"object": "list", "data": [{**card, "owned_by": "palaestra"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await self._answer(request, ChatRequest, self.chat)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            return await self._answer(request, CompletionRequest, self.complete)

        return app

    async def _answer(self, request: Request, kind: type[_Sampling], handler: Any) -> Any:
        try:
            body = await request.json()
        except ValueError:
            return _error("the request body is not JSON", None)
        try:
            parsed = kind.model_validate(body)
            self._check(parsed)
            reply = await handler(parsed)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"])
            return _error(f"{param}: {first['msg']}", param)
        except RequestError as exc:
            return _error(str(exc), exc.param, exc.status)
        if parsed.stream:
            chunks = _chat_chunks(reply) if kind is ChatRequest else _completion_chunks(reply)
            return StreamingResponse(_sse(chunks), media_type="text/event-stream")
        return reply

    def _check(self, request: _Sampling) -> None:
        if request.model and request.model != self.model_name:
            raise RequestError(
                f"model {request.model!r} is not served here (this serves {self.model_name!r})",
                "model",
                404,
            )
        if request.n != 1:
            raise RequestError("n must be 1 (one choice a request)", "n")
        if request.top_p != 1.0:
            raise RequestError("top_p must be 1.0: the HF backend samples the full distribution")

    async def _generate(self, request: _Sampling, prompt_ids: list[int]) -> Generation:
        stops = {*request.stop_token_ids}
        if self.tokenizer.eos_token_id is not None:
            stops.add(int(self.tokenizer.eos_token_id))
        params = SamplingParams(
            max_tokens=request.max_completion_tokens or request.max_tokens or 256,
            temperature=request.temperature,
            stop_token_ids=tuple(sorted(stops)),
            seed=request.seed,
        )
        vocab = len(self.tokenizer)
        if any(not 0 <= i < vocab for i in prompt_ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
        context = getattr(self.backend.model.config, "max_position_embeddings", None)
        if context and len(prompt_ids) + params.max_tokens > context:
            raise RequestError(
                f"{len(prompt_ids)} prompt tokens + max_tokens {params.max_tokens} exceed the "
                f"model's context of {context} tokens",
                "max_tokens",
            )
        return await self.backend.generate(prompt_ids, params)

    def _token(self, token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else str(self.tokenizer.decode([token_id]))

    def _usage(self, prompt: list[int], out: Generation) -> dict[str, int]:
        total = len(prompt) + len(out.ids)
        return {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out.ids),
            "total_tokens": total,
        }

    async def chat(self, request: ChatRequest) -> dict[str, Any]:
        if request.tool_choice not in ("auto", "none", None):
            raise RequestError("tool_choice must be 'auto' or 'none'", "tool_choice")
        tools = request.tools if request.tool_choice != "none" else None
        try:
            text = self.tokenizer.apply_chat_template(
                request.messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja raises many kinds; the message names the cause
            raise RequestError(
                f"messages: the chat template refused them: {exc}", "messages"
            ) from None
        prompt = list(self.tokenizer.encode(text, add_special_tokens=False))
        out = await self._generate(request, prompt)
        reply = self.tokenizer.decode(out.ids, skip_special_tokens=True)
        content, calls = parse_tool_calls(reply) if tools else (reply, [])
        message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": calls}
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": "tool_calls" if calls else out.finish_reason,
            "token_ids": out.ids,
            "logprobs": None,
        }
        if request.logprobs:
            choice["logprobs"] = {
                "content": [
                    {
                        "token": (tok := self._token(i, request.return_tokens_as_token_ids)),
                        "logprob": lp,
                        "bytes": list(tok.encode()),
                        "top_logprobs": [],
                    }
                    for i, lp in zip(out.ids, out.logprobs, strict=True)
                ]
            }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "prompt_token_ids": prompt,
            "usage": self._usage(prompt, out),
        }

    async def complete(self, request: CompletionRequest) -> dict[str, Any]:
        if isinstance(request.prompt, str):
            prompt = list(self.tokenizer.encode(request.prompt, add_special_tokens=False))
        else:
            prompt = list(request.prompt)
        if not prompt:
            raise RequestError("prompt is empty", "prompt")
        out = await self._generate(request, prompt)
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.tokenizer.decode(out.ids, skip_special_tokens=True),
            "finish_reason": out.finish_reason,
            "token_ids": out.ids,
            "prompt_token_ids": prompt,
            "logprobs": None,
        }
        if request.logprobs is not None:
            tokens = [self._token(i, request.return_tokens_as_token_ids) for i in out.ids]
            offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": out.logprobs,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, out.logprobs, strict=True)],
                "text_offset": offsets,
            }
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": self._usage(prompt, out),
        }


def _error(
    message: str, param: str | None, status: int = 400, code: str | None = None
) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    error = {"message": message, "type": kind, "param": param, "code": code or status}
    return JSONResponse({"error": error}, status_code=status)


def _chat_chunks(reply: dict[str, Any]) -> Iterator[dict[str, Any]]:
    choice = reply["choices"][0]
    head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    first = {"role": "assistant", "content": ""}
    yield head | {
        "choices": [{"index": 0, "delta": first}],
        "prompt_token_ids": reply["prompt_token_ids"],
    }
    message = choice["message"]
    if message["tool_calls"]:
        calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
        yield head | {
            "choices": [
                {"index": 0, "delta": {"tool_calls": calls}, "token_ids": choice["token_ids"]}
            ]
        }
    else:
        for token_id in choice["token_ids"]:
            yield head | {"choices": [{"index": 0, "delta": {}, "token_ids": [token_id]}]}
        yield head | {"choices": [{"index": 0, "delta": {"content": message["content"] or ""}}]}
    last = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
    yield head | {"choices": [last], "usage": reply["usage"]}


def _completion_chunks(reply: dict[str, Any]) -> Iterator[dict[str, Any]]:
    choice = reply["choices"][0]
    head = {k: reply[k] for k in ("id", "object", "created", "model")}
    lps = choice["logprobs"]
    for k, token_id in enumerate(choice["token_ids"]):
        part: dict[str, Any] = {"index": 0, "text": "", "token_ids": [token_id]}
        if k == 0:
            part["prompt_token_ids"] = choice["prompt_token_ids"]
        if lps is not None:
            part["logprobs"] = {
                key: [lps[key][k]] for key in ("tokens", "token_logprobs", "top_logprobs")
            }
        yield head | {"choices": [part]}
    last = {"index": 0, "text": choice["text"], "finish_reason": choice["finish_reason"]}
    yield head | {"choices": [last], "usage": reply["usage"]}


async def _sse(chunks: Iterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a transformers model directory")
    parser.add_argument("--served-model-name", default=None, help="default: the directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY`")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    import uvicorn
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).to(args.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    backend = HFBackend(model, pad_token_id=int(pad), max_batch=args.max_batch)
    server = OpenAIServer(backend, tokenizer, args.served_model_name or args.model)
    uvicorn.run(server.app(args.api_key), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
