"""The gateway replays a source run's recorded model turns (no sandbox): matching
requests are answered from the record without the upstream, the first differing
one goes live and says what differed, nothing replayed is billed, and the record
re-derives it (ale.agents.gateway.resume)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx2 as httpx
import pytest

from ale.agents.gateway.record import derive, read_records, summarize
from ale.agents.gateway.resume import prepare_resume, request_digest
from ale.agents.gateway.server import ModelGateway, serve_gateway
from ale.agents.gateway.tools import ToolPolicy
from tests.fake_model_api import FakeModelAPI

TOOLS = [{"type": "function", "function": {"name": "shell", "description": "run", "parameters": {"type": "object"}}}]


@pytest.fixture
def fake():
    api = FakeModelAPI(turns=30).start()
    try:
        yield api
    finally:
        api.stop()


def _gateway(run_dir: Path, fake: FakeModelAPI) -> ModelGateway:
    return ModelGateway(run_dir, ToolPolicy(("shell",)), upstreams={"openai": f"{fake.url}/v1", "anthropic": fake.url, "gemini": fake.url},
                        keys={"openai": "k"})


def _body(results: list[str], *, metadata: str = "a") -> dict:
    messages: list[dict] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "count"}]
    for n, text in enumerate(results):
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{n}", "type": "function",
                         "function": {"name": "shell", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": text})
    return {"model": "gpt-fake", "messages": messages, "tools": TOOLS, "metadata": {"session": metadata}}


async def _drive(run_dir: Path, fake: FakeModelAPI, bodies: list[dict]) -> list[dict]:
    gw = _gateway(run_dir, fake)
    out = []
    async with serve_gateway(gw) as url, httpx.AsyncClient(headers={"authorization": f"Bearer {gw.token}"}) as c:
        for b in bodies:
            r = await c.post(f"{url}/openai/v1/chat/completions", json=b)
            assert r.status_code == 200, r.text
            out.append(r.json())
    return out


def _results(n: int, changed: int | None = None) -> list[list[str]]:
    return [[f"exit_code: 0\nstdout:\n{i + 1}\n" if i != changed else "exit_code: 0\nstdout:\nrandom-Xq1\n" for i in range(k)]
            for k in range(n)]


def test_recorded_turns_are_answered_from_the_record_and_the_rest_goes_live(tmp_path, fake):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir(), dst.mkdir()
    first = asyncio.run(_drive(src, fake, [_body(r) for r in _results(5)]))
    assert fake.model_calls() == 5
    info = prepare_resume(dst, src)
    assert info["source_turns"] == 5 and info["source_usage"]["requests"] == 5
    # A new session id in the request's metadata: left out of the digest.
    again = asyncio.run(_drive(dst, fake, [_body(r, metadata="b") for r in _results(7)]))
    assert fake.model_calls() == 5 + 2, "a replayed turn reached the upstream"
    assert again[:5] == first
    summary = summarize(dst)
    assert summary is not None and not summary["problems"], summary["problems"]
    res = summary["resumed"]
    assert res["replayed_turns"] == 5 and res["diverged_at"] is None
    assert res["live"]["why"] == "after_last" and res["live"]["turn"] == 6
    assert [r["reexecuted"] for r in res["replayed"]][0] == [{"name": "shell", "id": "call_0"}]
    # Nothing replayed is billed: the usage and cost are the two live turns'.
    assert summary["usage"]["requests"] == 2 and summary["billing"]["total"]["requests"] == 2
    records, _ = read_records(dst)
    assert [r["decision"] for r in records if r["type"] == "request"] == ["replayed"] * 5 + ["forwarded"] * 2


def test_a_differing_tool_result_diverges_at_that_turn_and_says_what_differed(tmp_path, fake):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir(), dst.mkdir()
    asyncio.run(_drive(src, fake, [_body(r) for r in _results(6)]))
    prepare_resume(dst, src)
    # The third tool result (a file named at random) comes back otherwise: request 4 carries it.
    asyncio.run(_drive(dst, fake, [_body(r) for r in _results(6, changed=2)]))
    assert fake.model_calls() == 6 + 3
    summary = summarize(dst)
    assert summary is not None and not summary["problems"], summary["problems"]
    res = summary["resumed"]
    assert res["replayed_turns"] == 3 and res["diverged_at"] == 4
    live = res["live"]
    assert live["why"] == "diverged" and live["what"] == "tool_result" and live["tool_result"] == 3 and live["call_id"] == "call_2"
    assert live["digest"] != live["recorded_digest"] and "random-Xq1" in live["diff"] and "-3" in live["diff"]
    assert live["digest"] == request_digest("openai", "POST", "/chat/completions", json.dumps(_body(_results(6, changed=2)[3])).encode())


def test_an_edited_replayed_response_or_a_billed_replay_is_caught(tmp_path, fake):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir(), dst.mkdir()
    asyncio.run(_drive(src, fake, [_body(r) for r in _results(3)]))
    prepare_resume(dst, src)
    asyncio.run(_drive(dst, fake, [_body(r) for r in _results(3)]))
    records, _ = read_records(dst)
    _, problems = derive(dst, records)
    assert not problems
    # The copy of the source's record, edited: its chain no longer holds, its head is not the named one.
    copy = dst / "resume" / "source" / "agent" / "gateway" / "records.jsonl"
    lines = copy.read_text().splitlines()
    doc = json.loads(lines[-1])
    doc["status"] = 201
    copy.write_text("\n".join([*lines[:-1], json.dumps(doc)]) + "\n")
    _, problems = derive(dst, records)
    assert any("copy" in p for p in problems), problems
    # A replayed response that claims usage (billed twice).
    copy.write_text("\n".join(lines) + "\n")
    billed = [dict(r, usage={"requests": 1, "cost_usd": 0.01}) if r.get("by") == "replay" else r for r in records]
    _, problems = derive(dst, billed)
    assert any("never billed" in p for p in problems), problems


def _anthropic(results: list[str]) -> dict:
    messages: list[dict] = [{"role": "user", "content": "count"}]
    for n, text in enumerate(results):
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "mcp__ale__shell", "input": {}}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": text}]})
    return {"model": "claude-fake", "max_tokens": 100, "stream": True, "messages": messages,
            "tools": [{"name": "mcp__ale__shell", "input_schema": {"type": "object"}}]}


async def _drive_anthropic(run_dir: Path, fake: FakeModelAPI, bodies: list[dict], *, together: bool = False) -> list[bytes]:
    gw = ModelGateway(run_dir, ToolPolicy(("shell",)), upstreams={"openai": fake.url, "anthropic": fake.url, "gemini": fake.url},
                      keys={"anthropic": "k"})
    async with serve_gateway(gw) as url, httpx.AsyncClient(headers={"x-api-key": gw.token}) as c:
        async def one(b: dict) -> bytes:
            r = await c.post(f"{url}/anthropic/v1/messages", json=b)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
            return r.content
        if together:  # as a harness's sub-agents: at once, in any order
            return list(await asyncio.gather(*(one(b) for b in bodies)))
        return [await one(b) for b in bodies]


def test_streamed_answers_replay_byte_for_byte_and_concurrent_requests_in_any_order(tmp_path, fake):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir(), dst.mkdir()
    bodies = [_anthropic([]), _anthropic(["exit_code: 0\nstdout:\n42\n"])]
    first = asyncio.run(_drive_anthropic(src, fake, bodies))
    calls = fake.model_calls("/v1/messages")
    assert calls == 2 and b"tool_use" in first[0]
    prepare_resume(dst, src)
    again = asyncio.run(_drive_anthropic(dst, fake, list(reversed(bodies)), together=True))
    assert fake.model_calls("/v1/messages") == calls, "a replayed turn reached the upstream"
    assert list(reversed(again)) == first  # the recorded SSE stream, byte for byte
    summary = summarize(dst)
    assert summary is not None and not summary["problems"], summary["problems"]
    assert summary["resumed"]["replayed_turns"] == 2 and summary["resumed"]["live"] is None


def test_a_torn_last_record_left_by_a_kill_is_dropped_from_the_copy(tmp_path, fake):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir(), dst.mkdir()
    asyncio.run(_drive(src, fake, [_body(r) for r in _results(3)]))
    rec = src / "agent" / "gateway" / "records.jsonl"
    whole = rec.read_bytes()
    rec.write_bytes(whole + b'{"seq": 99, "type": "requ')  # the write a SIGKILL cut
    from ale.agents.gateway.resume import source_turns

    turns, _, problems = source_turns(src)  # what ale exp run --resume-turns and ale run --resume-from look at
    assert len(turns) == 3 and not problems
    info = prepare_resume(dst, src)
    assert info["source_turns"] == 3 and info["torn_tail_bytes"] == 25
    assert (dst / "resume" / "source" / "agent" / "gateway" / "records.jsonl").read_bytes() == whole


def test_a_resumed_run_killed_in_turn_resumes_again_and_keeps_both_attempts_spend(tmp_path, fake):
    src, mid, dst = tmp_path / "src", tmp_path / "mid", tmp_path / "dst"
    for d in (src, mid, dst):
        d.mkdir()
    asyncio.run(_drive(src, fake, [_body(r) for r in _results(3)]))
    prepare_resume(mid, src)
    asyncio.run(_drive(mid, fake, [_body(r) for r in _results(5)]))  # 3 replayed, 2 live: then "killed"
    calls = fake.model_calls()
    info = prepare_resume(dst, mid)
    # Every answer the two interrupted attempts paid for, once: 3 by the first, 2 by the second.
    assert info["source_turns"] == 5 and info["source_usage"]["requests"] == 5
    asyncio.run(_drive(dst, fake, [_body(r) for r in _results(6)]))
    assert fake.model_calls() == calls + 1
    summary = summarize(dst)
    assert summary is not None and not summary["problems"], summary["problems"]
    assert summary["resumed"]["replayed_turns"] == 5 and summary["usage"]["requests"] == 1
