"""The model side of the trajectory, from the gateway's record, joined with the
bridge's tool steps: ``RUN/agent/gateway/turns.json``.

One turn per model request: its record number, model, the tools offered, the
decision, and from the response the text, the reasoning (Anthropic ``thinking``,
OpenAI ``reasoning``/``reasoning_content``, Gemini ``thought`` parts) and the tool
calls (name, arguments, id). The same for every harness, since every harness's
model requests pass through the gateway. Each tool call is joined to its step
(``step``: the step's index):

- a native harness (the record's policy has ``client_tools``): the step derived
  from that very call by ``steps.derive_steps``, the trajectory's steps then;
- otherwise a call of a bridge tool joins the next trajectory step of that tool in
  ``trajectory.jsonl``; a call to anything else has no step (a harness-internal
  tool, or one the harness ran itself).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ale import layout
from ale.agents.gateway.parse import PARSE_ERRORS, parse_response, response_bytes
from ale.agents.gateway.record import GATEWAY_DIR, read_body, read_records
from ale.agents.gateway.steps import derive_steps, is_native
from ale.agents.gateway.tools import BRIDGE_NAME_FORMS

TURNS = layout.Gateway.TURNS


def _bridge_tool(name: str | None) -> str | None:
    for form in BRIDGE_NAME_FORMS:
        prefix = form.replace("{t}", "")
        if name and name.startswith(prefix) and prefix:
            return name[len(prefix):]
    return name


def build_turns(run_dir: Path) -> list[dict[str, Any]]:
    run_dir = Path(run_dir)
    records, _ = read_records(run_dir)
    steps: list[dict[str, Any]] = []
    with contextlib.suppress(OSError, ValueError):
        steps = [json.loads(line) for line in (run_dir / layout.TRAJECTORY_LOG).read_text().splitlines()
                 if line.strip()]
    # A native harness's steps are the gateway's own (steps.py): each call joins the step derived from it.
    joins: dict[tuple[int, int], int] | None = derive_steps(run_dir, records)["joins"] if is_native(records) else None
    used: set[int] = set()
    requests = {r.get("seq"): r for r in records if r.get("type") == "request"}
    turns = []
    for resp in records:
        if resp.get("type") != "response" or not resp.get("model_call"):
            continue
        req = requests.get(resp.get("request")) or {}
        try:
            body, _ = read_body(run_dir, req.get("body") or {})
        except PARSE_ERRORS:
            body = None
        parsed = parse_response(str(req.get("api")), response_bytes(run_dir, resp.get("body") or {}),
                                bool(resp.get("streamed")))
        for pos, call in enumerate(parsed["tool_calls"]):
            call.pop("kind", None)
            call.pop("namespace", None)
            if joins is not None:
                seq = req.get("seq")
                if isinstance(seq, int) and (seq, pos) in joins:
                    call["step"] = joins[(seq, pos)]
                continue
            tool = _bridge_tool(call.get("name"))
            step = next((s for s in steps if s.get("tool") == tool and s.get("index") not in used), None)
            if step is not None:
                used.add(step["index"])
                call["step"] = step["index"]
        turns.append({
            "request": req.get("seq"), "time": req.get("time"), "api": req.get("api"),
            "model": req.get("model") or resp.get("model"), "messages": _messages(body),
            "tools_offered": req.get("tools"), "decision": req.get("decision"), "status": resp.get("status"),
            "usage": resp.get("usage") or {}, **parsed,
        })
    return turns


def _messages(body: Any) -> int | None:
    if not isinstance(body, dict):
        return None
    items = body.get("messages") or body.get("contents") or body.get("input") or []
    return len(items) if isinstance(items, list) else 1  # Responses: ``input`` may be one string


def write_turns(run_dir: Path) -> Path:
    path = Path(run_dir) / GATEWAY_DIR / TURNS
    path.write_text(json.dumps({"turns": build_turns(run_dir)}, indent=1))
    return path
