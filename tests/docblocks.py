"""The code blocks of a docs page, in order, with the marker that says how a test uses each.

A marker is an HTML comment on the line right before a fence (invisible when rendered):

- `<!-- doc: file PATH -->`: the block is the whole file PATH (relative to the page's
  working folder); the test writes it there.
- `<!-- doc: sandbox -->`: a Python snippet run inside a hook (top-level `await`; `ctx` is
  the episode context).
- `<!-- doc: in-test COMMAND -->`: a shell block the test replaces by COMMAND (one that
  would change the machine, e.g. install into the real environment).
- `<!-- doc: skip REASON -->`: illustrative only (a fragment); never run.

A block without a marker is run as its language says: `python` blocks make up the page's
module, `bash` and `console` blocks are one shell script, in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"

_BLOCK = re.compile(
    r"(?:^<!-- doc: (?P<kind>file|sandbox|in-test|skip)(?: (?P<arg>[^\n]*?))? -->\n)?"
    r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    kind: str  # file, sandbox, in-test, skip, or "" (run as its language says)
    arg: str
    line: int

    def where(self, page: str) -> str:
        return f"docs/{page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """Every fenced block of docs/`page`, in order."""
    text = (DOCS / page).read_text()
    return [
        Block(
            lang=m["lang"],
            body=m["body"],
            kind=m["kind"] or "",
            arg=(m["arg"] or "").strip(),
            line=text.count("\n", 0, m.start("lang")) + 1,
        )
        for m in _BLOCK.finditer(text)
    ]


def write_files(page: str, root: Path) -> list[Path]:
    """Write every `file` block of the page under `root`; returns the paths."""
    written = []
    for block in blocks(page):
        if block.kind == "file":
            path = root / block.arg
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
            written.append(path)
    return written


def shell_script(page: str) -> str:
    """The whole page as one shell script, in order: its shell blocks (an `in-test` block's
    command in its place) and a heredoc writing each `file` block where the page shows it.
    Raises ValueError naming a block the page leaves unmarked that a shell cannot run."""
    parts = []
    for block in blocks(page):
        where = block.where(page)
        if block.kind == "file":
            folder = str(Path(block.arg).parent)
            parts.append(
                f"# {where}\nmkdir -p '{folder}'\ncat > '{block.arg}' <<'DOC_EOF'\n"
                f"{block.body}DOC_EOF\n"
            )
        elif block.kind == "in-test":
            parts.append(f"# {where} (in-test)\n{block.arg}\n")
        elif not block.kind and block.lang in ("bash", "console"):
            parts.append(f"# {where}\n{block.body}")
        elif not block.kind:
            raise ValueError(f"{where}: a {block.lang or 'plain'} block with no doc: marker")
    return "\n".join(parts)
