"""Run report.py on fresh CSV files and compare with a reference implementation."""
import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile

# python3 from PATH: sys.executable can name a wrapper that a noexec /tmp cannot run
PYTHON = shutil.which("python3") or "/usr/bin/python3"

CASES = [
    "student,subject,score\nana,math,91\nben,math,78\nana,art,\nben,art,\ncy,physics,66.5\n"
    "ana,physics,\ncy,math, 83\n",
    "student,subject,score\na,zoology,  \nb,biology,50\nc,biology,51\nd,zoology,\n"
    "e,chem,100\nf,chem,0\ng,history,   \n",
    "student,subject,score\nx,only,\n",
    "student,subject,score\nx,math,1\ny,math,2\nz,math,2\n",
]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def reference(text: str) -> str:
    scores: dict[str, list[float]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        vals = scores.setdefault(row["subject"], [])
        if row["score"].strip():
            vals.append(float(row["score"]))
    lines = []
    for s in sorted(scores):
        v = scores[s]
        lines.append(f"{s}: {sum(v) / len(v):.1f}" if v else f"{s}: n/a")
    return "\n".join(lines) + "\n"


with tempfile.TemporaryDirectory() as tmp:
    for i, text in enumerate(CASES):
        path = os.path.join(tmp, f"case{i}.csv")
        with open(path, "w") as fh:
            fh.write(text)
        r = subprocess.run([PYTHON, "-B", "/work/report.py", path],
                           capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            fail(f"case {i}: exit status {r.returncode}: {r.stderr.strip()[-300:]}")
        if r.stdout != reference(text):
            fail(f"case {i}: printed {r.stdout!r}, want {reference(text)!r}")
print("PASS")
