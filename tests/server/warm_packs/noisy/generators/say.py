"""A generator as noisy as reasoning-gym's datasets: it prints dots, logs a warning and
writes straight to fd 2 (as C libraries do) for every task. It first waits for the file
named by NOISY_GATE (when set), so a test sees the pack warming for as long as it likes."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

WORDS = ["apple", "birch", "cedar", "dune", "ember", "fjord", "grove"]


def generate(seed: int, index: int, level: int) -> dict[str, Any]:
    gate = os.environ.get("NOISY_GATE")
    deadline = time.monotonic() + 120
    while gate and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(".", end="", flush=True)
    logging.getLogger("noisy.lib").warning("Failed to generate a capture problem")
    os.write(2, b"I/O error: cannot open log_file_0.txt\n")
    sys.stderr.flush()
    word = WORDS[seed % len(WORDS)]
    return {
        "public": {"instruction": f"Submit the word {word!r} in reverse order of its letters."},
        "private": {"answer": word[::-1]},
    }
