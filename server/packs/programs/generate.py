"""Run one pack generator's calls inside a sandbox (server/packs/generate.py starts it).

Reads {"path": [...], "module": "gen.py", "calls": [{"seed", "index", "level"}, ...]} on
stdin; writes one JSON object on the stdout it started with: {"results": [...]}, one entry
a call, {"task": {...}} or {"error": "<exception type>", "message": "..."}. Whatever the
generator prints goes to stderr, so it cannot mix with the results. Everything here runs
under the generator's control: the server trusts none of it and checks what comes back.
"""

import importlib.util
import json
import os
import sys


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path[:0] = [str(p) for p in job["path"]]
    path = os.path.abspath(job["module"])
    results = []
    try:
        spec = importlib.util.spec_from_file_location("pack_generator", path)
        assert spec is not None and spec.loader is not None, f"{path} is not a module"
        module = importlib.util.module_from_spec(spec)
        sys.modules["pack_generator"] = module
        spec.loader.exec_module(module)
        generate = module.generate
    except BaseException as exc:  # the import itself failed: every call fails with it
        failed = {"error": type(exc).__name__, "message": f"importing it: {exc}"[:2000]}
        results = [failed for _ in job["calls"]]
    else:
        for call in job["calls"]:
            try:
                task = generate(seed=call["seed"], index=call["index"], level=call["level"])
                json.dumps(task)
                results.append({"task": task})
            except Exception as exc:
                results.append({"error": type(exc).__name__, "message": str(exc)[:2000]})
    json.dump({"results": results}, out)
    out.flush()


main()
