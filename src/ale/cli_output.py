"""How every `ale` command prints: results on stdout, messages on stderr.

User-facing errors are printed unwrapped and without markup interpretation, so a
message reads the same in a terminal of any width, in a log and in a grep.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

err = Console(stderr=True, soft_wrap=True, highlight=False)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr (never wrapped) and exit with ``code``."""
    text = Text("error: ", style="bold red")
    text.append(message)
    err.print(text)
    raise typer.Exit(code)


@contextlib.contextmanager
def software_progress() -> Iterator[None]:
    """A first run of a task builds its environment image (minutes): its progress
    lines go to stderr."""
    class _Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            err.print(f"[dim]env: {escape(record.getMessage())}[/]", highlight=False)

    log = logging.getLogger("ale.software")
    handler = _Say()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
