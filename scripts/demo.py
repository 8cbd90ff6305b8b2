"""`make demo`: serve on loopback, evaluate oracle and null on HumanEval's held-out split over HTTP.

Starts `palaestra serve` (bwrap sandboxes, SQLite in the data dir, built-in packs), waits
until it is ready, runs `palaestra eval` for each policy against it, prints the tables,
writes the reports under reports/, and stops the server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

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


def main() -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data_dir = Path(os.environ.get("PALAESTRA_DATA_DIR", ROOT / ".palaestra"))
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
        for policy in ("oracle", "null"):
            out = reports / f"demo-{policy}.json"
            code = subprocess.call(
                [
                    str(BIN / "palaestra"),
                    "eval",
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
                    "--out",
                    str(out),
                ],
                cwd=ROOT,
                env=env,
            )
            if code != 0:
                print(f"palaestra demo: eval of {policy} failed with exit code {code}")
                return code
        print(f"palaestra demo: reports in {reports}/; the trajectories stay in {data_dir}")
        return 0
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
