"""How every `ale` command prints: results on stdout, messages on stderr.

User-facing errors are printed unwrapped and without markup interpretation, so a
message reads the same in a terminal of any width, in a log and in a grep.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

err = Console(stderr=True, soft_wrap=True, highlight=False)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr (never wrapped) and exit with ``code``."""
    text = Text("error: ", style="bold red")
    text.append(message)
    err.print(text)
    raise typer.Exit(code)
