"""What one loopback send costs the sender's CPU on this machine, with the peer asleep in
`recv` against the same peer busy polling: the price of waking a blocked process.

Every HTTP reply and every WebSocket message pays it once its client waits for it, so on a
machine where waking is dear (a microVM without guest halt-polling) a server's CPU a step
rises by the same microseconds for palaestra and its peer, and ratios of small per-step
figures shrink. Run it beside `bench/api.py` to read that bench's figures on a new machine.

    .venv/bin/python bench/wakeup.py              # 5,000 round trips a case
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def peer(sock: socket.socket, busy: bool) -> None:
    """Answer each message with one byte: blocked in `recv`, or polling without sleeping."""
    sock.setblocking(not busy)
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            continue
        if not data:
            os._exit(0)
        sock.setblocking(True)
        sock.sendall(b"k")
        sock.setblocking(not busy)


def send_cpu_us(size: int, busy: bool, rounds: int) -> float:
    """The sender's CPU µs a `sendall` of `size` bytes, the peer answering each."""
    listener = socket.create_server(("127.0.0.1", 0))
    child = os.fork()
    if child == 0:
        peer(socket.create_connection(listener.getsockname()), busy)
    conn, _ = listener.accept()
    data = b"x" * size
    spent = 0.0
    try:
        for _ in range(rounds):
            start = time.thread_time()
            conn.sendall(data)
            spent += time.thread_time() - start
            conn.recv(16)
    finally:
        conn.close()
        listener.close()
        os.waitpid(child, 0)
    return spent / rounds * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5000)
    args = parser.parse_args()
    print("| message | peer asleep: send µs CPU | peer polling: send µs CPU | waking costs |")
    print("| ------- | ----------------------- | ------------------------ | ------------ |")
    for size in (200, 12_000):
        asleep = send_cpu_us(size, busy=False, rounds=args.rounds)
        polling = send_cpu_us(size, busy=True, rounds=args.rounds)
        print(f"| {size:>7,} B | {asleep:>23.1f} | {polling:>24.1f} | {asleep / polling:>11.1f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
