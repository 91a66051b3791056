"""Token usage and cost from a model's responses, the same way for every harness.

``usage_of(api, body, streamed)`` reads a response body (JSON, or the SSE stream
as it was passed through) and returns ``{"input_tokens", "output_tokens",
"total_tokens", "cached_input_tokens"?, "model"?}``; ``cost(usage, prices)``
prices it with a table from the configuration: ``{model: {"input_per_mtok",
"output_per_mtok", "cached_input_per_mtok"?}}`` in US dollars per million tokens
(a model missing from the table has no cost, never a guessed one). The table may
also come versioned, ``{"version": "...", "models": {model: {...}}}``
(``price_table``); the version is recorded with the run's cost.

``add_billing`` keeps the per-model sums: requests, input, output and cached input
tokens, and cost (``cost_usd`` only for priced models), one function for the
gateway as it runs and for ``record.derive`` re-reading the recorded responses.
"""

from __future__ import annotations

import json
from typing import Any

from ale.agents.gateway.tools import ANTHROPIC, GEMINI, OPENAI


def sse_events(data: bytes) -> list[Any]:
    """The JSON payloads of an SSE stream's ``data:`` lines (``[DONE]`` and non-JSON skipped)."""
    out: list[Any] = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        payload = b"\n".join(line[5:].lstrip() for line in block.split(b"\n") if line.startswith(b"data:"))
        if not payload or payload == b"[DONE]":
            continue
        try:
            out.append(json.loads(payload))
        except ValueError:
            continue
    return out


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def usage_of(api: str, body: bytes, streamed: bool) -> dict[str, Any]:
    if streamed:
        docs = sse_events(body)
    else:
        try:
            docs = [json.loads(body)] if body else []
        except ValueError:
            docs = []
    u = {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0}
    model: str | None = None
    for d in docs:
        if not isinstance(d, dict):
            continue
        if api == OPENAI:
            r: dict[str, Any] = d["response"] if isinstance(d.get("response"), dict) else d  # Responses events wrap it
            m = r.get("model")
            model = m if isinstance(m, str) else model
            x = r.get("usage")
            if isinstance(x, dict):
                u["input_tokens"] = _int(x.get("prompt_tokens")) or _int(x.get("input_tokens"))
                u["output_tokens"] = _int(x.get("completion_tokens")) or _int(x.get("output_tokens"))
                det = x.get("prompt_tokens_details") or x.get("input_tokens_details") or {}
                u["cached_input_tokens"] = _int(det.get("cached_tokens")) if isinstance(det, dict) else 0
        elif api == ANTHROPIC:
            msg: dict[str, Any] = d["message"] if isinstance(d.get("message"), dict) else d  # message_start wraps it
            m = msg.get("model")
            model = m if isinstance(m, str) else model
            x = msg.get("usage") if isinstance(msg.get("usage"), dict) else d.get("usage")
            if isinstance(x, dict):
                # message_start carries the input, message_delta the (cumulative) output.
                u["input_tokens"] = max(u["input_tokens"],
                                        _int(x.get("input_tokens")) + _int(x.get("cache_creation_input_tokens"))
                                        + _int(x.get("cache_read_input_tokens")))
                u["cached_input_tokens"] = max(u["cached_input_tokens"], _int(x.get("cache_read_input_tokens")))
                u["output_tokens"] = max(u["output_tokens"], _int(x.get("output_tokens")))
        elif api == GEMINI:
            m = d.get("modelVersion")
            model = m if isinstance(m, str) else model
            x = d.get("usageMetadata")
            if isinstance(x, dict):  # every chunk repeats the running totals
                u["input_tokens"] = _int(x.get("promptTokenCount"))
                u["output_tokens"] = _int(x.get("candidatesTokenCount")) + _int(x.get("thoughtsTokenCount"))
                u["cached_input_tokens"] = _int(x.get("cachedContentTokenCount"))
    u["total_tokens"] = u["input_tokens"] + u["output_tokens"]
    out: dict[str, Any] = {k: v for k, v in u.items() if v or k != "cached_input_tokens"}
    if model:
        out["model"] = model
    return out


def cost(usage: dict[str, Any], model: str | None, prices: dict[str, Any]) -> float | None:
    """US dollars for one response, or None when the model has no price."""
    p = prices.get(model or "") if model else None
    if not isinstance(p, dict):
        return None
    cached = _int(usage.get("cached_input_tokens"))
    fresh = _int(usage.get("input_tokens")) - cached
    total = fresh * float(p.get("input_per_mtok", 0)) \
        + _int(usage.get("output_tokens")) * float(p.get("output_per_mtok", 0))
    total += cached * float(p.get("cached_input_per_mtok", p.get("input_per_mtok", 0)) or 0)
    return round(total / 1e6, 8)


def price_table(prices: dict[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    """(version, {model: prices}) of a configured table, flat or versioned."""
    p = dict(prices or {})
    if isinstance(p.get("models"), dict):
        v = p.get("version")
        return (None if v is None else str(v)), dict(p["models"])
    v = p.pop("version", None)
    return (None if v is None else str(v)), {k: x for k, x in p.items() if isinstance(x, dict)}


BILLED = ("requests", "input_tokens", "output_tokens", "cached_input_tokens")


def add_billing(billing: dict[str, dict[str, Any]], usage: dict[str, Any], model: str | None = None) -> None:
    """Add one response's usage to the per-model sums (``model``: else the usage's own)."""
    name = model or usage.get("model") or "(unnamed)"
    row = billing.setdefault(str(name), {k: 0 for k in BILLED})
    for k in BILLED:
        row[k] += _int(usage.get(k))
    c = usage.get("cost_usd")
    if isinstance(c, int | float) and not isinstance(c, bool):
        row["cost_usd"] = round(float(row.get("cost_usd", 0.0)) + c, 8)
