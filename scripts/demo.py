"""`make demo`: serve on loopback, evaluate oracle and null on HumanEval's held-out split over HTTP.

Starts `palaestra serve` (bwrap sandboxes, SQLite in the data dir, built-in packs), waits
until it is ready, runs `palaestra eval run` for each policy against it (each into a run
directory under reports/runs/), regrades the oracle run from its stored trajectories
(`eval report`), compares the two runs (`eval compare`), stops the server and ends with the
HTML report: its path and a summary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from palaestra.server.config import load_settings_with_sources

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PACK = "openai/humaneval"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(url: str, server: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the server was not ready after {timeout:.0f} s")


def summarize(run_dir: Path) -> None:
    """The demo's last words: where the HTML report is, and what it says."""
    report = json.loads((run_dir / "report.json").read_text())
    h, s, p = report["header"], report["summary"], report["process"]
    print()
    print(f"palaestra demo: HTML report: {run_dir / 'report.html'}")
    print(f"  {h['policy']} on {h['pack']}@{h['version']} ({h['split']}): {s['tasks']} tasks")
    print(
        f"  mean reward {s['mean_reward']:.3f} ± {s['stderr']:.3f} · pass@1 "
        f"{s['pass_at_k'].get('1', 0.0):.3f} · void {s['void']} · policy errors {s['errors']}"
    )
    print(
        f"  steps {p['steps']['mean']:.2f} a try · tool-call success {p['tool_call_success']:.0%}"
        f" · mean attempt {p['duration_s']['mean']:.2f} s · grading: {h['grading']['note']}"
    )
    print(f"  open it: file://{(run_dir / 'report.html').resolve()}")


def main() -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings, sources = load_settings_with_sources()  # PALAESTRA_DATA_DIR, palaestra.toml
    data_dir = settings.data_dir if sources["data_dir"] != "default" else ROOT / ".palaestra"
    reports = ROOT / "reports"
    print(f"palaestra demo: serving on {url} with data in {data_dir}")
    server = subprocess.Popen(
        [
            str(BIN / "palaestra"),
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
    )
    try:
        wait_ready(url, server)
        # The server wrote a local admin token at first start; the eval runs use it.
        token = (data_dir / "admin.token").read_text().strip()
        env = {**os.environ, "PALAESTRA_TOKEN": token}
        runs = {policy: reports / "runs" / f"demo-{policy}" for policy in ("oracle", "null")}
        for policy, run_dir in runs.items():
            shutil.rmtree(run_dir, ignore_errors=True)  # the demo starts its runs afresh
            out = reports / f"demo-{policy}.json"
            code = subprocess.call(
                [
                    str(BIN / "palaestra"),
                    "eval",
                    "run",
                    "--url",
                    url,
                    "--pack",
                    PACK,
                    "--split",
                    "heldout",
                    "--policy",
                    policy,
                    "--concurrency",
                    "4",
                    "--run-dir",
                    str(run_dir),
                    "--out",
                    str(out),
                ],
                cwd=ROOT,
                env=env,
            )
            if code != 0:
                print(f"palaestra demo: eval of {policy} failed with exit code {code}")
                return code
        # Regrade the oracle run by replaying its stored trajectories, then compare the runs.
        steps = [
            ["eval", "report", str(runs["oracle"]), "--url", url],
            ["eval", "compare", str(runs["null"]), str(runs["oracle"])],
        ]
        for args in steps:
            code = subprocess.call([str(BIN / "palaestra"), *args], cwd=ROOT, env=env)
            if code != 0:
                print(f"palaestra demo: `palaestra {' '.join(args[:2])}` failed ({code})")
                return code
        summarize(runs["oracle"])
        print(f"palaestra demo: the trajectories also stay in {data_dir}")
        return 0
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
