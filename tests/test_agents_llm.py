"""The llm agent against a local fake OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

import pytest
from aiohttp import web

from ale.agents.base import AgentEnd
from ale.agents.llm import LLMAgent
from tests.test_agents_support import ANSWER, NUMBERS, box, make_ctx  # noqa: F401 - box is a fixture

pytestmark = pytest.mark.docker

Script = Callable[[dict, int], dict]


class FakeLLM:
    """Answers /v1/chat/completions from a script: (request body, request number) -> message."""

    def __init__(self, script: Script, *, tokens: int = 15, delay_s: float = 0.0, status: int = 200):
        self.script, self.tokens, self.delay_s, self.status = script, tokens, delay_s, status
        self.requests: list[dict] = []
        self.agent_seconds = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return web.json_response({"error": {"message": "scripted failure", "type": "invalid_request_error"}}, status=self.status)
        msg = {"role": "assistant", "content": None, **self.script(body, len(self.requests))}
        return web.json_response({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": self.tokens - 5, "completion_tokens": 5, "total_tokens": self.tokens},
        })

    @contextlib.asynccontextmanager
    async def serve(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            await runner.cleanup()


def call(name: str, args: dict | str, i: int = 1) -> dict:
    raw = args if isinstance(args, str) else json.dumps(args)
    return {"tool_calls": [{"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": raw}}]}


def solver(body: dict, n: int) -> dict:
    """List the input, read the numbers, write their sum, then stop."""
    tool_msgs = [m for m in body["messages"] if m["role"] == "tool"]
    if len(tool_msgs) == 0:
        return call("shell", {"command": "ls /input"}, 1)
    if len(tool_msgs) == 1:
        return call("read_file", {"path": "/input/numbers.txt"}, 2)
    if len(tool_msgs) == 2:
        total = sum(int(x) for x in tool_msgs[-1]["content"].split())
        return call("write_file", {"path": "/workspace/answer.txt", "content": f"{total}\n"}, 3)
    return {"content": "Done: the sum is in /workspace/answer.txt."}


def run_llm(ctx, config: dict, fake: FakeLLM):
    async def scenario():
        async with fake.serve() as base_url:
            t0 = time.monotonic()
            out = await LLMAgent({"base_url": base_url, "model": "fake-model", "api_key": "test-key", **config}).run(ctx)
            fake.agent_seconds = time.monotonic() - t0
            return out

    return asyncio.run(scenario())


def test_llm_agent_solves_the_file_task_and_the_trajectory_shows_each_call(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    fake = FakeLLM(solver)
    out = run_llm(ctx, {}, fake)
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FINISHED, out.detail
    assert (box.workspace / "answer.txt").read_text() == ANSWER
    doc = json.loads((tmp_path / "trajectory.json").read_text())
    assert [(s["tool"], s["ok"]) for s in doc["steps"]] == [("shell", True), ("read_file", True), ("write_file", True)]
    assert doc["steps"][0]["stdout"] == "numbers.txt\n"
    # The trajectory shows what read_file returned, as the model got it.
    assert doc["steps"][1]["output"] == NUMBERS
    assert NUMBERS.strip() in json.dumps(fake.requests[2]["body"]["messages"])
    assert doc["usage"] == out.usage == {
        "model": "fake-model", "requests": 4, "prompt_tokens": 40, "completion_tokens": 20, "total_tokens": 60, "tool_calls": 3,
        "input_tokens": 40, "output_tokens": 20,  # the gateway's count, the same for every harness
    }
    # Every request went through the run's gateway: recorded, its tools the bridge's alone.
    from ale.agents.gateway.record import summarize

    summary = summarize(tmp_path)
    assert summary is not None and not summary["problems"] and len(summary["requests"]) == 4
    assert all(r["tools"] == ["list_dir", "read_file", "shell", "write_file"] and r["decision"] == "forwarded" for r in summary["requests"])
    first = fake.requests[0]
    assert first["headers"]["Authorization"] == "Bearer test-key" and first["body"]["model"] == "fake-model"
    assert [t["function"]["name"] for t in first["body"]["tools"]] == ["shell", "read_file", "write_file", "list_dir"]
    assert first["body"]["messages"][1] == {"role": "user", "content": ctx.prompt}
    assert len((tmp_path / "agent" / "llm-transcript.jsonl").read_text().splitlines()) == 4


def test_llm_agent_sees_only_allowlisted_tools_and_refusals_are_recorded(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path, allowlist=("read_file", "write_file"))

    def script(body, n):
        if n == 1:
            return call("shell", {"command": "id"})
        if n == 2:
            return call("write_file", "{not json", 2)
        return {"content": "giving up"}

    fake = FakeLLM(script)
    out = run_llm(ctx, {}, fake)
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.FINISHED
    assert [t["function"]["name"] for t in fake.requests[0]["body"]["tools"]] == ["read_file", "write_file"]
    steps = json.loads((tmp_path / "trajectory.json").read_text())["steps"]
    assert [(s["tool"], s["refused"]) for s in steps] == [("shell", True), ("write_file", True)]
    assert "unusable arguments" in steps[1]["error"]
    tool_replies = [m["content"] for m in fake.requests[2]["body"]["messages"] if m["role"] == "tool"]
    assert "not allowed" in tool_replies[0] and "unusable arguments" in tool_replies[1]


def test_llm_agent_step_limit_is_a_timeout(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path, max_steps=3)
    out = run_llm(ctx, {"max_steps": 10}, FakeLLM(lambda b, n: call("shell", {"command": f"echo {n}"}, n)))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.TIMEOUT and "step limit of 3" in out.detail
    assert out.usage["tool_calls"] == 3
    assert len(json.loads((tmp_path / "trajectory.json").read_text())["steps"]) == 3


def test_llm_agent_token_limit_is_a_timeout(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    out = run_llm(ctx, {"max_tokens_total": 2500}, FakeLLM(lambda b, n: call("list_dir", {}, n), tokens=1000))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.TIMEOUT and "token limit of 2500" in out.detail
    assert out.usage["total_tokens"] == 3000 and out.usage["requests"] == 3


def test_llm_agent_wall_time_is_a_timeout(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    fake = FakeLLM(solver, delay_s=20)
    out = run_llm(ctx, {"wall_time_s": 1.5}, fake)
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.TIMEOUT and "wall time" in out.detail
    assert fake.agent_seconds < 5


def test_llm_agent_api_error_is_failed(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    out = run_llm(ctx, {}, FakeLLM(solver, status=400))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.FAILED and "scripted failure" in out.detail


def test_llm_settings_come_from_config_then_ale_then_openai_env(monkeypatch):
    for k in ("ALE_LLM_BASE_URL", "ALE_LLM_MODEL", "ALE_LLM_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "openai-key")
    monkeypatch.setenv("OPENAI_MODEL", "openai-model")
    assert LLMAgent({}).settings() == (None, "openai-model", "openai-key")
    monkeypatch.setenv("ALE_LLM_API_KEY", "ale-key")
    monkeypatch.setenv("ALE_LLM_MODEL", "ale-model")
    monkeypatch.setenv("ALE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    assert LLMAgent({}).settings() == ("http://127.0.0.1:9/v1", "ale-model", "ale-key")
    assert LLMAgent({"model": "m", "base_url": "http://127.0.0.1:8/v1"}).settings() == ("http://127.0.0.1:8/v1", "m", "ale-key")
    monkeypatch.setenv("MY_KEY", "mine")
    assert LLMAgent({"api_key_env": "MY_KEY"}).settings()[2] == "mine"
