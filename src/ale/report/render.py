"""Render a Report as JSON, CSV (one row per run) or one self-contained HTML file.

The HTML has no external resource at all (inline CSS, inline SVG drawn here, no
script), so it opens offline and can be attached to an e-mail or published.
"""

from __future__ import annotations

import csv
import io
import os
from html import escape
from pathlib import Path
from typing import Any

from ale import layout
from ale.report.aggregate import TIERS, UNCLASSIFIED, Report
from ale.report.reasons import html_section as reasons_html
from ale.status import InvalidAttribution, RunStatus, is_charged

CSV_FIELDS = (
    "run_id", "unit_id", "item", "task", "variant", "agent", "repeat", "attempt",
    "status", "score", "counted", "headline", "attribution", "error", "path", "environment",
)

# Who an invalid run is charged to, as the report says it.
_CHARGED_TO: dict[str, str] = {
    InvalidAttribution.AFTER_AGENT_START: "the agent (counted as 0; review)",
    InvalidAttribution.BEFORE_AGENT: "the harness (excluded, retried)",
    InvalidAttribution.CONTROLLER_CONFIGURATION: "the controller's configuration (excluded)",
    InvalidAttribution.GRADING_ENVIRONMENT: "the grading environment (excluded, retried)",
}

_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac")


def to_json(report: Report) -> str:
    return report.model_dump_json(indent=2)


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for row in report.runs:
        d = row.model_dump(mode="json")
        w.writerow({k: ("" if d.get(k) is None else d.get(k)) for k in CSV_FIELDS})
    return buf.getvalue()


def _fmt(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _heat_color(v: float | None) -> str:
    """Red (0) through yellow (0.5) to green (1); grey when there is no score."""
    if v is None:
        return "#d9d9d9"
    v = min(max(v, 0.0), 1.0)
    if v < 0.5:
        r, g = 215, int(48 + (v / 0.5) * (200 - 48))
    else:
        r, g = int(215 - ((v - 0.5) / 0.5) * (215 - 26)), int(200 - ((v - 0.5) / 0.5) * (200 - 150))
    return f"rgb({r},{g},{60})"


def histogram_svg(report: Report, bins: int = 10) -> str:
    """Counts of admitted run scores in ``bins`` equal bins over [0, 1], per agent."""
    agents = [a.agent for a in report.agents]
    counts = {a: [0] * bins for a in agents}
    for row in report.runs:
        if row.counted and row.score is not None:
            b = min(int(max(row.score, 0.0) * bins), bins - 1)
            counts[row.agent][b] += 1
    step = max(1, -(-max([max(c) for c in counts.values()] + [1]) // 4))
    peak = step * 4
    w, h, left, bottom, top = 640, 260, 40, 40, 20
    plot_w, plot_h = w - left - 10, h - bottom - top
    group_w = plot_w / bins
    bar_w = max((group_w - 4) / max(len(agents), 1), 1)
    parts = [
        f'<svg id="histogram" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" role="img" aria-label="score distribution">'
    ]
    for i in range(5):
        y = top + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - 10}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{step * i}</text>')
    for b in range(bins):
        x0 = left + b * group_w + 2
        for j, a in enumerate(agents):
            n = counts[a][b]
            bh = plot_h * n / peak
            x = x0 + j * bar_w
            y = top + plot_h - bh
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{bh:.1f}" '
                f'fill="{_PALETTE[j % len(_PALETTE)]}"><title>{escape(a)}: {n} run(s) in '
                f'[{b / bins:.1f}, {(b + 1) / bins:.1f}{"]" if b == bins - 1 else ")"}</title></rect>'
            )
    for b in range(bins + 1):
        parts.append(
            f'<text x="{left + b * group_w:.1f}" y="{top + plot_h + 14}" font-size="10" '
            f'text-anchor="middle">{b / bins:.1f}</text>'
        )
    parts.append(f'<text x="{left + plot_w / 2}" y="{h - 6}" font-size="11" text-anchor="middle">score</text>')
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{w - 10}" y2="{top + plot_h}" stroke="#333"/>')
    parts.append("</svg>")
    legend = " ".join(
        f'<span class="key"><i style="background:{_PALETTE[j % len(_PALETTE)]}"></i>{escape(a)}</span>'
        for j, a in enumerate(agents)
    )
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def _flagged_row(row: Any) -> bool:
    return is_charged(row.status, row.attribution)


def _invalid(agent: Any) -> int:
    return agent.statuses.get(RunStatus.INVALID_EVALUATION_ENVIRONMENT, 0)


def heatmap_svg(report: Report) -> str:
    """Agents (rows) × items (columns), coloured by the agent's item score."""
    agents = [a.agent for a in report.agents]
    items = report.items
    cell = 44
    label_w = 20 + 7 * max([len(a) for a in agents] + [4])
    head_h = 24 + int(5.5 * max([len(i.item) for i in items] + [4]))
    # Column labels lean right (rotated -50 degrees): leave room for the last one.
    w = label_w + cell * max(len(items), 1) + 10 + int(4.5 * max([len(i.item) for i in items] + [4]))
    h = head_h + cell * max(len(agents), 1) + 10
    parts = [
        f'<svg id="heatmap" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" role="img" aria-label="agents by tasks heat map">'
    ]
    for j, item in enumerate(items):
        x = label_w + j * cell + cell / 2
        parts.append(
            f'<text x="{x:.1f}" y="{head_h - 6}" font-size="10" transform="rotate(-50 {x:.1f} {head_h - 6})">'
            f"{escape(item.item)}</text>"
        )
    for i, agent in enumerate(agents):
        y = head_h + i * cell
        parts.append(
            f'<text x="{label_w - 6}" y="{y + cell / 2 + 4:.1f}" font-size="11" text-anchor="end">{escape(agent)}'
            '</text>'
        )
        for j, item in enumerate(items):
            a = item.agents.get(agent)
            mean = a.mean if a else None
            x = label_w + j * cell
            tip = f"{agent} on {item.item}: " + (
                "no run" if a is None else f"{_fmt(mean)} ({len(a.scores)} scored of {a.runs})"
            )
            parts.append(
                f'<rect class="cell" x="{x}" y="{y}" width="{cell - 2}" height="{cell - 2}" '
                f'fill="{_heat_color(mean)}"><title>{escape(tip)}</title></rect>'
            )
            parts.append(
                f'<text x="{x + (cell - 2) / 2:.1f}" y="{y + cell / 2 + 3:.1f}" font-size="10" '
                f'text-anchor="middle">{_fmt(mean, 2)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0} th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#777} .bad{color:#b00020} .ok{color:#1b7f3b}
.legend .key{margin-right:14px;font-size:12px} .legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.scroll{overflow-x:auto} code{background:#f5f5f5;padding:0 3px}
"""  # noqa: E501


def _usage_line(u: dict[str, Any]) -> str:
    if not u:
        return "no model usage"
    line = f"{u.get('requests', 0)} model requests, {u.get('input_tokens', 0)} input tokens " \
           f"({u.get('cached_input_tokens', 0)} cached), {u.get('output_tokens', 0)} output tokens"
    return line + (f", ${u['cost_usd']:.4f}" if "cost_usd" in u else "")


def to_html(report: Report, *, link_base: str = "") -> str:
    """One HTML document; run links are ``link_base + row.path`` (relative paths)."""

    def link(path: str | None, text: str) -> str:
        if not path:
            return escape(text)
        return f'<a href="{escape(link_base + path)}">{escape(text)}</a>'

    title = f"ale report: {report.experiment or 'experiment'}"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="muted">generated {escape(report.generated_at.isoformat(timespec="seconds"))} · '
        f"{report.total_runs} runs ({report.attempts} attempts) · pass threshold {report.pass_threshold:g} · "
        f"95% intervals: percentile bootstrap over tasks, {report.bootstrap_samples} resamples, seed {report.seed}. "
        "Invalid runs, grading failures and infrastructure errors are counted but never scored.</p>",
    ]

    # agents
    max_k = max([max(a.pass_at_k) for a in report.agents if a.pass_at_k] + [0])
    kinds = ", ".join(f"{escape(k)}: {v}" for k, v in report.counts_by_kind.items())
    out.append(f"<h2>Agents</h2><p class='policy'>{escape(report.counting_policy)}</p><p class='kinds'>runs by "
               f"kind: {kinds}</p><table id='agents'><tr><th>agent</th><th>mean</th><th>95% CI</th>"
               f"<th>valid-only mean</th><th>pass rate ≥ {report.pass_threshold:g}</th>"
               + "".join(f"<th>pass@{k}</th>" for k in range(1, max_k + 1))
               + "<th>tasks scored</th><th>runs counted / final</th><th>invalid</th><th>flagged "
                 "(counted as 0)</th></tr>")
    for a in report.agents:
        ci = "–" if a.ci_low is None else f"[{_fmt(a.ci_low)}, {_fmt(a.ci_high)}]"
        out.append(
            f"<tr><td>{escape(a.agent)}</td><td class='num'>{_fmt(a.mean)}</td><td class='num'>{ci}</td>"
            f"<td class='num'>{_fmt(a.valid_mean)}</td>"
            f"<td class='num'>{_fmt(a.pass_rate)}</td>"
            + "".join(f"<td class='num'>{_fmt(a.pass_at_k.get(k))}</td>" for k in range(1, max_k + 1))
            + f"<td class='num'>{a.items}</td><td class='num'>{a.counted} / {a.runs}</td>"
            # Shown per agent: an agent that breaks its sandbox's checks voids its runs
            # instead of scoring 0 on them, so its invalid rate belongs beside its mean.
            + f"<td class='num{' bad' if _invalid(a) else ''}'>{_invalid(a)}</td>"
            + f"<td class='num{' bad' if a.flagged else ''}'>{a.flagged}</td></tr>"
        )
    out.append("</table>")

    # counts
    out.append("<h2>Runs by status</h2><table id='statuses'><tr><th>status</th><th>runs</th></tr>")
    for status, n in report.counts_by_status.items():
        cls = " class='bad'" if status == RunStatus.INVALID_EVALUATION_ENVIRONMENT and n else ""
        out.append(f"<tr><td{cls}>{escape(status)}</td><td class='num'>{n}</td></tr>")
    out.append("</table>")

    # cost and the model's failures
    if any(a.usage or a.model_failures for a in report.agents):
        out.append("<h2>Cost and model failures</h2><p class='muted'>From each run's gateway record: the "
                   "provider's own usage fields, priced with the run's price table (final attempts; every attempt: "
                   + escape(_usage_line(report.usage_all_attempts))
                   + "). Runs the model's provider ended are infrastructure "
                   "errors: left out of the headline, counted here.</p>")
        out.append("<table id='cost'><tr><th>agent</th><th>model requests</th><th>input tokens</th><th>cached</th>"
                   "<th>output tokens</th><th>cost (USD)</th><th>model failures</th></tr>")
        for a in report.agents:
            u = a.usage
            fails = ", ".join(f"{k} {v}" for k, v in a.model_failures.items()) or "none"
            out.append(f"<tr><td>{escape(a.agent)}</td>" + "".join(
                f"<td class='num'>{u.get(k, 0)}</td>"
                for k in ("requests", "input_tokens", "cached_input_tokens", "output_tokens"))
                + "<td class='num'>" + ("" if "cost_usd" not in u else f"{u['cost_usd']:.4f}")
                + f"</td><td>{escape(fails)}</td></tr>")
        out.append("</table>")

    # plots
    out.append("<h2>Score distribution (admitted runs)</h2>")
    out.append(histogram_svg(report))
    out.append("<h2>Agents × tasks</h2><div class='scroll'>")
    out.append(heatmap_svg(report))
    out.append("</div>")

    # tiers
    out.append(
        "<h2>Difficulty tiers</h2>"
        f"<p class='muted'>By the best agent's score on the task (valid runs only): near-term ≥ "
        f"{report.tier_rules.near_term_min:g}, last-exam &lt; {report.tier_rules.last_exam_below:g}, "
        "full-spectrum in between.</p><table id='tiers'><tr><th>tier</th><th>tasks</th></tr>"
    )
    for tier in (*TIERS, UNCLASSIFIED):
        items = report.tiers.get(tier, [])
        out.append(f"<tr><td>{tier}</td><td>{escape(', '.join(items)) or '–'}</td></tr>")
    out.append("</table>")

    # per task
    agents = [summary.agent for summary in report.agents]
    out.append("<h2>Tasks</h2><div class='scroll'><table id='items'><tr><th>task</th><th>tier</th><th>best</th>"
               + "".join(f"<th>{escape(a)}</th>" for a in agents) + "</tr>")
    for item in report.items:
        cells = []
        for name in agents:
            summary = item.agents.get(name)
            if summary is None:
                cells.append("<td class='muted'>–</td>")
            else:
                cells.append(f"<td class='num'>{_fmt(summary.mean)} "
                             f"<span class='muted'>({len(summary.scores)}/{summary.runs})</span></td>")
        out.append(f"<tr><td>{escape(item.item)}</td><td>{item.tier}</td><td class='num'>{_fmt(item.best)}"
                   f"</td>{''.join(cells)}</tr>")
    out.append("</table></div>")

    out.append(reasons_html(report.runs, link))

    # invalid
    uncounted = [r for r in report.runs
                 if r.status in (RunStatus.INVALID_EVALUATION_ENVIRONMENT, RunStatus.GRADING_FAILED)]
    out.append(f"<h2>Invalid runs and grading failures ({len(uncounted)}; flagged for review: "
               f"{len(report.flagged_runs)})</h2>")
    if uncounted:
        out.append("<table id='invalid'><tr><th>run</th><th>agent</th><th>task</th><th>status</th><th>charged to</th>"
                   "<th>reason</th></tr>")
        for r in uncounted:
            charged = _CHARGED_TO.get(str(r.attribution), "unattributed")
            cls = " class='bad'" if _flagged_row(r) else ""
            out.append(
                f"<tr{cls}><td>{link(r.path, r.run_id)}</td><td>{escape(r.agent)}</td><td>{escape(r.item)}</td>"
                f"<td>{escape(r.status.value)}</td><td>{escape(charged)}</td><td>{escape(r.error or '')}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p class='ok'>none</p>")

    # warnings (scored as they are)
    if report.warned_runs:
        out.append(f"<h2>Runs with warnings ({len(report.warned_runs)})</h2>")
        out.append("<table id='warnings'><tr><th>run</th><th>agent</th><th>task</th><th>warning</th></tr>")
        for r in report.warned_runs:
            out.append(f"<tr><td>{link(r.path, r.run_id)}</td><td>{escape(r.agent)}</td><td>{escape(r.item)}</td>"
                       f"<td>{escape('; '.join(r.warnings))}</td></tr>")
        out.append("</table>")

    if report.resumed:
        rs = report.resumed
        out.append(f"<h2>Resumed runs ({rs['runs']})</h2><p class='muted'>Continued from an interrupted attempt's "
                   f"gateway record: {rs['replayed_turns']} recorded model turn(s) replayed (their tool calls run "
                   f"again, the model not called, not billed again), {rs['diverged']} run(s) diverged from the record "
                   "and went live there. Each is marked <b>resumed</b> below.</p>")

    # every run
    out.append("<h2>All runs</h2><div class='scroll'><table id='runs'><tr><th>run</th><th>agent</th><th>task</th>"
               "<th>repeat</th><th>attempt</th><th>status</th><th>score</th><th>why not scored</th>"
               "<th>trajectory</th></tr>")
    for r in report.runs:
        score = _fmt(r.score) if r.counted else f"<span class='muted'>{_fmt(r.score)} (not counted)</span>"
        out.append(
            f"<tr><td>{link(r.path, r.run_id)}</td><td>{escape(r.agent)}</td><td>{escape(r.item)}</td>"
            f"<td class='num'>{r.repeat}</td><td class='num'>{r.attempt}</td><td>{escape(r.status.value)}</td>"
            f"<td class='num'>{score}</td><td class='reason'>{escape(r.reason or '')}{_resumed_note(r)}</td>"
            f"<td>{link(r.trajectory, layout.TRAJECTORY) if r.trajectory else '–'}</td></tr>"
        )
    out.append("</table></div></body></html>")
    return "\n".join(out)


def _resumed_note(r: Any) -> str:
    """A resumed run's mark in the runs table: from where, what was replayed, where it diverged (never hidden)."""
    res = getattr(r, "resumed", None)
    if not res:
        return ""
    diverged = (f"; diverged at turn {res.get('diverged_at')}: {res.get('divergence') or ''}" if res.get("diverged_at")
                else f"; live from turn {res.get('live_from')}" if res.get("live_from") else "")
    return (f"<div class='resumed'><b>resumed</b> from {escape(str(res.get('source_run_id') or ''))}: "
            f"{res.get('replayed_turns')} turn(s) replayed{escape(diverged)}</div>")


def write_html(report: Report, dest: Path, exp_dir: Path) -> Path:
    """Write the HTML report; run links stay relative from dest's folder to exp_dir."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(Path(exp_dir).resolve(), dest.parent.resolve())
    base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(to_html(report, link_base=base), encoding="utf-8")
    tmp.replace(dest)
    return dest
