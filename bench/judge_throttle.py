"""Judge throughput under the shared gate (issue 21): N concurrent episodes each scoring
candidates with the rubric judge (palaestra.verifiers.judge.score_rubric) against an endpoint
that answers 429 with Retry-After for a fraction of calls, through palaestra's JudgeEndpoint
(one cap, shared cool-down, retry budget) beside a naive peer in the same run (a JudgeChat
whose every call retries on its own: honours Retry-After for itself, no cap, no shared
cool-down; the usual SDK loop). Both speak through the same HTTP client (sdk/http11.py), so
the difference is the gate.

The endpoint is a SCRIPTED FAKE (tests/judge_endpoint_fakes.py), in this process on loopback:
it answers after `--latency` seconds, and a 429 for `--fraction` of the requests it gets
outside a window; each 429 announces a window of `--retry-after` seconds (`retry-after-ms`,
and `Retry-After` in whole seconds), inside which it answers every request 429, as a real
rate limiter does. It counts the requests that arrive inside an announced window: "crossed"
within `--grace` (20 ms) of the announcement, on their way before the client could read the
429 (this process runs client and fake on one loop), "storm" after that (requests a client
had been told not to send); and the most requests in flight at once.

Scenarios: `--fraction 0.05,0.2` (one table each). palaestra runs with `--retry-ratio 1.0`
(an endpoint refusing 20% needs at least 0.25 retries a call; the default 0.2 would void
calls, which is what the budget is for). The naive peer retries up to 20 times a call.

Figures per client: requests made, retries, 429s, storm requests, failed calls, p50/p99
verdict latency (one `complete`, retries and waits included), most in flight vs the cap,
verdicts/s, and the process's CPU per request (client and fake together: both run here).

    .venv/bin/python bench/judge_throttle.py            # 256 episodes x 2 calls
    .venv/bin/python bench/judge_throttle.py --quick    # 64 episodes x 1 call
    options: --episodes N --calls N --cap N --latency S --fraction F[,F] --retry-after S
             --retry-ratio R --grace S --json PATH
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the fake lives with the tests, which use it too

from palaestra.sdk.http11 import Target, UpstreamPool  # noqa: E402
from palaestra.verifiers.judge import JudgeConfig, Rubric, Subject, score_rubric  # noqa: E402
from palaestra.verifiers.judge_endpoint import (  # noqa: E402
    EndpointConfig,
    JudgeEndpoint,
    retry_after_s,
)
from palaestra.verifiers.judge_protocol import (  # noqa: E402
    JudgeChat,
    JudgeSampling,
    JudgeUnavailable,
)
from tests.judge_endpoint_fakes import ScriptedJudge  # noqa: E402
from tests.judge_fakes import rubric_reply  # noqa: E402  (a well-formed rubric verdict)

RUBRIC = Rubric.from_toml(
    'name = "bench"\n\n[[criteria]]\nname = "grounded"\n'
    'text = "Every figure is the reference\'s."\nchoices = ["no", "partly", "yes"]\n',
    "bench.toml",
)
CONFIG = JudgeConfig(judge="bench", sampling=JudgeSampling(max_tokens=256))
NAIVE_RETRIES = 20  # generous, so the naive peer finishes too


def subject(episode: int, call: int) -> Subject:
    return Subject(
        task="Comment on the quarter's revenue.",
        reference="Revenue rose 12% to $4.1bn.",
        candidate=f"Revenue grew 12%, to $4.1bn (episode {episode}, call {call}).",
    )


def fair_judge(body: dict[str, Any]) -> str:
    """The fake's answer: a well-formed rubric verdict (the best choice each time)."""
    return rubric_reply(body, lambda _name, choices, _text: choices[-1])


@dataclass
class Figures:
    client: str
    requests: int = 0
    retries: int = 0
    rate_limited: int = 0
    storm: int = 0
    crossed: int = 0
    failed: int = 0
    p50_s: float = 0.0
    p99_s: float = 0.0
    max_in_flight: int = 0
    cap: int | None = None
    verdicts_per_s: float = 0.0
    wall_s: float = 0.0
    cpu_us_per_request: float = 0.0
    latencies: list[float] = field(default_factory=list, repr=False)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class Retries:
    """The palaestra endpoint's retries, counted through its recorder."""

    def __init__(self) -> None:
        self.count = 0

    def request(self, endpoint: str, outcome: str) -> None:
        pass

    def retry(self, endpoint: str) -> None:
        self.count += 1

    def call(self, endpoint: str, latency_s: float, failure: str | None) -> None:
        pass

    def in_flight(self, endpoint: str, delta: int) -> None:
        pass


class NaiveChat:
    """The peer as a `JudgeChat`: every call retries on its own (Retry-After honoured for
    itself, else exponential backoff), no cap, nothing shared between callers."""

    def __init__(self, url: str, out: Figures) -> None:
        self.name, self.model = "bench", "judge"
        self._target = Target.parse(f"{url}/chat/completions")
        self._pool = UpstreamPool(connect_timeout_s=10.0)
        self._out = out

    async def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        sampling: JudgeSampling,
        *,
        schema: Mapping[str, Any] | None = None,
    ) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        body.update(temperature=sampling.temperature, max_tokens=sampling.max_tokens)
        if schema is not None:
            spec = {"name": "verdict", "schema": dict(schema), "strict": True}
            body["response_format"] = {"type": "json_schema", "json_schema": spec}
        payload = json.dumps(body).encode()
        for attempt in range(NAIVE_RETRIES + 1):
            reply = await self._pool.post(self._target, payload, 1 << 20)
            if reply.status == 200:
                text: str = json.loads(reply.body)["choices"][0]["message"]["content"]
                return text
            if attempt < NAIVE_RETRIES:
                self._out.retries += 1
                wait = retry_after_s(reply.headers)
                await asyncio.sleep(wait if wait is not None else 0.5 * 2**attempt)
        raise JudgeUnavailable(self.name, f"HTTP {reply.status} after {NAIVE_RETRIES} retries")

    async def aclose(self) -> None:
        await self._pool.aclose()


async def episodes(chat: JudgeChat, args: argparse.Namespace, out: Figures) -> None:
    """`args.episodes` concurrent episodes, each scoring `args.calls` candidates in turn."""

    async def episode(n: int) -> None:
        for call in range(args.calls):
            started = time.monotonic()
            try:
                verdict = await score_rubric(chat, RUBRIC, subject(n, call), CONFIG)
                assert verdict.score == 1.0, verdict
            except JudgeUnavailable:
                out.failed += 1
            out.latencies.append(time.monotonic() - started)

    await asyncio.gather(*(episode(n) for n in range(args.episodes)))


async def ours(fake: ScriptedJudge, args: argparse.Namespace, out: Figures) -> None:
    retries = Retries()
    config = EndpointConfig(
        name="bench",
        url=fake.url,
        model="judge",
        max_concurrency=args.cap,
        deadline_s=300.0,
        max_retries=NAIVE_RETRIES,
        retry_ratio=args.retry_ratio,
        timeout_s=60.0,
    )
    judge = JudgeEndpoint(config, recorder=retries)
    try:
        await episodes(judge, args, out)
    finally:
        await judge.aclose()
    out.retries, out.cap = retries.count, args.cap


async def naive(fake: ScriptedJudge, args: argparse.Namespace, out: Figures) -> None:
    chat = NaiveChat(fake.url, out)
    try:
        await episodes(chat, args, out)
    finally:
        await chat.aclose()


async def measure(name: str, args: argparse.Namespace, fraction: float) -> Figures:
    out = Figures(name)
    fake = ScriptedJudge(
        latency_s=args.latency,
        rate_limit_fraction=fraction,
        retry_after_s=args.retry_after,
        seed=args.seed,
        answer=fair_judge,
        keep_bodies=False,
        grace_s=args.grace,
    )
    async with fake:
        cpu, started = time.process_time(), time.monotonic()
        await (ours if name == "palaestra" else naive)(fake, args, out)
        out.wall_s = time.monotonic() - started
        cpu = time.process_time() - cpu
    out.requests, out.rate_limited = fake.requests, fake.statuses[429]
    out.storm, out.crossed = fake.during_window, fake.crossed
    out.max_in_flight = fake.max_in_flight
    out.p50_s, out.p99_s = pct(out.latencies, 0.5), pct(out.latencies, 0.99)
    out.verdicts_per_s = (len(out.latencies) - out.failed) / out.wall_s
    out.cpu_us_per_request = cpu / max(1, out.requests) * 1e6
    done = f"{name} at {fraction:.0%}: {out.requests} requests in {out.wall_s:.1f} s"
    print(done, file=sys.stderr)
    return out


def report(args: argparse.Namespace, fraction: float, runs: list[Figures]) -> dict[str, Any]:
    verdicts = args.episodes * args.calls
    print()
    print(
        f"{args.episodes} episodes x {args.calls} judge calls = {verdicts} verdicts; fake judge "
        f"(scripted): {args.latency * 1000:.0f} ms a reply, 429 for {fraction:.0%} of "
        f"requests outside a window, each opening a {args.retry_after:g} s window"
    )
    print()
    print("| client | requests | retries | 429s | storm | crossed | failed | p50 s | p99 s | "
          "max in flight | verdicts/s | CPU µs/request |")  # fmt: skip
    print("| ------ | -------- | ------- | ---- | ----- | ------- | ------ | ----- | ----- | "
          "------------- | ---------- | -------------- |")  # fmt: skip
    for f in runs:
        flight = f"{f.max_in_flight}" + (f" (cap {f.cap})" if f.cap else " (no cap)")
        print(f"| {f.client} | {f.requests} | {f.retries} | {f.rate_limited} | {f.storm} | "
              f"{f.crossed} | {f.failed} | {f.p50_s:.3f} | {f.p99_s:.3f} | {flight} | "
              f"{f.verdicts_per_s:.1f} | {f.cpu_us_per_request:.0f} |")  # fmt: skip
    mine, peer = runs
    print()
    print(f"naive / palaestra: requests {peer.requests / max(1, mine.requests):.2f}x, "
          f"429s {peer.rate_limited / max(1, mine.rate_limited):.2f}x, storm requests "
          f"{peer.storm} vs {mine.storm}; palaestra verdicts/s "
          f"{mine.verdicts_per_s / max(1e-9, peer.verdicts_per_s):.2f}x naive, p99 "
          f"{mine.p99_s / max(1e-9, peer.p99_s):.2f}x naive")  # fmt: skip
    capped = mine.max_in_flight <= args.cap
    print(f"{'PASS' if capped else 'MISS'} no request beyond the cap "
          f"({mine.max_in_flight} <= {args.cap})")  # fmt: skip
    print(f"{'PASS' if mine.storm == 0 else 'MISS'} no request inside an announced cool-down")
    print(f"{'PASS' if mine.failed == 0 else 'MISS'} every verdict given ({mine.failed} failed)")
    return {
        "fraction": fraction,
        "runs": [{k: v for k, v in asdict(f).items() if k != "latencies"} for f in runs],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 episodes x 1 call")
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--calls", type=int, default=2, help="judge calls an episode makes")
    parser.add_argument("--cap", type=int, default=32, help="palaestra's max_concurrency")
    parser.add_argument("--retry-ratio", type=float, default=1.0, help="palaestra's budget")
    parser.add_argument("--latency", type=float, default=0.05, help="the fake's reply time, s")
    parser.add_argument(
        "--fraction", default="0.05,0.2", help="shares answered 429, one scenario each"
    )
    parser.add_argument("--retry-after", type=float, default=0.2, help="the 429s' window, s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--grace", type=float, default=0.02, help="in-window arrivals this soon were on their way"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.calls = 64, 1
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()

    async def both(fraction: float) -> list[Figures]:
        return [await measure(n, args, fraction) for n in ("palaestra", "naive")]

    setup = {k: v for k, v in vars(args).items() if k not in ("json", "quick")}
    scenarios = [float(f) for f in args.fraction.split(",")]
    figures = {
        "setup": setup,
        "scenarios": [report(args, f, asyncio.run(both(f))) for f in scenarios],
    }
    print(json.dumps(figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
