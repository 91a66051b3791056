"""What a recorded model exchange carries, read defensively.

- ``parse_response(api, data, streamed)``: a model response (JSON, or its SSE
  stream as it was passed through) as ``{"text", "reasoning", "tool_calls"}``;
  each tool call ``{"name", "arguments", "id"?, "kind"?}`` (``id``: Anthropic
  ``tool_use.id``, Responses ``call_id``, Chat Completions ``tool_calls[].id``,
  Gemini ``functionCall.id`` when the model gave one; ``kind``: a Responses item
  other than ``function_call``, e.g. ``custom_tool_call`` for a free-form tool
  such as Codex's ``apply_patch``).
- ``request_results(api, path, body, bad, where)``: the tool results a request's
  conversation carries back to the model, in order.

Request bodies are written by the harness, which runs as the candidate: nothing in
them is trusted to have any shape. A part that is not of the expected shape is
skipped and counted in ``Malformed``; nothing here raises on a body's content.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ale.agents.gateway.tools import ANTHROPIC, GEMINI, OPENAI
from ale.agents.gateway.usage import sse_events

MALFORMED_KEPT = 20  # where the first malformed parts were, kept for the reader
PARSE_ERRORS = (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError)


class Malformed:
    """How many parts were skipped, and where the first ones were."""

    def __init__(self) -> None:
        self.count = 0
        self.where: list[str] = []

    def add(self, where: str) -> None:
        self.count += 1
        if len(self.where) < MALFORMED_KEPT:
            self.where.append(where)


def response_bytes(run_dir: Path, ref: dict[str, Any]) -> bytes:
    """A recorded body's bytes (inline JSON re-encoded; a file read as it is)."""
    if not isinstance(ref, dict) or not ref.get("bytes"):
        return b""
    if "json" in ref:
        return json.dumps(ref["json"]).encode()
    rel = ref.get("file")
    if not isinstance(rel, str) or ".." in Path(rel).parts or rel.startswith("/"):
        return b""
    try:
        return (Path(run_dir) / rel).read_bytes()
    except OSError:
        return b""


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_response(api: str, data: bytes, streamed: bool) -> dict[str, Any]:
    """``{"text", "reasoning", "tool_calls"}`` of one response (see the module doc)."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    docs: list[Any] = []
    if streamed:
        docs = sse_events(data)
    elif data.strip().startswith(b"{"):
        try:
            docs = [json.loads(data)]
        except PARSE_ERRORS:
            docs = []
    partial: dict[Any, dict[str, Any]] = {}
    done_items: list[Any] = []  # Responses: output_item.done, for a stream whose completed event lists no output
    completed = False
    for d in docs:
        if not isinstance(d, dict):
            continue
        if api == ANTHROPIC:
            for b in _l(d.get("content")):  # a whole message
                _anthropic_block(b, text, reasoning, calls)
            if d.get("type") == "content_block_start":
                partial[_index(d.get("index"))] = {**_d(d.get("content_block")), "_json": ""}
            elif d.get("type") == "content_block_delta":
                blk, delta = partial.setdefault(_index(d.get("index")), {"_json": ""}), _d(d.get("delta"))
                blk["_json"] = _s(blk.get("_json")) + _s(delta.get("partial_json"))
                blk["text"] = _s(blk.get("text")) + _s(delta.get("text"))
                blk["thinking"] = _s(blk.get("thinking")) + _s(delta.get("thinking"))
        elif api == OPENAI:
            r = _d(d["response"]) if isinstance(d.get("response"), dict) else d
            if d.get("type") == "response.output_item.done":
                done_items.append(d.get("item"))
            if d.get("type") in (None, "response.completed") and _l(r.get("output")):
                completed = True
                for item in _l(r.get("output")):
                    _responses_item(item, text, reasoning, calls)
            for ch in _l(d.get("choices")):
                ch = _d(ch)
                m = _d(ch.get("message") or ch.get("delta"))
                text.append(_s(m.get("content")))
                reasoning.append(_s(m.get("reasoning_content") or m.get("reasoning")))
                for tc in _l(m.get("tool_calls")):
                    tc = _d(tc)
                    f = _d(tc.get("function"))
                    slot = partial.setdefault(_index(tc.get("index"), len(partial)),
                                              {"name": "", "arguments": "", "id": None})
                    slot["name"] = _s(f.get("name")) or slot["name"]
                    slot["arguments"] += _s(f.get("arguments"))
                    slot["id"] = tc.get("id") if isinstance(tc.get("id"), str) else slot["id"]
        elif api == GEMINI:
            for cand in _l(d.get("candidates"))[:1]:
                for part in _l(_d(_d(cand).get("content")).get("parts")):
                    part = _d(part)
                    if isinstance(part.get("functionCall"), dict):
                        fc = part["functionCall"]
                        call = {"name": fc.get("name"), "arguments": fc.get("args")}
                        if isinstance(fc.get("id"), str):
                            call["id"] = fc["id"]
                        calls.append(call)
                    elif part.get("thought"):
                        reasoning.append(_s(part.get("text")))
                    else:
                        text.append(_s(part.get("text")))
    if api == OPENAI and not completed:
        for item in done_items:
            _responses_item(item, text, reasoning, calls)
    for _, blk in sorted(partial.items()):
        if api == ANTHROPIC:
            if blk.get("type") == "tool_use":
                blk = {**blk, "input": _loads(blk["_json"]) if blk.get("_json") else blk.get("input")}
            _anthropic_block(blk, text, reasoning, calls)
        else:
            call = {"name": blk["name"], "arguments": blk["arguments"]}
            if blk.get("id"):
                call["id"] = blk["id"]
            calls.append(call)
    return {"text": "".join(text), "reasoning": "".join(reasoning), "tool_calls": calls}


def _index(value: Any, default: Any = 0) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _loads(s: str) -> Any:
    try:
        return json.loads(s)
    except PARSE_ERRORS:
        return s


def _anthropic_block(b: Any, text: list[str], reasoning: list[str], calls: list[dict[str, Any]]) -> None:
    if not isinstance(b, dict):
        return
    kind = b.get("type")
    if kind == "text":
        text.append(_s(b.get("text")))
    elif kind in ("thinking", "redacted_thinking"):
        reasoning.append(_s(b.get("thinking")))
    elif kind in ("tool_use", "server_tool_use"):
        call = {"name": b.get("name"), "arguments": b.get("input")}
        if isinstance(b.get("id"), str):
            call["id"] = b["id"]
        if kind != "tool_use":
            call["kind"] = kind
        calls.append(call)


def _responses_item(item: Any, text: list[str], reasoning: list[str], calls: list[dict[str, Any]]) -> None:
    if not isinstance(item, dict):
        return
    kind = item.get("type")
    if kind in ("function_call", "custom_tool_call", "local_shell_call"):
        name = item.get("name") if kind != "local_shell_call" else "local_shell"
        call: dict[str, Any] = {"name": name, "arguments": item.get("input") if kind == "custom_tool_call" else
                                item.get("action") if kind == "local_shell_call" else item.get("arguments")}
        cid = item.get("call_id") or item.get("id")
        if isinstance(cid, str):
            call["id"] = cid
        if kind != "function_call":
            call["kind"] = kind
        if isinstance(item.get("namespace"), str):
            call["namespace"] = item["namespace"]
        calls.append(call)
    elif kind == "message":
        text += [_s(c.get("text")) for c in _l(item.get("content")) if isinstance(c, dict)]
    elif kind == "reasoning":
        reasoning += [_s(s.get("text")) for s in _l(item.get("summary")) if isinstance(s, dict)]


# -- the results a request carries back ---------------------------------------------------
def call_key(api: str, call: dict[str, Any]) -> str | None:
    """What a call's result is found by: its id, or (Gemini) its name."""
    if api == GEMINI:
        name = call.get("name")
        return f"name:{name}" if isinstance(name, str) else None
    cid = call.get("id")
    return f"id:{cid}" if isinstance(cid, str) and cid else None


def _text(value: Any) -> str | None:
    """A result's content as text: a string, or the text parts of a list of parts
    (others, such as images, named by their type); None when it is neither."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        out: list[str] = []
        for part in value:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                t = part.get("text")
                out.append(t if isinstance(t, str) else f"[{part.get('type')!s} part]")
            else:
                return None
        return "\n".join(out)
    return None


def _items(value: Any, bad: Malformed, where: str) -> list[Any]:
    if value is None or isinstance(value, str):  # a Responses input may be one string
        return []
    if not isinstance(value, list):
        bad.add(f"{where}: not a list")
        return []
    return value


def request_results(api: str, path: str, body: Any, bad: Malformed, where: str) -> list[tuple[str, str, bool]]:
    """The tool results a request's conversation carries, in order: (key, text, is_error);
    keys as ``call_key`` makes them."""
    out: list[tuple[str, str, bool]] = []
    if not isinstance(body, dict):
        if body is not None:
            bad.add(f"{where}: the body is not a JSON object")
        return out
    if api == ANTHROPIC:
        for m, msg in enumerate(_items(body.get("messages"), bad, f"{where}.messages")):
            for b, blk in enumerate(_l(_d(msg).get("content"))):
                if isinstance(blk, dict) and blk.get("type") == "tool_result":
                    tid, text = blk.get("tool_use_id"), _text(blk.get("content", ""))
                    if not isinstance(tid, str) or text is None:
                        bad.add(f"{where}.messages[{m}].content[{b}]: a tool_result without a tool_use_id or "
                                "readable content")
                        continue
                    out.append((f"id:{tid}", text, blk.get("is_error") is True))
    elif api == OPENAI and path.endswith("/responses"):
        for i, item in enumerate(_items(body.get("input"), bad, f"{where}.input")):
            kind = _d(item).get("type")
            if kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
                cid = item.get("call_id") or (item.get("id") if kind == "local_shell_call_output" else None)
                text = _text(item.get("output", ""))
                if not isinstance(cid, str) or text is None:
                    bad.add(f"{where}.input[{i}]: a {kind} without a call_id or readable output")
                    continue
                out.append((f"id:{cid}", text, False))
    elif api == OPENAI:
        for m, msg in enumerate(_items(body.get("messages"), bad, f"{where}.messages")):
            if _d(msg).get("role") == "tool":
                cid, text = msg.get("tool_call_id"), _text(msg.get("content", ""))
                if not isinstance(cid, str) or text is None:
                    bad.add(f"{where}.messages[{m}]: a tool message without a tool_call_id or readable content")
                    continue
                out.append((f"id:{cid}", text, False))
    elif api == GEMINI:
        for c, content in enumerate(_items(body.get("contents"), bad, f"{where}.contents")):
            for p, part in enumerate(_l(_d(content).get("parts"))):
                if not isinstance(part, dict) or "functionResponse" not in part:
                    continue
                fr = part["functionResponse"]
                name = fr.get("name") if isinstance(fr, dict) else None
                if not isinstance(name, str):
                    bad.add(f"{where}.contents[{c}].parts[{p}]: a functionResponse without a name")
                    continue
                resp = fr.get("response")
                is_error = isinstance(resp, dict) and "error" in resp and "output" not in resp
                if isinstance(resp, dict) and set(resp) == {"output"} and isinstance(resp["output"], str):
                    text = resp["output"]
                else:
                    try:
                        text = json.dumps(resp, ensure_ascii=False)
                    except PARSE_ERRORS:
                        bad.add(f"{where}.contents[{c}].parts[{p}]: a functionResponse that is not JSON")
                        continue
                out.append((f"name:{name}", text, is_error))
    return out
