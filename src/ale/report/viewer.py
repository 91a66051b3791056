"""`ale view`: a run (or an experiment) as one static, self-contained HTML page.

The page has no external resource (inline CSS and script, screenshots as
``data:`` URIs up to a budget, links to the run folder's own files otherwise),
so it opens offline from ``file://`` and needs no server. It is written *outside*
the signed run folder (``<run>.view.html`` beside it, or ``<experiment>/views/``)
so that ``ale verify`` still passes after viewing.

A run page shows the task and the prompt, the phases on a timeline, every
trajectory step (tool, arguments, output, exit code, time; screenshots inline),
the model's turns from the gateway's record joined to the steps they produced,
the deliverables (sizes, what was skipped and why), the grader's ``task.log``,
the scores and status (with the one-line reason when not scored) and the
evidence verdict of ``ale verify``, check by check. An experiment page lists its
runs, filterable by agent, task and status, and links a page per run.

Everything the candidate could have written is text: server-side it goes through
``html.escape``, client-side only through ``textContent`` (the steps travel as
JSON in a ``<script type="application/json">`` block whose ``<``, ``>`` and
``&`` are escaped); ANSI escape sequences are removed and other control
characters written as ``\\xNN``. Long values are cut (``SHOWN_BYTES``; less in
a run so large that ``PAGE_TEXT_BUDGET`` would be passed) with a link to the
file holding the whole value; the steps are rendered a page at a time, so a
10,000-step run opens quickly.
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

from ale import __version__, layout
from ale.status import RunStatus

VIEW_SUFFIX = ".view.html"  # a run's page: <run_dir>.view.html, beside the (signed) run folder
VIEWS_DIR = "views"  # an experiment's pages: <output>/views/index.html and <output>/views/<run_id>.html
EXPERIMENT_PAGE = "index.html"
SHOWN_BYTES = 4096  # of one value (an output, the arguments, a model text) shown on the page
SHOWN_MIN = 1024  # ... at least, in a run so large that the page's budget is spread thin
PAGE_TEXT_BUDGET = 16 * 1024 * 1024  # step values on one page, in all: 10,000 steps show 1.6 KB of each
TASK_LOG_SHOWN = 64 * 1024
IMAGE_BUDGET = 8 * 1024 * 1024  # screenshot bytes embedded as data: URIs per page; later ones are linked
STEPS_PER_PAGE = 100
_PNG = b"\x89PNG\r\n\x1a\n"

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


# -- text made inert ------------------------------------------------------------------
def clean(text: Any) -> str:
    """Candidate text as plain, printable text: ANSI escape sequences removed,
    other control characters written ``\\xNN``, lone surrogates replaced."""
    s = text if isinstance(text, str) else ("" if text is None else str(text))
    s = _ANSI.sub("", s)
    s = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s)
    return s.encode("utf-8", "replace").decode("utf-8")


def esc(text: Any) -> str:
    return html.escape(clean(text), quote=True)


def cut(text: Any, limit: int = SHOWN_BYTES) -> tuple[str, int, bool]:
    """``(shown, total_bytes, was_cut)``: the first ``limit`` bytes of the cleaned text."""
    raw = text if isinstance(text, str) else ("" if text is None else str(text))
    total = len(raw.encode("utf-8", "surrogatepass"))
    s = clean(raw[: 2 * limit])  # never more than needed: a 10 KB output of which 1 KB is shown
    data = s.encode("utf-8")
    if len(data) <= limit and len(raw) <= 2 * limit:
        return s, total, False
    return data[:limit].decode("utf-8", "ignore"), total, True


def json_for_script(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&``."""
    s = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _size(n: int | None) -> str:
    if n is None:
        return "–"
    f = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if f < 1024 or unit == "GB":
            return f"{int(f)} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    return f"{n} B"


def _safe_rel(name: Any) -> str | None:
    """A run-relative path that may become a link: relative, no ``..``, no scheme."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name or ":" in name:
        return None
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts:
        return None
    return p.as_posix()


# -- reading a run folder (never trusting it to be whole) ---------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def _read_text(path: Path, limit: int) -> tuple[str | None, int]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data = f.read(limit + 4)
    except OSError:
        return None, 0
    return data.decode("utf-8", "replace"), size


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


@dataclass
class Prompt:
    text: str | None
    source: str  # where it was found, or why it is missing


def find_prompt(run_dir: Path, trajectory: dict[str, Any], plan: dict[str, Any]) -> Prompt:
    """The prompt the agent received, from the run folder: ``agent/prompt.txt`` (a
    command agent's harness reads it), a ``prompt`` the agent's evidence or the
    trajectory records. When none is there, the task card's title and summary
    (from the task folder, as it is now), and the page says so."""
    rel = layout.agent_path(layout.Agent.PROMPT)
    text, _ = _read_text(run_dir / rel, 1 << 20)
    if text is not None:
        return Prompt(text, f"{rel} (the prompt file the agent's harness read)")
    evidence = _read_json(run_dir / layout.evidence_path(layout.Evidence.AGENT))
    for where, doc in ((layout.evidence_path(layout.Evidence.AGENT), evidence),
                       (layout.TRAJECTORY, trajectory.get("extra"))):
        if isinstance(doc, dict) and isinstance(doc.get("prompt"), str):
            return Prompt(doc["prompt"], f"{where} (prompt)")
    task_dir = plan.get("task_dir")
    note = "The prompt the agent received is not recorded in this run folder"
    if isinstance(task_dir, str) and task_dir:
        from ale.tasks.card import load_card
        from ale.tasks.errors import TaskError

        try:
            raw = load_card(task_dir).raw
        except (TaskError, OSError):
            raw = {}
        described = "\n\n".join(str(raw[k]) for k in ("title", "summary", "description") if isinstance(raw.get(k), str))
        if described:
            return Prompt(None,
                          f"{note}; the task card in {task_dir} (as it is now, not as it was) describes the task "
                          f"as:\n\n{described}")
        return Prompt(None, f"{note}, and the task folder {task_dir} has no task card describing it.")
    return Prompt(None, note + ".")


def one_line_reason(result: dict[str, Any]) -> str | None:
    """Why a run did not score, in one line (None when it scored)."""
    if result.get("status") == RunStatus.SCORED and result.get("score") is not None:
        return None
    for text in (result.get("error"), *(result.get("violations") or [])):
        if isinstance(text, str) and text.strip():
            line = clean(text.strip().splitlines()[0])
            return line if len(line) <= 300 else line[:297] + "..."
    if not result:
        return "no result.json: the run did not finish (or its record is unreadable)"
    return None


@dataclass
class RunData:
    run_dir: Path
    plan: dict[str, Any]
    result: dict[str, Any]
    trajectory: dict[str, Any]
    deliverables: dict[str, Any] | None
    prompt: Prompt
    verify: Any = None  # ale.record.verify.VerifyReport, or None when not verified
    notes: list[str] = field(default_factory=list)


def load_run(run_dir: Path, *, verify: bool = True) -> RunData:
    run_dir = Path(run_dir)
    notes: list[str] = []
    plan = _read_json(run_dir / layout.PLAN)
    result = _read_json(run_dir / layout.RESULT)
    trajectory = _read_json(run_dir / layout.TRAJECTORY)
    if not isinstance(trajectory, dict):
        trajectory = {}
        steps = []
        try:
            for line in (run_dir / layout.TRAJECTORY_LOG).read_text(errors="replace").splitlines():
                try:
                    steps.append(json.loads(line))
                except ValueError:
                    continue
        except OSError:
            pass
        if steps:
            notes.append(f"{layout.TRAJECTORY} is missing or unreadable: the steps shown are those of "
                         f"{layout.TRAJECTORY_LOG}")
            trajectory = {"steps": steps}
        else:
            notes.append(f"no readable {layout.TRAJECTORY} or {layout.TRAJECTORY_LOG}: no steps to show")
    if trajectory.get("steps_source") == "gateway":
        derivation = trajectory["steps_derivation"] if isinstance(trajectory.get("steps_derivation"), dict) else {}
        notes.append("the steps are derived from the gateway's record "
                     f"({layout.gateway_path(layout.Gateway.RECORDS)}): each call as the model made it, each result as "
                     f"the harness sent it back; {derivation.get('unanswered', 0)} call(s) without a result, "
                     f"{derivation.get('malformed', 0)} malformed part(s) skipped")
    if isinstance(trajectory.get("harness_transcript"), str):
        notes.append("the harness's own transcript, written by the candidate: "
                     f"{clean(trajectory['harness_transcript'])}")
    if not trajectory.get("model_turns"):
        turns = _read_json(run_dir / layout.gateway_path(layout.Gateway.TURNS))
        if isinstance(turns, dict) and isinstance(turns.get("turns"), list):
            trajectory["model_turns"] = turns["turns"]
    deliverables = _read_json(run_dir / layout.DELIVERABLES)
    plan = plan if isinstance(plan, dict) else {}
    result = result if isinstance(result, dict) else {}
    report = None
    if verify:
        from ale.record.verify import verify_run_dir

        report = verify_run_dir(run_dir)
    return RunData(run_dir, plan, result, trajectory, deliverables if isinstance(deliverables, dict) else None,
                   find_prompt(run_dir, trajectory, plan), report, notes)


# -- the steps and turns, as the page's JSON --------------------------------------------
class _Links:
    """Links from the page to files of the run folder (relative to the page), and
    screenshots embedded while the budget lasts."""

    def __init__(self, run_dir: Path, page_dir: Path, image_budget: int = IMAGE_BUDGET):
        self.run_dir = run_dir
        rel = os.path.relpath(run_dir.resolve(), page_dir.resolve())
        self.base = "" if rel == "." else quote(rel.replace(os.sep, "/")) + "/"
        self.budget = image_budget

    def href(self, name: str) -> str | None:
        safe = _safe_rel(name)
        return None if safe is None else self.base + quote(safe)

    def image(self, name: Any, under: str = layout.TRAJECTORY_FILES) -> str | None:
        safe = _safe_rel(name)
        if safe is None or not safe.startswith(under + "/"):
            return None
        path = self.run_dir / safe
        try:
            size = path.stat().st_size
            if size <= self.budget:
                data = path.read_bytes()
                if data.startswith(_PNG):
                    self.budget -= len(data)
                    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")
                return None
        except OSError:
            return None
        return self.href(safe)


def _value(step: dict[str, Any], name: str, links: _Links, limit: int) -> dict[str, Any] | None:
    text = step.get(name)
    if not isinstance(text, str) or not text:
        return None
    shown, total, was_cut = cut(text, limit)
    ref = (step.get("files") or {}).get(name)
    out: dict[str, Any] = {"name": name, "text": shown, "bytes": total, "cut": was_cut}
    if isinstance(ref, dict):
        out["href"] = links.href(str(ref.get("path")))
        out["bytes"] = ref.get("bytes", total)
        out["cut"] = True if out["href"] else was_cut
    elif was_cut:
        out["href"] = links.href(layout.TRAJECTORY)
    return out


_VALUES = ("stdout", "stderr", "output")


def _args_text(args: Any) -> str:
    try:
        return json.dumps(args, indent=1, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        return str(args)


def build_steps(data: RunData, links: _Links) -> dict[str, Any]:
    """The page's JSON: steps, model turns and the order to show them in."""
    traj = data.trajectory
    raw_steps = [s for s in traj.get("steps") or [] if isinstance(s, dict)]
    turns_raw = [t for t in traj.get("model_turns") or [] if isinstance(t, dict)]
    start = _time(traj.get("started_at"))
    produced: dict[int, int] = {}
    turns: list[dict[str, Any]] = []
    for n, t in enumerate(turns_raw, 1):
        calls = []
        for c in t.get("tool_calls") or []:
            if not isinstance(c, dict):
                continue
            args = c.get("arguments")
            if isinstance(args, str):
                with contextlib.suppress(ValueError):
                    args = json.loads(args)
            shown, _, was_cut = cut(_args_text(args), 1024)
            step = c.get("step") if isinstance(c.get("step"), int) else None
            if step is not None:
                produced.setdefault(step, n)
            calls.append({"name": clean(c.get("name") or "?"), "args": shown + (" …" if was_cut else ""), "step": step})
        usage: dict[str, Any] = t["usage"] if isinstance(t.get("usage"), dict) else {}
        text, _, text_cut = cut(t.get("text") or "")
        reasoning, _, r_cut = cut(t.get("reasoning") or "")
        turns.append({
            "n": n, "request": t.get("request"), "time": clean(t.get("time") or ""),
            "model": clean(t.get("model") or ""),
            "api": clean(t.get("api") or ""), "decision": clean(t.get("decision") or ""), "status": t.get("status"),
            "messages": t.get("messages"),
            "usage": {clean(k): v for k, v in usage.items() if isinstance(v, int | float) and not isinstance(v, bool)},
            "text": text + (" …[cut]" if text_cut else ""), "reasoning": reasoning + (" …[cut]" if r_cut else ""),
            "calls": calls,
        })
    # Each value shows SHOWN_BYTES, unless the run is so large that the page would
    # pass its budget: then an equal share of it (never less than SHOWN_MIN).
    n_values = sum(1 + sum(1 for k in _VALUES if s.get(k)) for s in raw_steps)
    limit = max(SHOWN_MIN, min(SHOWN_BYTES, PAGE_TEXT_BUDGET // max(n_values, 1)))
    steps: list[dict[str, Any]] = []
    for s in raw_steps:
        index: int = s["index"] if isinstance(s.get("index"), int) else len(steps) + 1
        t0 = _time(s.get("started_at"))
        args_shown, args_total, args_cut = cut(_args_text(s.get("args") or {}), limit)
        values = [v for v in (_value(s, k, links, limit) for k in _VALUES) if v is not None]
        image_ref = (s.get("files") or {}).get("image")
        steps.append({
            "i": index, "tool": clean(s.get("tool") or "?"), "args": args_shown, "args_cut": args_cut,
            "args_bytes": args_total, "ok": bool(s.get("ok")), "refused": bool(s.get("refused")),
            "exit": s.get("exit_code") if isinstance(s.get("exit_code"), int) else None,
            "timed_out": bool(s.get("timed_out")), "truncated": bool(s.get("truncated")),
            "error": clean(s.get("error")) if s.get("error") else None,
            "t": clean(s.get("started_at") or ""),
            "s": s.get("seconds") if isinstance(s.get("seconds"), int | float) else None,
            "off": round((t0 - start).total_seconds(), 3) if t0 and start else None,
            "values": values,
            "image": links.image(image_ref.get("path")) if isinstance(image_ref, dict) else None,
            "turn": produced.get(index),
        })
    # Order: each turn just before the first step it produced; a turn that produced
    # none, before the first step that started after it.
    order: list[tuple[float, int, str, int]] = [(float(s["i"]), 1, "s", s["i"]) for s in steps]
    for t in turns:
        first = min((c["step"] for c in t["calls"] if c["step"] is not None), default=None)
        if first is None:
            tt = _time(t["time"])
            later = [s["i"] for s in steps if tt and _time(s["t"]) and _time(s["t"]) >= tt]  # type: ignore[operator]
            first = min(later) if later else (max((s["i"] for s in steps), default=0) + 1)
        order.append((first - 0.5, 0, "t", t["n"]))
    order.sort()
    return {"steps": steps, "turns": turns, "order": [[kind, n] for _, _, kind, n in order], "per_page": STEPS_PER_PAGE,
            "shown": limit}


# -- the page ------------------------------------------------------------------------------
_CSS = """
:root{--bad:#b00020;--ok:#1b7f3b;--warn:#9a6700;--muted:#6b6b6b;--line:#ddd}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222}
header{background:#1f2937;color:#fff;padding:14px 24px} header h1{font-size:19px;margin:0 0 6px;word-break:break-all}
header .meta{font-size:13px;opacity:.9} header a{color:#cde}
nav{position:sticky;top:0;background:#f6f7f9;border-bottom:1px solid var(--line);padding:6px 24px;z-index:2}
nav a{margin-right:14px;font-size:13px}
main{padding:4px 24px 40px;max-width:1280px}
h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
table{border-collapse:collapse;margin:6px 0} th,td{border:1px solid var(--line);padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f5f5f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f7f7f7;border:1px solid #e5e5e5;padding:6px 8px;margin:4px 0;white-space:pre-wrap;word-break:break-word;max-height:420px;overflow:auto;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;background:#e5e7eb;color:#111}
.badge.ok{background:#d1fae5;color:#065f46} .badge.bad{background:#fee2e2;color:#991b1b} .badge.warn{background:#fef3c7;color:#92400e}
.muted{color:var(--muted)} .bad{color:var(--bad)} .ok{color:var(--ok)} .reason{margin-top:6px;font-size:14px;color:#fecaca}
.bar{position:relative;height:14px;background:#eef;min-width:420px} .bar i{position:absolute;top:0;height:14px;background:#4e79a7}
.step,.turn{border:1px solid var(--line);border-radius:6px;margin:8px 0;padding:6px 10px}
.turn{background:#f5f8ff;border-color:#c7d2fe} .step.failed{border-color:#f5b5b5;background:#fffafa}
.step h3,.turn h3{font-size:14px;margin:0 0 4px} .step h3 .tool{font-family:ui-monospace,Menlo,monospace}
.step img{max-width:min(100%,1024px);border:1px solid #ccc;margin:4px 0;display:block}
.screens{display:flex;flex-wrap:wrap;gap:16px}.screens figure{margin:0;max-width:min(100%,640px)}
.screens img{max-width:100%;border:1px solid #ccc;display:block}
.controls{margin:6px 0 4px} .controls>*{margin-right:10px}
.label{font-size:12px;color:var(--muted);margin-top:4px}
details>summary{cursor:pointer}
"""  # noqa: E501

_STEPS_JS = r"""
(function(){
  "use strict";
  var holder = document.getElementById("ale-data");
  if (!holder) { return; }
  var data = JSON.parse(holder.textContent);
  var steps = {}, turns = {};
  data.steps.forEach(function(s){ steps[s.i] = s; });
  data.turns.forEach(function(t){ turns[t.n] = t; });
  var list = document.getElementById("steps-list");
  var info = document.getElementById("steps-page");
  var toolSel = document.getElementById("steps-tool");
  var failedOnly = document.getElementById("steps-failed");
  var page = 0, items = [];
  function el(tag, cls, text){
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function pre(label, text, href, note){
    var box = el("div");
    var l = el("div", "label", label + (note ? " · " + note : ""));
    if (href) { l.appendChild(document.createTextNode(" · ")); var a = el("a", null, "full value"); a.href = href; l.appendChild(a); }
    box.appendChild(l); box.appendChild(el("pre", null, text)); return box;
  }
  function stepLink(i){
    var a = el("a", null, "step " + i); a.href = "#step-" + i;
    a.addEventListener("click", function(ev){ ev.preventDefault(); goTo(i); }); return a;
  }
  function kb(n){ return n < 1024 ? n + " B" : (n / 1024).toFixed(1) + " KB"; }
  function renderStep(s){
    var failed = !s.ok || s.refused || s.timed_out || (s.exit !== null && s.exit !== 0);
    var box = el("div", "step" + (failed ? " failed" : "")); box.id = "step-" + s.i;
    var h = el("h3"); h.appendChild(document.createTextNode("#" + s.i + " "));
    h.appendChild(el("span", "tool", s.tool));
    var flags = [];
    if (s.exit !== null) { flags.push("exit " + s.exit); }
    if (s.refused) { flags.push("refused"); } if (s.timed_out) { flags.push("timed out"); }
    if (!s.ok && !s.refused) { flags.push("failed"); } if (s.truncated) { flags.push("output truncated by the tool"); }
    if (flags.length) { h.appendChild(el("span", failed ? "badge bad" : "badge", flags.join(" · "))); }
    var when = [];
    if (s.off !== null) { when.push("+" + s.off.toFixed(3) + " s"); }
    if (s.s !== null) { when.push(s.s.toFixed(3) + " s long"); }
    if (s.t) { when.push(s.t); }
    h.appendChild(el("span", "muted", "  " + when.join(" · ")));
    box.appendChild(h);
    if (s.turn) { var from = el("div", "label", "asked for by model turn " + s.turn); box.appendChild(from); }
    box.appendChild(pre("arguments", s.args, null, s.args_cut ? "first " + kb(data.shown) + " of " + kb(s.args_bytes) : ""));
    s.values.forEach(function(v){
      box.appendChild(pre(v.name, v.text, v.href, v.cut ? "first " + kb(data.shown) + " of " + kb(v.bytes) : ""));
    });
    if (s.error) { box.appendChild(pre("error", s.error)); }
    if (s.image) { var img = el("img"); img.alt = "screenshot of step " + s.i; img.loading = "lazy"; img.src = s.image; img.className = "screenshot"; box.appendChild(img); }
    return box;
  }
  function renderTurn(t){
    var box = el("div", "turn"); box.id = "turn-" + t.n;
    var h = el("h3", null, "model turn " + t.n + (t.model ? " · " + t.model : ""));
    var u = [];
    Object.keys(t.usage).forEach(function(k){ u.push(k + " " + t.usage[k]); });
    if (u.length) { h.appendChild(el("span", "muted", "  " + u.join(" · "))); }
    box.appendChild(h);
    var meta = [];
    if (t.request !== null && t.request !== undefined) { meta.push("request " + t.request); }
    if (t.messages !== null && t.messages !== undefined) { meta.push(t.messages + " message(s) sent"); }
    if (t.decision) { meta.push(t.decision); } if (t.status !== null && t.status !== undefined) { meta.push("HTTP " + t.status); }
    if (t.time) { meta.push(t.time); }
    box.appendChild(el("div", "label", meta.join(" · ")));
    if (t.reasoning) { box.appendChild(pre("reasoning", t.reasoning)); }
    if (t.text) { box.appendChild(pre("text", t.text)); }
    t.calls.forEach(function(c){
      var line = el("div", "label", "tool call " + c.name + " ");
      if (c.step) { line.appendChild(document.createTextNode("→ ")); line.appendChild(stepLink(c.step)); }
      else { line.appendChild(document.createTextNode("(no bridge step)")); }
      box.appendChild(line); box.appendChild(el("pre", null, c.args));
    });
    return box;
  }
  function keep(it){
    if (it[0] === "t") { return toolSel.value === "" && !failedOnly.checked; }
    var s = steps[it[1]];
    if (toolSel.value !== "" && s.tool !== toolSel.value) { return false; }
    if (failedOnly.checked && s.ok && !s.refused && !s.timed_out && (s.exit === null || s.exit === 0)) { return false; }
    return true;
  }
  function pages(){ return Math.max(1, Math.ceil(items.length / data.per_page)); }
  function render(){
    while (list.firstChild) { list.removeChild(list.firstChild); }
    var frag = document.createDocumentFragment();
    items.slice(page * data.per_page, (page + 1) * data.per_page).forEach(function(it){
      frag.appendChild(it[0] === "t" ? renderTurn(turns[it[1]]) : renderStep(steps[it[1]]));
    });
    list.appendChild(frag);
    info.textContent = "page " + (page + 1) + " of " + pages() + " · " + items.length + " item(s)";
  }
  function refilter(){ items = data.order.filter(keep); page = 0; render(); }
  function goTo(i){
    toolSel.value = ""; failedOnly.checked = false; items = data.order.filter(keep);
    for (var k = 0; k < items.length; k++) { if (items[k][0] === "s" && items[k][1] === i) { page = Math.floor(k / data.per_page); break; } }
    render(); var target = document.getElementById("step-" + i);
    if (target) { target.scrollIntoView(); history.replaceState(null, "", "#step-" + i); }
  }
  var tools = {}; data.steps.forEach(function(s){ tools[s.tool] = (tools[s.tool] || 0) + 1; });
  Object.keys(tools).sort().forEach(function(name){ var o = el("option", null, name + " (" + tools[name] + ")"); o.value = name; toolSel.appendChild(o); });
  toolSel.addEventListener("change", refilter); failedOnly.addEventListener("change", refilter);
  document.getElementById("steps-prev").addEventListener("click", function(){ if (page > 0) { page--; render(); } });
  document.getElementById("steps-next").addEventListener("click", function(){ if (page < pages() - 1) { page++; render(); } });
  document.getElementById("steps-all").addEventListener("click", function(){ data.per_page = Math.max(items.length, 1); page = 0; render(); });
  refilter();
  var m = /^#step-(\d+)$/.exec(location.hash); if (m) { goTo(parseInt(m[1], 10)); }
  document.body.setAttribute("data-ready", "1");
})();
"""  # noqa: E501


def _badge(status: str | None, ident: str = "") -> str:
    cls = "ok" if status == RunStatus.SCORED else ("bad" if status else "warn")
    attr = f' id="{ident}"' if ident else ""
    return f'<span class="badge {cls}"{attr}>{esc(status or "no result")}</span>'


def _head(title: str) -> list[str]:
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            # Nothing from outside: no fetch, no frame, only this page's own style and script.
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data: file: 'self'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">",
            f"<title>{esc(title)}</title>", f"<style>{_CSS}</style></head><body>"]


def _section_task(d: RunData) -> list[str]:
    r, p = d.result, d.plan
    agent: dict[str, Any] = p["agent"] if isinstance(p.get("agent"), dict) else {}
    rows = [
        ("task", r.get("task_id") or p.get("task_dir")), ("variant", r.get("variant", p.get("variant"))),
        ("agent", (agent.get("label") or agent.get("name") or r.get("agent"))),
        ("agent configuration", json.dumps(agent.get("config")) if agent.get("config") else None),
        ("task folder", r.get("task_dir") or p.get("task_dir")), ("image", p.get("image")),
        ("experiment", r.get("experiment") or p.get("experiment")), ("attempt", r.get("attempt")),
        ("started", r.get("started_at")), ("ended", r.get("ended_at")), ("agent's end", d.trajectory.get("ended")),
        ("harness", r.get("harness_version")),
    ]
    out = ['<section id="task"><h2>Task and prompt</h2><table id="run-facts">']
    out += [f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows if v not in (None, "")]
    out.append("</table>")
    if d.prompt.text is not None:
        shown, total, was_cut = cut(d.prompt.text, 64 * 1024)
        out.append(f'<div class="label">the prompt, from {esc(d.prompt.source)}'
                   + (f" (first 64 KB of {_size(total)})" if was_cut else "")
                   + f'</div><pre id="prompt">{esc(shown)}</pre>')
    else:
        out.append(f'<pre id="prompt" class="muted">{esc(d.prompt.source)}</pre>')
    return out + ["</section>"]


def _phases(d: RunData) -> list[dict[str, Any]]:
    phases = d.result.get("phases")
    if not isinstance(phases, list) or not phases:
        phases = _read_json(d.run_dir / layout.evidence_path(layout.Evidence.PHASES))
    return [p for p in phases or [] if isinstance(p, dict)]


def _section_timeline(d: RunData) -> list[str]:
    phases = _phases(d)
    out = ['<section id="timeline"><h2>Timeline</h2>']
    times = [(p, _time(p.get("started_at")), _time(p.get("ended_at"))) for p in phases]
    known = [t for _, a, b in times for t in (a, b) if t]
    start = _time(d.result.get("started_at")) or (min(known) if known else None)
    end = _time(d.result.get("ended_at")) or (max(known) if known else None)
    if not phases or start is None or end is None:
        return out + ['<p class="muted">no phase times recorded</p></section>']
    total = max((end - start).total_seconds(), 1e-3)
    out.append(f'<p class="muted">the run took {total:.3f} s, from '
               f'{esc(d.result.get("started_at") or start.isoformat())}</p><table id="phases"><tr><th>phase</th>'
               '<th>starts at</th><th>seconds</th><th>on the run\'s time line</th></tr>')
    for p, a, b in times:
        left = ((a - start).total_seconds() / total * 100) if a else 0
        width = (((b - a).total_seconds() / total) * 100) if a and b else 0
        secs = p.get("seconds")
        out.append(f"<tr><td>{esc(p.get('name'))}</td>"
                   f"<td class='num'>{f'+{(a - start).total_seconds():.3f} s' if a else '–'}</td>"
                   f"<td class='num'>{esc(f'{secs:.3f}' if isinstance(secs, int | float) else '–')}</td><td>"
                   f"<div class='bar'><i style='left:{left:.2f}%;width:{max(width, 0.3):.2f}%'></i></div></td></tr>")
    return out + ["</table></section>"]


def _section_scores(d: RunData) -> list[str]:
    r = d.result
    out = ['<section id="scores"><h2>Scores and status</h2><table id="score-table">',
           f"<tr><th>status</th><td>{_badge(r.get('status'), 'status')}</td></tr>",
           f"<tr><th>score</th><td id='score'>{esc(r.get('score') if r.get('score') is not None else '–')}</td></tr>",
           "<tr><th>scores (per check)</th>"
           f"<td>{esc(', '.join(str(s) for s in r.get('scores') or []) or '–')}</td></tr>"]
    reason = one_line_reason(r)
    if reason:
        out.append(f"<tr><th>why not scored</th><td class='bad' id='reason'>{esc(reason)}</td></tr>")
    if r.get("invalid_attribution"):
        out.append(f"<tr><th>charged to</th><td>{esc(r.get('invalid_attribution'))}</td></tr>")
    out.append("</table>")
    if r.get("error") and "\n" in str(r.get("error")):
        out.append(f"<div class='label'>the whole error</div><pre>{esc(cut(r['error'])[0])}</pre>")
    if r.get("violations"):
        out.append("<div class='label'>violations</div><ul id='violations'>"
                   + "".join(f"<li>{esc(v)}</li>" for v in r["violations"]) + "</ul>")
    return out + ["</section>"]


def _section_verdict(d: RunData) -> list[str]:
    out = ['<section id="verdict"><h2>Evidence verdict (ale verify)</h2>']
    rep = d.verify
    if rep is None:
        return out + ['<p class="muted">not verified for this page (run <code>ale verify</code> on the run folder)</p>'
                      '</section>']
    label = "UNUSABLE" if not rep.usable else ("VALID" if rep.valid else "INVALID")
    cls = "ok" if rep.valid and rep.usable else "bad"
    checks = [c for c in rep.checks if isinstance(c, dict)]
    failed = [c for c in checks if c.get("ok") is not True]
    out.append(f'<p><span class="badge {cls}" id="verdict-label">{label}</span> '
               f"{len(checks) - len(failed)} check(s) passed, {len(failed)} did not</p>")
    if rep.reasons:
        out.append("<ul id='verify-reasons'>"
                   + "".join(f"<li class='bad'>{esc(x)}</li>" for x in rep.reasons) + "</ul>")
    if rep.key_source:
        out.append(f"<p class='muted'>signature: {esc(rep.key_source)}</p>")
    for note in rep.notes:
        if not str(note).startswith("signature checked with"):
            out.append(f"<p class='muted'>note: {esc(note)}</p>")

    def table(rows: list[dict[str, Any]], ident: str) -> str:
        body = "".join(
            f"<tr class='{'ok' if c.get('ok') is True else 'bad'}'><td>{'✓' if c.get('ok') is True else '✗'}</td>"
            f"<td>{esc(c.get('area') or '')}</td><td>{esc(c.get('phase') or '')}</td><td>{esc(c.get('id'))}</td>"
            f"<td>{esc(cut(json.dumps(c.get('expected'), default=str), 300)[0])}</td>"
            f"<td>{esc(cut(json.dumps(c.get('observed'), default=str), 300)[0])}</td>"
            f"<td>{esc(c.get('detail') or '')}</td></tr>"
            for c in rows)
        return (f"<table id='{ident}'><tr><th></th><th>area</th><th>group</th><th>check</th><th>expected</th>"
                f"<th>observed</th><th>detail</th></tr>{body}</table>")

    if failed:
        out.append("<div class='label'>checks that did not pass</div>" + table(failed, "checks-failed"))
    by_area = Counter(str(c.get("area") or "") for c in checks if c.get("ok") is True)
    summary = ", ".join(f"{esc(a)} {n}" for a, n in sorted(by_area.items()))
    out.append(f"<details><summary>every check ({len(checks)}: {summary})</summary>{table(checks, 'checks')}</details>")
    return out + ["</section>"]


def _section_steps(d: RunData, payload: dict[str, Any]) -> list[str]:
    steps, turns = payload["steps"], payload["turns"]
    usage: Counter[str] = Counter()
    for t in turns:
        for k, v in t["usage"].items():
            usage[k] += v
    usage_text = " · ".join(f"{esc(k)} {round(v, 6):g}" for k, v in sorted(usage.items()))
    n_images = sum(1 for s in steps if s["image"])
    failed = sum(1 for s in steps if not s["ok"] or s["refused"] or s["timed_out"] or (s["exit"] not in (None, 0)))
    out = ['<section id="trajectory"><h2>Trajectory</h2>',
           f"<p id='steps-summary'>{len(steps)} step(s), {failed} failed or refused, {n_images} screenshot(s); "
           f"{len(turns)} model turn(s){' (' + usage_text + ')' if usage_text else ''}. "
           f"Values longer than {_size(payload['shown'])} are cut, with a link to the whole value.</p>"]
    for note in d.notes:
        out.append(f"<p class='warn'>{esc(note)}</p>")
    out.append('<div class="controls"><label>tool <select id="steps-tool"><option value="">all</option>'
               '</select></label><label><input type="checkbox" id="steps-failed"> failed only</label>'
               '<button id="steps-prev" type="button">◀ previous</button><span id="steps-page"></span>'
               '<button id="steps-next" type="button">next ▶</button>'
               '<button id="steps-all" type="button">show all</button></div>'
               '<noscript><p class="bad">the steps are shown by this page\'s script: enable JavaScript, or read '
               f"{esc(layout.TRAJECTORY)}</p></noscript><div id='steps-list'></div></section>")
    return out


def _section_deliverables(d: RunData, links: _Links) -> list[str]:
    out = ['<section id="deliverables"><h2>Deliverables</h2>']
    m = d.deliverables
    if m is None:
        return out + [f"<p class='muted'>no {esc(layout.DELIVERABLES)}: the run ended before its deliverables were "
                      "copied</p></section>"]
    files = [f for f in m.get("files") or [] if isinstance(f, dict)]
    skipped = [s for s in m.get("skipped") or [] if isinstance(s, dict)]
    out.append(f"<p>{len(files)} file(s), {_size(m.get('total_bytes'))} copied; "
               f"{len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} "
               f"skipped{'; stopped: ' + esc(m.get('stopped')) if m.get('stopped') else ''}.</p>")
    if files:
        out.append("<table id='deliverable-files'><tr><th>path</th><th>size</th><th>sha256</th><th>mode</th></tr>")
        for f in files[:5000]:
            href = links.href(f"{layout.DELIVERABLES_DIR}/{f.get('stored_as') or f.get('path')}")
            name = esc(f.get("path"))
            cell = f"<a href='{html.escape(href, quote=True)}'>{name}</a>" if href else name
            mode = f.get("mode")
            out.append(f"<tr><td>{cell}</td><td class='num'>{_size(f.get('size'))}</td>"
                       f"<td><code>{esc(str(f.get('sha256') or '')[:16])}</code></td>"
                       f"<td>{esc(oct(mode) if isinstance(mode, int) else '')}</td></tr>")
        out.append("</table>")
        if len(files) > 5000:
            out.append(f"<p class='muted'>the first 5000 of {len(files)} files are listed; all are in "
                       f"{esc(layout.DELIVERABLES)}</p>")
    if skipped:
        out.append("<div class='label'>skipped, and why</div><table id='deliverable-skipped'><tr><th>path"
                   "</th><th>kind</th><th>size</th><th>reason</th><th>limit</th></tr>")
        for s in skipped[:5000]:
            out.append(f"<tr><td>{esc(s.get('path'))}</td><td>{esc(s.get('kind') or '')}</td>"
                       f"<td class='num'>{_size(s.get('size'))}</td><td>{esc(s.get('reason'))}</td>"
                       f"<td>{esc(s.get('limit') or '')}</td></tr>")
        out.append("</table>")
    limits = m.get("limits")
    if isinstance(limits, dict):
        out.append("<p class='muted'>limits: " + esc(", ".join(f"{k} {v}" for k, v in limits.items())) + "</p>")
    return out + ["</section>"]


def _section_task_log(d: RunData, links: _Links) -> list[str]:
    out = ['<section id="task-log"><h2>Grader\'s task.log</h2>']
    text, size = _read_text(d.run_dir / layout.TASK_LOG, TASK_LOG_SHOWN)
    if text is None:
        return out + ["<p class='muted'>the task process printed nothing (no task.log)</p></section>"]
    shown, _, was_cut = cut(text, TASK_LOG_SHOWN)
    href = links.href(layout.TASK_LOG)
    if was_cut or size > TASK_LOG_SHOWN:
        out.append(f"<div class='label'>the first {_size(TASK_LOG_SHOWN)} of {_size(size)} · "
                   f"<a href='{html.escape(href or '', quote=True)}'>whole file</a></div>")
    return out + [f"<pre id='task-log-text'>{esc(shown)}</pre></section>"]


SCREEN_MOMENTS = (("after_start", "after start()"), ("end_of_turn", "at the end of the agent's turn (before the kill)"))


def _section_screens(d: RunData, links: _Links) -> list[str]:
    """A desktop run's screen after start() and at the end of the agent's turn
    (``evidence/screens.json``, the PNGs beside it, signed with the run)."""
    screens = _read_json(d.run_dir / layout.evidence_path(layout.Evidence.SCREENS))
    if not isinstance(screens, dict):
        return []
    out = ['<section id="screens"><h2>Screen</h2><div class="screens">']
    for moment, label in SCREEN_MOMENTS:
        shot = screens.get(moment)
        out.append(f'<figure id="screen-{esc(moment.replace("_", "-"))}"><figcaption>{esc(label)}</figcaption>')
        if not isinstance(shot, dict):
            out.append("<p class='muted'>not recorded (the run ended before)</p></figure>")
            continue
        src = links.image(shot.get("file"), under=layout.EVIDENCE_DIR)
        if src is None:
            out.append(f"<p class='bad'>no picture: {esc(shot.get('error') or 'its file is missing')}</p></figure>")
            continue
        out.append(f"<img class='screenshot' alt='the screen {esc(label)}' src='{html.escape(src, quote=True)}'>"
                   f"<p class='muted'>{esc(shot.get('width'))}x{esc(shot.get('height'))}, {esc(shot.get('at'))}, "
                   f"sha256 <code>{esc(str(shot.get('sha256') or '')[:16])}</code></p></figure>")
    return out + ["</div></section>"]


def _section_files(links: _Links) -> list[str]:
    names = (layout.RESULT, layout.PLAN, layout.TRAJECTORY, layout.EVENTS, layout.DELIVERABLES, layout.MANIFEST,
             layout.ATTESTATION, layout.EVIDENCE_DIR, layout.AGENT_DIR)
    present = [n for n in names if (links.run_dir / n).exists()]
    items = "".join(f"<li><a href='{html.escape(links.href(n) or '', quote=True)}'>{esc(n)}</a></li>" for n in present)
    return ['<section id="files"><h2>Files of the run folder</h2>',
            f"<p class='muted'>{esc(links.run_dir)}</p><ul>{items}</ul></section>"]


def render_run(data: RunData, page: Path, *, back: tuple[str, str] | None = None) -> str:
    links = _Links(data.run_dir, page.parent)
    payload = build_steps(data, links)
    r = data.result
    run_id = r.get("run_id") or data.plan.get("run_id") or data.run_dir.name
    title = f"ale run {run_id}"
    reason = one_line_reason(r)
    out = _head(title)
    out.append(f"<header><h1>{esc(run_id)}</h1><div class='meta'>{_badge(r.get('status'))} "
               f"score {esc(r.get('score') if r.get('score') is not None else '–')} · "
               f"{esc(r.get('task_id') or data.plan.get('task_dir') or '?')} variant "
               f"{esc(r.get('variant', data.plan.get('variant')))} · agent {esc(r.get('agent') or '?')}"
               + (f" · <a href='{html.escape(back[0], quote=True)}'>{esc(back[1])}</a>" if back else "") + "</div>"
               + (f"<div class='reason' id='header-reason'>{esc(reason)}</div>" if reason else "") + "</header>")
    out.append("<nav>" + "".join(f"<a href='#{k}'>{v}</a>" for k, v in (
        ("task", "task & prompt"), ("timeline", "timeline"), ("scores", "scores"),
        *((("screens", "screen"),) if (data.run_dir / layout.evidence_path(layout.Evidence.SCREENS)).is_file() else ()),
        ("verdict", "evidence"),
        ("trajectory", "trajectory"), ("deliverables", "deliverables"), ("task-log", layout.TASK_LOG),
        ("files", "files"))) + "</nav><main>")
    out += _section_task(data) + _section_timeline(data) + _section_scores(data) + _section_screens(data, links)
    out += _section_verdict(data) + _section_steps(data, payload) + _section_deliverables(data, links) \
        + _section_task_log(data, links)
    out += _section_files(links)
    out.append(f"<p class='muted'>written by ale {esc(__version__)} (ale view) at "
               f"{esc(datetime.now().astimezone().isoformat(timespec='seconds'))}</p></main>")
    out.append(f'<script type="application/json" id="ale-data">{json_for_script(payload)}</script>')
    out.append(f"<script>{_STEPS_JS}</script></body></html>")
    return "\n".join(out)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", errors="replace")
    tmp.replace(path)
    return path


def default_run_page(run_dir: Path) -> Path:
    run_dir = Path(run_dir).resolve()
    return run_dir.with_name(run_dir.name + VIEW_SUFFIX)


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def write_run_page(run_dir: Path, out: Path | None = None, *, verify: bool = True,
                   back: tuple[str, str] | None = None) -> Path:
    """Write a run's page (default ``<run_dir>.view.html``); never inside the run folder."""
    run_dir = Path(run_dir)
    page = Path(out) if out is not None else default_run_page(run_dir)
    if _inside(page, run_dir):
        raise ValueError(f"{page} is inside the run folder {run_dir}, whose files are signed: write the page elsewhere")
    return _write(page, render_run(load_run(run_dir, verify=verify), page, back=back))


# -- experiments ---------------------------------------------------------------------------
def is_run_dir(path: Path) -> bool:
    return (Path(path) / layout.PLAN).is_file() or (Path(path) / layout.RESULT).is_file()


def is_experiment_dir(path: Path) -> bool:
    p = Path(path)
    return not is_run_dir(p) and ((p / layout.RUNS_DIR).is_dir() or (p / layout.EXPERIMENT_RECORD).is_file())


@dataclass
class RunRow:
    run_id: str
    path: Path
    task: str
    variant: Any
    agent: str
    repeat: Any
    attempt: Any
    status: str
    score: float | None
    reason: str | None
    seconds: float | None
    steps: int | None


def experiment_runs(exp_dir: Path) -> list[RunRow]:
    from ale.result import RunResult
    from ale.runs.store import read_units, runs_root, unit_of

    units = read_units(exp_dir)
    rows: list[RunRow] = []
    root = runs_root(exp_dir)
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if root.is_dir() else []:
        raw = _read_json(run_dir / layout.RESULT)
        result = raw if isinstance(raw, dict) else {}
        try:
            unit = unit_of(RunResult.model_validate(result), units)
            task, variant, agent, repeat = unit.task, unit.variant, unit.agent, unit.repeat  # type: Any, Any, Any, Any
        except ValueError:
            plan = _read_json(run_dir / layout.PLAN)
            plan = plan if isinstance(plan, dict) else {}
            spec: dict[str, Any] = plan["agent"] if isinstance(plan.get("agent"), dict) else {}
            task, variant = Path(str(plan.get("task_dir") or "?")).name, plan.get("variant")
            agent, repeat = spec.get("label") or spec.get("name") or "?", None
        a, b = _time(result.get("started_at")), _time(result.get("ended_at"))
        steps = None
        traj = run_dir / layout.TRAJECTORY_LOG
        if traj.is_file():
            with open(traj, "rb") as f:
                steps = sum(1 for line in f if line.strip())
        rows.append(RunRow(
            run_id=str(result.get("run_id") or run_dir.name), path=run_dir, task=str(task), variant=variant,
            agent=str(agent),
            repeat=repeat, attempt=result.get("attempt"), status=str(result.get("status") or "no result"),
            score=result.get("score") if isinstance(result.get("score"), int | float) else None,
            reason=one_line_reason(result), seconds=(b - a).total_seconds() if a and b else None, steps=steps))
    return rows


_EXP_JS = r"""
(function(){
  "use strict";
  var sels = ["agent", "task", "status"].map(function(k){ return document.getElementById("filter-" + k); });
  var text = document.getElementById("filter-text");
  var rows = Array.prototype.slice.call(document.querySelectorAll("#runs tbody tr"));
  var shown = document.getElementById("shown");
  function apply(){
    var q = text.value.toLowerCase(), n = 0;
    rows.forEach(function(r){
      var ok = sels.every(function(s){ return s.value === "" || r.getAttribute("data-" + s.id.slice(7)) === s.value; });
      if (ok && q) { ok = r.textContent.toLowerCase().indexOf(q) >= 0; }
      r.style.display = ok ? "" : "none"; if (ok) { n++; }
    });
    shown.textContent = n + " of " + rows.length + " run(s) shown";
  }
  sels.forEach(function(s){ s.addEventListener("change", apply); });
  text.addEventListener("input", apply);
  apply();
  document.body.setAttribute("data-ready", "1");
})();
"""


def render_experiment(exp_dir: Path, rows: list[RunRow], pages: dict[str, str], page: Path) -> str:
    exp_dir = Path(exp_dir)
    record = _read_json(exp_dir / layout.EXPERIMENT_RECORD)
    name = (record or {}).get("name") if isinstance(record, dict) else None
    name = name or exp_dir.name
    out = _head(f"ale experiment {name}")
    statuses = Counter(r.status for r in rows)
    report = exp_dir / layout.REPORT_HTML
    rel_report = os.path.relpath(report.resolve(), page.parent.resolve()).replace(os.sep, "/")
    out.append(f"<header><h1>experiment {esc(name)}</h1><div class='meta'>{len(rows)} run(s) · "
               + " · ".join(f"{esc(s)} {n}" for s, n in sorted(statuses.items()))
               + (f" · <a href='{html.escape(quote(rel_report), quote=True)}'>report</a>" if report.is_file() else "")
               + f"</div></header><main><p class='muted'>{esc(exp_dir.resolve())}</p>")

    def select(key: str, values: list[str]) -> str:
        opts = "".join(f"<option value='{esc(v)}'>{esc(v)}</option>" for v in sorted(set(values)))
        return f"<label>{key} <select id='filter-{key}'><option value=''>all</option>{opts}</select></label>"

    out.append("<div class='controls'>" + select("agent", [r.agent for r in rows])
               + select("task", [r.task for r in rows])
               + select("status", [r.status for r in rows])
               + "<label>search <input id='filter-text' type='search'></label><span id='shown'></span></div>")
    agents: dict[str, list[RunRow]] = {}
    for r in rows:
        agents.setdefault(r.agent, []).append(r)
    out.append("<table id='agents'><tr><th>agent</th><th>runs</th><th>scored</th>"
               "<th>mean score (scored runs)</th></tr>")
    for agent, rs in sorted(agents.items()):
        scores = [r.score for r in rs if r.status == RunStatus.SCORED and r.score is not None]
        mean = f"{sum(scores) / len(scores):.3f}" if scores else "–"
        out.append(f"<tr><td>{esc(agent)}</td><td class='num'>{len(rs)}</td><td class='num'>{len(scores)}</td>"
                   f"<td class='num'>{mean}</td></tr>")
    out.append("</table>")
    reasons = Counter(r.reason for r in rows if r.reason)
    if reasons:
        out.append("<details open><summary>why runs did not score</summary><table id='reasons'><tr><th>runs</th>"
                   "<th>reason</th></tr>"
                   + "".join(f"<tr><td class='num'>{n}</td><td>{esc(k)}</td></tr>" for k, n in reasons.most_common())
                   + "</table></details>")
    out.append("<table id='runs'><thead><tr><th>run</th><th>task</th><th>variant</th><th>agent</th><th>repeat</th>"
               "<th>attempt</th><th>status</th><th>score</th><th>steps</th><th>seconds</th><th>why not scored</th>"
               "</tr></thead><tbody>")
    for r in rows:
        href = pages.get(r.run_id)
        link = f"<a href='{html.escape(href, quote=True)}'>{esc(r.run_id)}</a>" if href else esc(r.run_id)
        cls = "ok" if r.status == RunStatus.SCORED else "bad"
        out.append(
            f"<tr data-agent='{esc(r.agent)}' data-task='{esc(r.task)}' data-status='{esc(r.status)}'><td>{link}</td>"
            f"<td>{esc(r.task)}</td><td class='num'>{esc(r.variant)}</td><td>{esc(r.agent)}</td>"
            f"<td class='num'>{esc(r.repeat)}</td><td class='num'>{esc(r.attempt)}</td>"
            f"<td class='{cls}'>{esc(r.status)}</td><td class='num'>{esc('–' if r.score is None else f'{r.score:.3f}')}"
            f"</td><td class='num'>{esc(r.steps)}</td>"
            f"<td class='num'>{esc('–' if r.seconds is None else f'{r.seconds:.1f}')}</td>"
            f"<td>{esc(r.reason or '')}</td></tr>")
    out.append("</tbody></table>")
    out.append(f"<p class='muted'>written by ale {esc(__version__)} (ale view) at "
               f"{esc(datetime.now().astimezone().isoformat(timespec='seconds'))}</p></main>")
    out.append(f"<script>{_EXP_JS}</script></body></html>")
    return "\n".join(out)


def write_experiment_pages(exp_dir: Path, out: Path | None = None, *, verify: bool = True,
                           progress: Any = None) -> Path:
    """Write ``<out>/index.html`` (default ``<exp_dir>/views/``) and one page per run beside it."""
    exp_dir = Path(exp_dir)
    folder = Path(out) if out is not None else exp_dir / VIEWS_DIR
    if folder.suffix == ".html":
        index, folder = folder, folder.parent
    else:
        index = folder / EXPERIMENT_PAGE
    rows = experiment_runs(exp_dir)
    pages: dict[str, str] = {}
    back = os.path.relpath(index.resolve(), folder.resolve()).replace(os.sep, "/")
    for n, row in enumerate(rows, 1):
        page = folder / f"{row.path.name}.html"
        write_run_page(row.path, page, verify=verify, back=(back, "experiment"))
        pages[row.run_id] = quote(page.name)
        if progress is not None:
            progress(n, len(rows), row.run_id)
    return _write(index, render_experiment(exp_dir, rows, pages, index))


def view(target: Path, out: Path | None = None, *, verify: bool = True, progress: Any = None) -> Path:
    """The page for a run folder or an experiment's output folder; returns its path."""
    target = Path(target)
    if is_run_dir(target):
        return write_run_page(target, out, verify=verify)
    if is_experiment_dir(target):
        return write_experiment_pages(target, out, verify=verify, progress=progress)
    raise ValueError(f"{target} is neither a run folder (no {layout.PLAN} or {layout.RESULT}) nor an "
                     f"experiment's output folder (no {layout.RUNS_DIR}/ or {layout.EXPERIMENT_RECORD})")


def timed_view(target: Path, out: Path | None = None, **kw: Any) -> tuple[Path, float]:
    t0 = time.perf_counter()
    page = view(target, out, **kw)
    return page, time.perf_counter() - t0
