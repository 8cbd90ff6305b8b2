"""The coding episode bench/fork.py and bench/resume.py play (a HumanEval task of the
built-in packs three steps in: a solution written, run once, a scratch file written), the
action that adds 8 MiB of files to its workspace, and a percentile."""

from __future__ import annotations

from palaestra.sdk.models import Action

TASK = "openai/humaneval:HumanEval-1"
SOLUTION = "def separate_paren_groups(paren_string):\n    return paren_string.split()\n"
STEPS = [
    Action(tool="write_file", arguments={"path": "solution.py", "content": SOLUTION}),
    Action(tool="run_python", arguments={"code": "import solution; print(solution)"}),
    Action(tool="write_file", arguments={"path": "notes.txt", "content": "try again\n" * 100}),
]
BULK = Action(
    tool="run_python",
    arguments={
        "code": "import os\nfor i in range(8): open(f'blob{i}', 'wb').write(os.urandom(1 << 20))"
    },
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
