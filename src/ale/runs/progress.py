"""Progress of an experiment: counts, rate and ETA, for a terminal or a log.

``ProgressState`` is what the orchestrator updates; a ``ProgressSink`` shows it:
``RichProgress`` (a live panel on a terminal), ``PlainProgress`` (a line every
``every_s`` seconds, for logs and CI) or ``NullProgress``.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from ale.result import RunResult
from ale.status import RunStatus, counts_toward_score


@dataclass
class ProgressState:
    total: int
    done: int = 0  # units with a final result (this session or earlier)
    skipped: int = 0  # of which were already final at start
    running: int = 0
    scored: int = 0
    failed: int = 0  # agent_failed, timeout, grading_failed, infrastructure_error (final)
    invalid: int = 0
    retries: int = 0
    slots: int = 0
    score_sum: float = 0.0
    score_n: int = 0
    started_at: float = field(default_factory=time.monotonic)
    finished_this_session: int = 0
    stopping: bool = False

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.score_n if self.score_n else None

    def eta_s(self) -> float | None:
        if not self.finished_this_session:
            return None
        remaining = self.total - self.done
        rate = self.finished_this_session / max(time.monotonic() - self.started_at, 1e-6)
        return remaining / rate

    def count_final(self, result: RunResult) -> None:
        self.done += 1
        status = RunStatus(result.status)
        if status is RunStatus.INVALID_EVALUATION_ENVIRONMENT:
            self.invalid += 1
        elif status is RunStatus.SCORED:
            self.scored += 1
        else:
            self.failed += 1
        if counts_toward_score(status, result.score):
            assert result.score is not None
            self.score_sum += result.score
            self.score_n += 1


class ProgressSink(Protocol):
    def start(self, state: ProgressState) -> None: ...
    def update(self, state: ProgressState, message: str | None = None) -> None: ...
    def stop(self, state: ProgressState) -> None: ...


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def summary_line(s: ProgressState) -> str:
    mean = "-" if s.mean_score is None else f"{s.mean_score:.3f}"
    return (
        f"done {s.done}/{s.total}  running {s.running}  scored {s.scored}  failed {s.failed}  "
        f"invalid {s.invalid}  retries {s.retries}  mean {mean}  slots {s.slots}  "
        f"eta {_fmt_eta(s.eta_s())}" + ("  [stopping]" if s.stopping else "")
    )


class PlainProgress:
    """One line per event, for CI logs and non-terminals."""

    def __init__(self, stream: Any = None, every_s: float = 30.0):
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._last = 0.0

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def start(self, state: ProgressState) -> None:
        self._print(f"[ale] {state.total} runs planned, {state.skipped} already done")

    def update(self, state: ProgressState, message: str | None = None) -> None:
        now = time.monotonic()
        if message:
            self._print(f"[ale] {message}")
        if message or now - self._last >= self.every_s:
            self._last = now
            self._print(f"[ale] {summary_line(state)}")

    def stop(self, state: ProgressState) -> None:
        self._print(f"[ale] finished: {summary_line(state)}")


class RichProgress:
    """A live panel: a bar plus done / running / failed / invalid, mean score, ETA."""

    def __init__(self, console: Any = None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._live: Any = None
        self._recent: deque[str] = deque(maxlen=6)

    def _render(self, s: ProgressState) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 2))
        for _ in range(8):
            table.add_column()
        mean = "-" if s.mean_score is None else f"{s.mean_score:.3f}"
        table.add_row(
            Text(f"done {s.done}/{s.total}", style="bold"),
            Text(f"running {s.running}", style="cyan"),
            Text(f"scored {s.scored}", style="green"),
            Text(f"failed {s.failed}", style="yellow"),
            Text(f"invalid {s.invalid}", style="red"),
            Text(f"mean {mean}"),
            Text(f"slots {s.slots}"),
            Text(f"ETA {_fmt_eta(s.eta_s())}" + (" (stopping)" if s.stopping else "")),
        )
        bar = ProgressBar(total=max(s.total, 1), completed=s.done, width=60)
        return Group(bar, table, *[Text(r, style="dim") for r in self._recent])

    def start(self, state: ProgressState) -> None:
        from rich.live import Live

        self._live = Live(self._render(state), console=self.console, refresh_per_second=4, transient=False)
        self._live.start()

    def update(self, state: ProgressState, message: str | None = None) -> None:
        if message:
            self._recent.append(message)
        if self._live is not None:
            self._live.update(self._render(state))

    def stop(self, state: ProgressState) -> None:
        if self._live is not None:
            self._live.update(self._render(state))
            self._live.stop()
            self._live = None


class NullProgress:
    def start(self, state: ProgressState) -> None:
        pass

    def update(self, state: ProgressState, message: str | None = None) -> None:
        pass

    def stop(self, state: ProgressState) -> None:
        pass


