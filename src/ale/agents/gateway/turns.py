"""The model side of the trajectory, from the gateway's record, joined with the
bridge's tool steps: ``RUN/agent/gateway/turns.json``.

One turn per model request: its record number, model, the tools offered, the
decision, and from the response the text, the reasoning (Anthropic ``thinking``,
OpenAI ``reasoning``/``reasoning_content``, Gemini ``thought`` parts) and the tool
calls (name, arguments). Each tool call of a bridge tool is joined to the next
trajectory step of that tool (``step``: its index in ``trajectory.jsonl``); a call
to anything else has no step (a harness-internal tool, or one the harness ran
itself). The same for every harness, since every harness's model requests pass
through the gateway.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ale import layout
from ale.agents.gateway.record import GATEWAY_DIR, read_body, read_records
from ale.agents.gateway.tools import ANTHROPIC, BRIDGE_NAME_FORMS, GEMINI, OPENAI
from ale.agents.gateway.usage import sse_events

TURNS = layout.Gateway.TURNS


def _raw(run_dir: Path, ref: dict[str, Any]) -> bytes:
    if not ref or not ref.get("bytes"):
        return b""
    if "json" in ref:
        return json.dumps(ref["json"]).encode()
    try:
        return (Path(run_dir) / str(ref.get("file"))).read_bytes()
    except OSError:
        return b""


def parse_response(api: str, data: bytes, streamed: bool) -> dict[str, Any]:
    """``{"text", "reasoning", "tool_calls": [{"name", "arguments"}]}`` of one response."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    docs = sse_events(data) if streamed else ([json.loads(data)] if data.strip().startswith(b"{") else [])
    partial: dict[int, dict[str, Any]] = {}
    for d in docs:
        if not isinstance(d, dict):
            continue
        if api == ANTHROPIC:
            for b in d.get("content") or []:  # a whole message
                _anthropic_block(b, text, reasoning, calls)
            if d.get("type") == "content_block_start":
                partial[d.get("index", 0)] = {**d.get("content_block", {}), "_json": ""}
            elif d.get("type") == "content_block_delta":
                blk, delta = partial.setdefault(d.get("index", 0), {"_json": ""}), d.get("delta") or {}
                blk["_json"] += delta.get("partial_json", "")
                blk["text"] = blk.get("text", "") + delta.get("text", "")
                blk["thinking"] = blk.get("thinking", "") + delta.get("thinking", "")
        elif api == OPENAI:
            r: dict[str, Any] = d["response"] if isinstance(d.get("response"), dict) else d
            for item in r.get("output") or [] if d.get("type") in (None, "response.completed") else []:
                if item.get("type") == "function_call":
                    calls.append({"name": item.get("name"), "arguments": item.get("arguments")})
                elif item.get("type") == "message":
                    text += [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
                elif item.get("type") == "reasoning":
                    reasoning += [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
            for ch in d.get("choices") or []:
                m = ch.get("message") or ch.get("delta") or {}
                text.append(m.get("content") or "")
                reasoning.append(m.get("reasoning_content") or m.get("reasoning") or "")
                for tc in m.get("tool_calls") or []:
                    f = tc.get("function") or {}
                    slot = partial.setdefault(tc.get("index", len(partial)), {"name": "", "arguments": ""})
                    slot["name"] = f.get("name") or slot["name"]
                    slot["arguments"] += f.get("arguments") or ""
        elif api == GEMINI:
            for cand in (d.get("candidates") or [])[:1]:
                for part in (cand.get("content") or {}).get("parts") or []:
                    if "functionCall" in part:
                        calls.append({"name": part["functionCall"].get("name"), "arguments": part["functionCall"].get("args")})
                    elif part.get("thought"):
                        reasoning.append(part.get("text", ""))
                    else:
                        text.append(part.get("text", ""))
    for _, blk in sorted(partial.items()):
        if api == ANTHROPIC:
            if blk.get("type") == "tool_use":
                blk = {**blk, "input": _loads(blk["_json"]) if blk["_json"] else blk.get("input")}
            _anthropic_block(blk, text, reasoning, calls)
        else:
            calls.append({"name": blk["name"], "arguments": blk["arguments"]})
    return {"text": "".join(text), "reasoning": "".join(reasoning), "tool_calls": calls}


def _loads(s: str) -> Any:
    try:
        return json.loads(s)
    except ValueError:
        return s


def _anthropic_block(b: dict[str, Any], text: list[str], reasoning: list[str], calls: list[dict[str, Any]]) -> None:
    kind = b.get("type")
    if kind == "text":
        text.append(b.get("text", ""))
    elif kind in ("thinking", "redacted_thinking"):
        reasoning.append(b.get("thinking", ""))
    elif kind in ("tool_use", "server_tool_use"):
        calls.append({"name": b.get("name"), "arguments": b.get("input")})


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
        steps = [json.loads(line) for line in (run_dir / layout.TRAJECTORY_LOG).read_text().splitlines() if line.strip()]
    used: set[int] = set()
    requests = {r.get("seq"): r for r in records if r.get("type") == "request"}
    turns = []
    for resp in records:
        if resp.get("type") != "response" or not resp.get("model_call"):
            continue
        req = requests.get(resp.get("request")) or {}
        body, _ = read_body(run_dir, req.get("body") or {})
        parsed = parse_response(str(req.get("api")), _raw(run_dir, resp.get("body") or {}), bool(resp.get("streamed")))
        for call in parsed["tool_calls"]:
            tool = _bridge_tool(call.get("name"))
            step = next((s for s in steps if s.get("tool") == tool and s.get("index") not in used), None)
            if step is not None:
                used.add(step["index"])
                call["step"] = step["index"]
        turns.append({
            "request": req.get("seq"), "time": req.get("time"), "api": req.get("api"), "model": req.get("model") or resp.get("model"),
            "messages": _messages(body),
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
