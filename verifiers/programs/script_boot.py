"""What ``python3 $VERIFIER_DIR/x.py`` and the verifier's ``python3 -c CODE`` run under the
terminal runner's wrapper, after import_guard.py: the verifier's own program, non-dumpable,
with no user site, its folder (a script's; for ``-c`` the cwd, last) on sys.path, and the
import guard in place, so that a workspace folder the program puts on sys.path cannot stand
in for the standard library."""

import os
import runpy
import sys

if sys.argv[1:2] == ["-c"] and len(sys.argv) > 2:
    source = sys.argv[2]
    sys.argv = ["-c", *sys.argv[3:]]
    append_workspace(os.getcwd())  # type: ignore[name-defined]  # noqa: F821 (import_guard.py)
    main = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(source, "<string>", "exec"), main)
else:
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    runpy.run_path(sys.argv[0], run_name="__main__")
