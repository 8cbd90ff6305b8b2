"""What ``python3 $VERIFIER_DIR/x.py`` runs under the terminal runner's wrapper: the
verifier's own script, non-dumpable, with its folder (not the cwd) first on sys.path and no
user site."""

import ctypes
import os
import runpy
import sys

try:  # noqa: SIM105
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
