"""How soon a fresh `palaestra serve` answers: /healthz, /readyz, and fully warm.

Each run starts `palaestra serve` on a fresh temp data dir and (unless --shared-cache) a
fresh temp cache, so every generated split is cold: the built-in packs' training splits
and the held-out splits drawn with the new data dir's secret. It polls /healthz and
/readyz every 50 ms and records the time to the first 200 of each and the time until
/readyz says `"status": "ready"` (every pack generated and loaded). Then it restarts the
server on the same data dir and cache (warm) and records when /readyz first says ready.

The peer, in the same script: the same server with `--no-background-warm` (main's
behaviour before background warming: every pack generated before the server answers).
It also counts the lines the server printed that are not its own JSON log lines
(third-party noise: reasoning-gym's dots and errors).

    .venv/bin/python bench/serve_ready.py                 # 1 run each mode (~5-10 min)
    .venv/bin/python bench/serve_ready.py --runs 3 --no-peer
    .venv/bin/python bench/serve_ready.py --no-wait-warm  # time to answer only (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

BIN = Path(sys.executable).parent
POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float | None:
    """CPU time the process has used (user + system): what a start costs whatever the load."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def noise_lines(log: Path) -> list[str]:
    """Lines the server printed that are not its JSON log records."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    noise = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            if line.strip():
                noise.append(line)
    return noise


def serve_once(
    data: Path, cache: Path, log: Path, background: bool, wait_warm: bool, timeout_s: float
) -> dict[str, Any]:
    """Start a server; seconds to first /healthz 200, first /readyz 200, /readyz ready."""
    port = free_port()
    # As a user's install runs: byte-compiled (pip compiles at install; a dev shell's
    # PYTHONDONTWRITEBYTECODE would recompile ~170 modules at every start).
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PALAESTRA_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["PALAESTRA_CACHE"] = str(cache)
    flag = "--background-warm" if background else "--no-background-warm"
    cmd = [str(BIN / "palaestra"), "serve", "--port", str(port), "--data-dir", str(data), flag]
    url = f"http://127.0.0.1:{port}"
    figures: dict[str, Any] = {
        "healthz_s": None,
        "readyz_s": None,
        "readyz_cpu_s": None,
        "warm_s": None,
    }
    first_status: str | None = None
    started = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        with httpx.Client(timeout=2.0) as http:
            while time.monotonic() - started < timeout_s:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()}")
                now = time.monotonic() - started
                try:
                    healthz = figures["healthz_s"] is None and http.get(f"{url}/healthz")
                    if healthz and healthz.status_code == 200:
                        figures["healthz_s"] = now
                    ready = http.get(f"{url}/readyz")
                except httpx.HTTPError:
                    time.sleep(POLL_S)
                    continue
                if ready.status_code == 200:
                    status = ready.json().get("status")
                    if figures["readyz_s"] is None:
                        figures["readyz_s"], first_status = now, status
                        figures["readyz_cpu_s"] = cpu_seconds(proc.pid)
                    if status == "ready":
                        figures["warm_s"] = now
                        break
                    if not wait_warm:
                        break
                time.sleep(POLL_S)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    figures["first_readyz_status"] = first_status
    figures["noise_lines"] = len(noise_lines(log))
    return figures


def one_run(mode: str, index: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    base = root / f"{mode}-{index}"
    cache = Path(args.shared_cache) if args.shared_cache else base / "cache"
    data = base / "data"
    cache.mkdir(parents=True, exist_ok=True)
    background = mode == "background"
    cold = serve_once(
        data, cache, base / "serve-cold.log", background, args.wait_warm, args.timeout
    )
    result = {"mode": mode, "run": index, "cold": cold}
    if args.wait_warm and cold["warm_s"] is not None:
        result["restart"] = serve_once(
            data, cache, base / "serve-warm.log", background, True, args.timeout
        )
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:7.2f}"


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="cold starts with background warming")
    parser.add_argument("--peer-runs", type=int, default=1, help="cold starts without it")
    parser.add_argument("--no-peer", action="store_true", help="skip --no-background-warm")
    parser.add_argument(
        "--no-wait-warm",
        dest="wait_warm",
        action="store_false",
        help="stop at the first /readyz answer (no time to fully warm)",
    )
    parser.add_argument("--shared-cache", help="use this cache folder (default: a fresh one)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a start may take")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()  # fmt: skip

    root = Path(tempfile.mkdtemp(prefix="palaestra-ready-"))
    results: list[dict[str, Any]] = []
    try:
        for i in range(args.runs):
            results.append(one_run("background", i, args, root))
        if not args.no_peer:
            for i in range(args.peer_runs):
                results.append(one_run("blocking", i, args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    cores = os.cpu_count()
    load = os.getloadavg()[0]
    print(f"\nfresh `palaestra serve` ({cores} cores, load {load:.1f}); seconds from exec")
    print(f"{'mode':<11} {'run':>3} {'healthz':>7} {'readyz':>7} {'cpu':>7} {'warm':>7} "
          f"{'restart':>7} {'noise':>5}  first /readyz")  # fmt: skip
    for r in results:
        c, w = r["cold"], r.get("restart", {})
        print(f"{r['mode']:<11} {r['run']:>3} {fmt(c['healthz_s'])} {fmt(c['readyz_s'])} "
              f"{fmt(c['readyz_cpu_s'])} {fmt(c['warm_s'])} {fmt(w.get('warm_s'))} "
              f"{c['noise_lines']:>5}  {c['first_readyz_status']}")  # fmt: skip
    print("(cpu: the server's CPU seconds at its first /readyz answer; restart: the same data "
          "dir and cache, warm, until /readyz says ready; noise: printed lines that are not "
          "its JSON log)")  # fmt: skip

    def med(mode: str, key: str) -> float | None:
        return median([r["cold"][key] for r in results if r["mode"] == mode])

    summary: dict[str, Any] = {
        "cores": cores,
        "load": round(load, 2),
        "background_readyz_s": med("background", "readyz_s"),
        "background_readyz_cpu_s": med("background", "readyz_cpu_s"),
        "background_warm_s": med("background", "warm_s"),
        "blocking_readyz_s": med("blocking", "readyz_s"),
        "restart_ready_s": median(
            [r.get("restart", {}).get("warm_s") for r in results if r["mode"] == "background"]
        ),
        "target_readyz_s": 3.0,
    }
    bg, peer = summary["background_readyz_s"], summary["blocking_readyz_s"]
    if bg and peer:
        summary["ratio_blocking_over_background"] = round(peer / bg, 1)
        print(f"\nfirst /readyz answer: {bg:.2f} s vs {peer:.2f} s without background "
              f"warming ({peer / bg:.0f}x sooner)")  # fmt: skip
    if bg is not None:
        print(f"target /readyz <= 3 s: {'PASS' if bg <= 3.0 else 'MISS'} ({bg:.2f} s)")
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
