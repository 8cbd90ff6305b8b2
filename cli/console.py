"""The CLI's consoles: tables and results on stdout, messages on stderr.

Markup is off: user, pack and server text prints verbatim (`[source]` stays `[source]`).
Colour comes only from `styled` pieces, never from parsing text.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.text import Text

# Tables stay readable when the output is a pipe or a CI log (Rich would assume 80 columns).
console = Console(width=None if sys.stdout.isatty() else 120, markup=False, highlight=False)
# Messages with paths stay on one line.
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)


def styled(label: str, style: str, rest: str = "") -> Text:
    """`label` in `style`, then `rest` as it is."""
    return Text.assemble((label, style), rest)


def error(message: str, code: str | None = None) -> None:
    """`error (code): message` on stderr."""
    err.print(styled("error", "red", (f" ({code})" if code else "") + f": {message}"))
