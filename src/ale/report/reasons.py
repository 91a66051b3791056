"""Why runs did not score, grouped: one line per run (``ale.result.reason_line``),
the same lines counted by reason, for ``ale report``, the HTML report and
``ale exp status``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from html import escape
from typing import Any

from ale.status import RunStatus


@dataclass
class ReasonGroup:
    status: str
    reason: str
    runs: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.runs)


def not_scored(rows: Iterable[Any]) -> list[Any]:
    """The rows (RunRow or RunResult) whose status is not ``scored``."""
    return [r for r in rows if RunStatus(r.status) is not RunStatus.SCORED]


def left_out(rows: Iterable[Any]) -> list[Any]:
    """The report rows that do not enter the headline numbers (``headline`` None)."""
    return [r for r in rows if getattr(r, "headline", None) is None]


def _reason(row: Any) -> str:
    from ale.result import reason_line

    return getattr(row, "reason", None) or reason_line(row) or "-"


def group_reasons(rows: Iterable[Any]) -> list[ReasonGroup]:
    """The runs that did not score, grouped by (status, reason), largest group first."""
    groups: dict[tuple[str, str], ReasonGroup] = {}
    for r in not_scored(rows):
        status = RunStatus(r.status).value
        reason = _reason(r)
        groups.setdefault((status, reason), ReasonGroup(status, reason)).runs.append(r.run_id)
    return sorted(groups.values(), key=lambda g: (-g.count, g.status, g.reason))


def reason_lines(rows: Iterable[Any], limit: int | None = None) -> list[str]:
    """``<run id>: <status>: <reason>`` for each run that did not score."""
    lines = [f"{r.run_id}: {RunStatus(r.status).value}: {_reason(r)}" for r in not_scored(rows)]
    if limit is not None and len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more"]
    return lines


def html_section(rows: Iterable[Any], link: Any = None) -> str:
    """The HTML report's "Why runs did not score" section: each reason with its count
    (and its runs, linked when ``link(path, text)`` is given)."""
    rows = list(rows)
    groups = group_reasons(rows)
    by_id = {r.run_id: r for r in rows}
    out = [f"<h2>Why runs did not score ({sum(g.count for g in groups)})</h2>"]
    if not groups:
        out.append("<p class='ok'>every run scored</p>")
        return "\n".join(out)
    out.append("<table id='reasons'><tr><th>runs</th><th>status</th><th>reason</th><th>which</th></tr>")
    for g in groups:
        shown = g.runs[:20]
        names = ", ".join(
            link(getattr(by_id[i], "path", None), i) if link is not None else escape(i) for i in shown
        ) + (f" and {g.count - len(shown)} more" if g.count > len(shown) else "")
        out.append(f"<tr><td class='num'>{g.count}</td><td>{escape(g.status)}</td><td>{escape(g.reason)}</td>"
                   f"<td>{names}</td></tr>")
    out.append("</table>")
    return "\n".join(out)
