"""What the terminal runner's ``python3 -m pytest`` / ``pytest`` wrappers run (argv after
``-c`` is pytest's): pytest imported before the cwd joins sys.path, the verifier's ini, no
cache, conftests only from the verifier's folder down; non-dumpable."""

import ctypes
import os
import sys

try:  # noqa: SIM105
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
import pytest

sys.path.insert(0, os.getcwd())
sys.argv = ["pytest", "-p", "no:cacheprovider", "-c", os.environ["PALAESTRA_PYTEST_INI"],
            "--confcutdir", os.environ["VERIFIER_DIR"], *sys.argv[1:]]  # fmt: skip
raise SystemExit(pytest.console_main())
