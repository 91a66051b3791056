"""A native harness's steps, derived from the gateway's hash-chained record.

A harness running inside the sandbox executes its tools itself, so no trusted
component sees them run. What the trusted side does see is every model request and
response (``RUN/agent/gateway/records.jsonl``): each tool call is in a model
response, and its result comes back in a later request's conversation. One step per
tool call:

- the call, from response N (its request's record ``seq`` is the step's
  ``call_request``): Anthropic ``tool_use`` blocks, OpenAI Responses
  ``function_call`` / ``custom_tool_call`` / ``local_shell_call`` items, Chat
  Completions ``tool_calls``, Gemini ``functionCall`` parts;
- its result, from the first later model request whose conversation carries it:
  Anthropic ``tool_result`` by ``tool_use_id``, Responses ``*_output`` items by
  ``call_id``, Chat Completions ``role: tool`` messages by ``tool_call_id``, Gemini
  ``functionResponse`` parts by name and order (Gemini CLI gives a response an id of
  its own, which the model's call never had). A conversation only grows, so the
  result of a call in response N is the first one for its key beyond those request N
  already carried; calls reusing an id (or a Gemini name) are told apart by order;
- the model turn: the response's usage (tokens, cost).

A call with no later result (the harness was stopped, a budget ended the turn) is a
step with no result, and says so. The results are what the harness sent: written by
the candidate's side. The calls, their order and the turn's usage are what the model
answered, recorded by the gateway. Request bodies are the candidate's: a part that is
not of the expected shape is skipped and counted (``malformed``), never fatal.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ale.agents.gateway.parse import (
    PARSE_ERRORS,
    Malformed,
    call_key,
    parse_response,
    request_results,
    response_bytes,
)
from ale.agents.gateway.record import read_body, read_records
from ale.agents.gateway.tools import ANTHROPIC, GEMINI, OPENAI

NO_RESULT = ("no result: no later model request carried one (the harness was stopped, or its turn ended, "
             "before it sent the result back)")
HARNESS_ERROR = "the harness sent this result back as an error"


def is_generation(api: str, path: str) -> bool:
    """A request the model answers with a turn (token counting is not one)."""
    if api == ANTHROPIC:
        return path.endswith("/messages")
    if api == OPENAI:
        return path.endswith(("/responses", "/chat/completions"))
    if api == GEMINI:
        return path.rsplit(":", 1)[-1] in ("generateContent", "streamGenerateContent") if ":" in path else False
    return False


def _args(arguments: Any) -> dict[str, Any]:
    """A call's arguments as the step's ``args``: the object, a JSON string's object,
    else the raw value under ``input`` (a custom tool's free-form input)."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except PARSE_ERRORS:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
        return {"input": arguments}
    return {} if arguments is None else {"input": arguments}


def derive_steps(run_dir: Path, records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``{"steps": [...], "derivation": {...}}``: one raw step per tool call (for
    ``TrajectoryWriter.record``), and how they were derived (counts, the record's
    head, the malformed parts). Never raises on what the record holds."""
    run_dir = Path(run_dir)
    problems: list[str] = []
    if records is None:
        try:
            records, problems = read_records(run_dir)
        except PARSE_ERRORS as e:
            records, problems = [], [f"the gateway's record cannot be read: {type(e).__name__}"]
    bad = Malformed()
    requests: dict[int, dict[str, Any]] = {}
    answers: dict[int, dict[str, Any]] = {}
    for rec in records:
        seq = rec.get("seq")
        if not isinstance(seq, int):
            continue
        if rec.get("type") == "request" and rec.get("model_call") \
                and is_generation(str(rec.get("api")), str(rec.get("path"))):
            requests[seq] = rec
        # An answer the harness got: the model's, or a resumed run's replayed one (resume.py).
        elif rec.get("type") == "response" and rec.get("model_call") and rec.get("by") in ("upstream", "replay") \
                and isinstance(rec.get("status"), int) and 200 <= rec["status"] < 300 \
                and isinstance(rec.get("request"), int):
            answers.setdefault(rec["request"], rec)
    # How many results each model request carries, by key (the texts are read again, once, where a step needs them:
    # a long conversation repeats its whole history in every request).
    counts: dict[int, Counter[str]] = {}
    for seq, rec in sorted(requests.items()):
        counts[seq] = Counter(key for key, _, _ in _results(run_dir, rec, bad, problems))
    order = sorted(counts)
    steps: list[dict[str, Any]] = []
    joins: dict[tuple[int, int], int] = {}
    wanted: dict[int, list[tuple[dict[str, Any], str, int]]] = defaultdict(list)  # result request -> (step, key, nth)
    for seq in order:
        resp, req = answers.get(seq), requests[seq]
        if resp is None:
            continue
        api = str(req.get("api"))
        try:
            calls = parse_response(api, response_bytes(run_dir, resp.get("body") or {}),
                                   bool(resp.get("streamed")))["tool_calls"]
        except PARSE_ERRORS as e:
            bad.add(f"response {resp.get('seq')}: unreadable ({type(e).__name__})")
            continue
        seen = Counter(counts[seq])  # the results this request already carried
        for pos, call in enumerate(calls):
            name = call.get("name")
            if not isinstance(name, str) or not name:
                bad.add(f"response {resp.get('seq')}: tool call {pos} has no name")
                continue
            ckey = call_key(api, call)
            result_seq: int | None = None
            nth = 0
            if ckey is not None:
                seen[ckey] += 1
                nth = seen[ckey]
                result_seq = next((later for later in order if later > seq and counts[later][ckey] >= nth), None)
            usage = resp.get("usage") if isinstance(resp.get("usage"), dict) else {}
            origin = {
                "api": api, "call_id": call.get("id") if isinstance(call.get("id"), str) else None,
                "call_request": seq, "call_response": resp.get("seq"), "call_record": resp.get("hash"),
                "result_request": result_seq, "result_record": requests[result_seq].get("hash") if result_seq else None,
                "turn_usage": usage,
            }
            step: dict[str, Any] = {
                "index": len(steps) + 1, "tool": name, "args": _args(call.get("arguments")),
                "started_at": resp.get("time") or req.get("time") or "", "gateway": origin,
                "ok": False, "error": NO_RESULT,
            }
            extra = {k: call[k] for k in ("kind", "namespace") if isinstance(call.get(k), str)}
            if extra:
                step["extra"] = {f"call_{k}": v for k, v in extra.items()}
            step["ended_at"] = step["started_at"]
            if result_seq is not None and ckey is not None:
                step["ended_at"] = requests[result_seq].get("time") or step["started_at"]
                wanted[result_seq].append((step, ckey, nth))
            step["seconds"] = _seconds(step["started_at"], step["ended_at"])
            joins[(seq, pos)] = step["index"]
            steps.append(step)
    answered = 0
    for result_seq, needs in wanted.items():
        per: dict[str, list[tuple[str, bool]]] = defaultdict(list)
        for key, text, err in _results(run_dir, requests[result_seq], Malformed(), []):  # counted in the first pass
            per[key].append((text, err))
        for step, key, nth in needs:
            if len(per[key]) >= nth:
                text, err = per[key][nth - 1]
                step.update(ok=not err, output=text, error=HARNESS_ERROR if err else None)
                answered += 1
    head = records[-1].get("hash") if records else None
    derivation = {
        "source": "gateway", "records": len(records), "head": head, "model_requests": len(requests),
        "calls": len(steps), "answered": answered, "unanswered": len(steps) - answered,
        "malformed": bad.count, "malformed_where": bad.where, "record_problems": problems[:20],
    }
    return {"steps": steps, "derivation": derivation, "joins": joins}


def _results(run_dir: Path, rec: dict[str, Any], bad: Malformed, problems: list[str]) -> list[tuple[str, str, bool]]:
    """The tool results one request record's body carries (``parse.request_results``)."""
    where = f"request {rec.get('seq')}"
    try:
        body, probs = read_body(run_dir, rec.get("body") or {})
        problems += [f"{where}: {p}" for p in probs]
        return request_results(str(rec.get("api")), str(rec.get("path")), body, bad, where)
    except PARSE_ERRORS as e:
        bad.add(f"{where}: unreadable ({type(e).__name__})")
        return []


def _seconds(start: Any, end: Any) -> float:
    from datetime import datetime

    try:
        return max(0.0,
                   round((datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds(), 6))
    except ValueError:
        return 0.0


def is_native(records: list[dict[str, Any]]) -> bool:
    """True when the record's policy is a native harness's (its own tools are client tools)."""
    start = next((r for r in records if r.get("type") == "gateway.start"), None)
    policy = start.get("policy") if isinstance(start, dict) else None
    return isinstance(policy, dict) and policy.get("client_tools") is True
