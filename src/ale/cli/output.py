"""How every `ale` command prints: results on stdout, messages on stderr.

User-facing errors are printed unwrapped and without markup interpretation, so a
message reads the same in a terminal of any width, in a log and in a grep. Every
console here is a ``SafeConsole``: whatever text it is given (a recorded name, a
grader's error, a candidate's string) reaches the terminal with its C0 and C1
controls written ``\\xNN`` (``ale.lossless.printable``; line breaks and tabs kept),
so no escape sequence a candidate chose (OSC 52 writes the clipboard) runs in the
operator's terminal.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment
from rich.text import Text

from ale.lossless import printable


def terminal_safe(s: str) -> str:
    """``s`` with every control but line breaks and tabs escaped (``printable``)."""
    return "\n".join("\t".join(printable(part) for part in line.split("\t")) for line in s.split("\n"))


class SafeConsole(Console):
    """A rich console that escapes the controls of every string and Text it prints
    (``terminal_safe``); markup and styles are rich's own, added after."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        safe: list[Any] = []
        for o in objects:
            if isinstance(o, str):
                o = terminal_safe(o)
            elif isinstance(o, Text) and terminal_safe(o.plain) != o.plain:
                o = Text(terminal_safe(o.plain), style=o.style)  # its spans are lost: its text is kept
            safe.append(o)
        super().print(*safe, **kwargs)

    def _render_buffer(self, buffer: Any) -> str:
        # Every segment's text, whatever made it (a table cell, a Text, a renderable),
        # is escaped before rich adds its own styles; rich's control segments (cursor
        # movement it emits itself) are kept.
        return super()._render_buffer(
            Segment(seg.text if seg.control else terminal_safe(seg.text), seg.style, seg.control) for seg in buffer)


err = SafeConsole(stderr=True, soft_wrap=True, highlight=False)


def fail(message: str, code: int = 2, *, label: str = "error") -> NoReturn:
    """The one way an `ale` command fails: print ``error: message`` on stderr (never
    wrapped, its controls escaped) and exit with ``code`` (2, the usual refusal of
    input, unless the command's documented code differs). ``message`` names the path
    or value at fault; ``label`` replaces ``error`` where a command says something
    else (``refused``)."""
    text = Text(f"{label}: ", style="bold red")
    text.append(terminal_safe(message))
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
