"""The HTML report in a real browser: headless Chromium driven over the DevTools protocol.

The report comes from a real evaluation (embedded server, echo pack). The test checks that
the page loads nothing from the network, that every chart renders (SVG with a non-zero size,
bars and points present), that clicking an attempt opens its trajectory, and saves a
screenshot under the test's tmp_path.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from palaestra.sdk.evaluation.runner import run_eval
from palaestra.sdk.models import Action, ResetResponse, StepResponse
from palaestra.sdk.policies.base import Session
from palaestra.sdk.report import build_report
from palaestra.sdk.report_html import render_html
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from tests.servers import scaled

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1600",
    "--remote-debugging-port=0",
)
WORD = re.compile(r"Submit the word '(\w+)'")


class CDP:
    """The few DevTools-protocol calls the test needs, over one page's websocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mine = self.next_id
        self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == mine:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def wait_event(self, name: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == name:
                return event
        while time.monotonic() < deadline:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            self.events.append(message)
            if message.get("method") == name:
                return message
        raise AssertionError(f"no {name} event in {timeout} s")

    def js(self, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click at the element's centre (not element.click())."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            "return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()"
        )
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box["x"],
                y=box["y"],
                button="left",
                clickCount=1,
            )


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[CDP]:
    if CHROMIUM is None:
        pytest.skip(
            "chromium is not installed (Debian: apt-get install chromium chromium-driver; "
            "scripts/bootstrap.sh does it when run as root)"
        )
    pytest.importorskip("websockets", reason="the dev extra (websockets) is not installed")
    profile = tmp_path / "chromium-profile"  # a fresh user-data-dir
    log = open(tmp_path / "chromium.log", "wb")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + scaled(60)
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"chromium did not start: {(tmp_path / 'chromium.log').read_text()}")
            time.sleep(0.05)
        port = int(port_file.read_text().splitlines()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t.get("type") == "page")
        from websockets.sync.client import connect

        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            yield CDP(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class HalfRight:
    """Refuses once (an unknown tool), echoes, then submits: right for even seeds only."""

    name = "half-right"

    def reset_options(self) -> dict[str, Any]:
        return {}

    async def start(self, reset: ResetResponse) -> Session:
        match = WORD.search(reset.observation.text)
        assert match is not None
        return _HalfRight(match.group(1), int(reset.info["seed"]))


class _HalfRight:
    def __init__(self, word: str, seed: int) -> None:
        self.word, self.seed, self.turn = word, seed, 0
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    async def act(self, last: StepResponse | None) -> Action:
        self.turn += 1
        self.usage["prompt_tokens"] += 50
        self.usage["completion_tokens"] += 7
        if self.turn == 1:
            return Action(tool="look_around")
        if self.turn == 2:
            return Action(tool="echo", arguments={"text": self.word})
        answer = self.word[::-1] if self.seed % 2 == 0 else self.word
        return Action(tool="submit", arguments={"answer": answer})

    async def aclose(self) -> None:
        return None


async def _report(manager: EpisodeManager) -> dict[str, Any]:
    client = AsyncInProcessClient(manager)
    tasks = (await client.tasks(pack="palaestra/echo", split="train")).tasks[:4]
    attempts = await run_eval(client, HalfRight(), tasks, k=3, concurrency=4)
    info = next(p for p in await client.packs() if p.name == "palaestra/echo")
    header = {
        "pack": info.name,
        "version": info.version,
        "pack_digest": info.digest,
        "split": "train",
        "policy": "half-right",
        "seeds": [0, 1, 2],
        "server": "embedded",
    }
    return build_report(attempts, k=3, header=header)


async def test_html_report_renders_in_chromium(
    browser: CDP, manager: EpisodeManager, tmp_path: Path
) -> None:
    report = await _report(manager)
    assert report["summary"]["pass_at_k"]["1"] == pytest.approx(2 / 3)
    page = tmp_path / "report.html"
    page.write_text(render_html(report))

    browser.call("Page.enable")
    browser.call("Network.enable")
    browser.call("Page.navigate", url=page.as_uri())
    browser.wait_event("Page.loadEventFired")
    # Nothing but the page itself was requested: no network, no external JS or CSS.
    requests = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    assert requests == [page.as_uri()], requests
    assert browser.js("performance.getEntriesByType('resource').length") == 0

    charts = browser.js(
        "Array.from(document.querySelectorAll('svg.chart')).map(s => {"
        "const r = s.getBoundingClientRect(); return [s.getAttribute('aria-label'), r.width, "
        "r.height]; })"
    )
    labels = [c[0] for c in charts]
    assert len(charts) >= 7, labels
    assert all(w > 100 and h > 50 for _, w, h in charts), charts
    for label in ("reward distribution", "unbiased pass@k", "mean reward by domain"):
        assert any(x.startswith(label) for x in labels), labels

    def bars(selector: str) -> list[list[float]]:
        value: list[list[float]] = browser.js(
            f"Array.from(document.querySelectorAll({json.dumps(selector)})).map(e => {{"
            "const r = e.getBoundingClientRect(); return [r.width, r.height]; })"
        )
        return value

    rewards = bars("#reward-distribution rect.bar")
    assert len(rewards) == 10 and sum(h > 2 for _, h in rewards) == 2  # rewards 0 and 1 only
    points = bars("#pass-at-k circle.point")
    assert len(points) == 3 and all(w > 0 and h > 0 for w, h in points)  # pass@1..3
    assert bars("#by-domain rect.bar") and all(w > 0 for w, _ in bars("#by-domain rect.bar"))
    assert len(bars("#process rect.bar, .grid rect.bar")) >= 3

    # Open one attempt's trajectory with a real click.
    rows = browser.js("document.querySelectorAll('tr.attempt-row').length")
    assert rows == 12
    assert browser.js("document.getElementById('traj-4').hidden") is True
    browser.click('tr.attempt-row[data-idx="4"]')
    assert browser.js("document.getElementById('traj-4').hidden") is False
    steps = browser.js(
        "Array.from(document.querySelectorAll('#traj-4 .step')).map(s => "
        "[s.offsetHeight, s.className, s.innerText])"
    )
    assert len(steps) == 3 and all(h > 0 for h, _, _ in steps)
    assert (
        "refused" in steps[0][1] and "look_around" in steps[0][2] and "unknown tool" in steps[0][2]
    )
    assert "echo" in steps[1][2] and "submit" in steps[2][2] and "final" in steps[2][1]
    attempt = report["attempts"][4]
    assert attempt["task"] in browser.js("document.getElementById('traj-4').innerText")
    assert browser.js("document.querySelectorAll('section.trajectory:not([hidden])').length") == 1

    shot = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
    png = base64.b64decode(shot["data"])
    (tmp_path / "report.png").write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    print(f"screenshot: {tmp_path / 'report.png'}")
