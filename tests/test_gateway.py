"""The model gateway on its own: tool extraction for every API shape, pass-through
(JSON and SSE), the run's token, the operator's key, refusals and the record."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx2 as httpx
import pytest

from ale.agents.errors import AgentConfigError
from ale.agents.gateway.record import read_records, summarize
from ale.agents.gateway.server import ModelGateway, serve_gateway
from ale.agents.gateway.tools import HarnessProfile, ToolPolicy, offered_tools
from ale.agents.gateway.usage import cost, usage_of
from tests.fake_model_api import FakeModelAPI

KEY = "sk-operator-key-0123456789abcdef"


@pytest.mark.parametrize(("api", "path", "body", "want"), [
    ("openai", "/chat/completions", {"tools": [{"type": "function", "function": {"name": "shell"}}], "web_search_options": {}},
     ["server:web_search", "shell"]),
    ("openai", "/responses", {"tools": [{"type": "function", "name": "exec"}, {"type": "web_search"}, {"type": "file_search"},
                                        {"type": "code_interpreter"}, {"type": "computer_use_preview"}, {"type": "mcp", "server_label": "gh"},
                                        {"type": "namespace", "name": "mcp__ale", "tools": [{"type": "function", "name": "mcp__ale__shell"}]}]},
     ["exec", "mcp:gh", "mcp__ale__shell", "server:code_interpreter", "server:computer_use_preview", "server:file_search", "server:web_search"]),
    ("anthropic", "/v1/messages", {"tools": [{"name": "mcp__ale__shell"}, {"type": "web_fetch_20250910", "name": "web_fetch"},
                                             {"type": "code_execution_20250825", "name": "code_execution"}, {"type": "computer_20250124"}],
                                   "mcp_servers": [{"name": "linear", "url": "https://x"}]},
     ["mcp:linear", "mcp__ale__shell", "server:code_execution_20250825", "server:computer_20250124", "server:web_fetch_20250910"]),
    ("gemini", "/v1beta/models/g:generateContent", {"tools": [{"functionDeclarations": [{"name": "mcp_ale_shell"}]}, {"googleSearch": {}},
                                                               {"codeExecution": {}}, {"urlContext": {}}]},
     ["mcp_ale_shell", "server:codeExecution", "server:googleSearch", "server:urlContext"]),
    ("anthropic", "/v1/messages", {"tools": ["Bash"]}, ["unreadable:tools[0]"]),
])
def test_every_kind_of_tool_is_extracted(api, path, body, want):
    assert offered_tools(api, path, body) == want
    assert ToolPolicy(("shell",)).forbidden(want) == [t for t in want if t not in ("shell", "mcp__ale__shell", "mcp_ale_shell")]


def test_a_profile_names_each_tool_with_its_reason_and_never_a_server_tool():
    p = HarnessProfile.load({"name": "codex", "allow": {"exec": "a JavaScript cell without file system or network"}})
    assert ToolPolicy(("shell",), p).forbidden(["exec", "mcp__ale__shell", "Bash"]) == ["Bash"]
    with pytest.raises(AgentConfigError, match="reason"):
        HarnessProfile.load({"allow": {"exec": ""}})
    with pytest.raises(AgentConfigError, match="never allowed"):
        HarnessProfile.load({"allow": {"server:web_search": "no"}})


def test_usage_is_read_alike_from_json_and_streams():
    sse = (b'event: message_start\ndata: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":7,"output_tokens":1}}}\n\n'
           b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":9}}\n\n')
    assert usage_of("anthropic", sse, True) == {"input_tokens": 7, "output_tokens": 9, "total_tokens": 16, "model": "m"}
    gem = b'data: {"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":2,"thoughtsTokenCount":1},"modelVersion":"g"}\n\n'
    assert usage_of("gemini", gem, True)["output_tokens"] == 3
    chat = json.dumps({"model": "x", "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode()
    u = usage_of("openai", chat, False)
    assert u["total_tokens"] == 15 and cost(u, "x", {"x": {"input_per_mtok": 1e6, "output_per_mtok": 2e6}}) == 20.0
    assert cost(u, "unpriced", {}) is None


async def _exchange(run_dir: Path, fake: FakeModelAPI, calls):
    gw = ModelGateway(run_dir, ToolPolicy(("shell", "read_file")), keys={"openai": KEY, "anthropic": KEY, "gemini": KEY},
                      upstreams={"openai": fake.url + "/v1", "anthropic": fake.url, "gemini": fake.url},
                      prices={"gpt-fake": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}})
    out = []
    async with serve_gateway(gw) as url, httpx.AsyncClient(timeout=30) as c:
        for method, path, headers, body in calls:
            r = await c.request(method, url + path, headers={k: v.replace("TOKEN", gw.token) for k, v in headers.items()}, json=body)
            out.append(r)
    return gw, out


@pytest.fixture
def fake():
    api = FakeModelAPI().start()
    yield api
    api.stop()


def test_pass_through_keys_refusals_and_record(tmp_path, fake):
    shell = [{"type": "function", "function": {"name": "shell", "parameters": {}}}]
    calls = [
        ("POST", "/openai/v1/chat/completions", {"authorization": "Bearer TOKEN"}, {"model": "gpt-fake", "messages": [], "tools": shell}),
        ("POST", "/openai/v1/chat/completions", {"authorization": "Bearer TOKEN"}, {"model": "gpt-fake", "messages": [], "tools": shell, "stream": True}),
        ("POST", "/gemini/v1beta/models/g:streamGenerateContent?alt=sse", {"x-goog-api-key": "TOKEN"}, {"contents": [], "tools": [{"functionDeclarations": [{"name": "mcp_ale_shell"}]}]}),
        ("POST", "/openai/v1/responses", {"authorization": "Bearer TOKEN"}, {"model": "gpt-fake", "input": "hi", "stream": True, "tools": [{"type": "web_search"}]}),
        ("POST", "/gemini/v1beta/models/g:generateContent", {"x-goog-api-key": "TOKEN"}, {"contents": [], "tools": [{"googleSearch": {}}]}),
        ("POST", "/anthropic/v1/messages", {"x-api-key": KEY}, {"model": "m", "messages": []}),  # the real key is not the run's token
    ]
    gw, rs = asyncio.run(_exchange(tmp_path, fake, calls))
    assert [r.status_code for r in rs] == [200, 200, 200, 403, 403, 401]
    assert rs[0].json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "shell"
    assert rs[1].text.endswith("data: [DONE]\n\n") and rs[1].headers["content-type"].startswith("text/event-stream")
    assert "server:web_search" in rs[3].json()["error"]["message"] and rs[4].json()["error"]["status"] == "PERMISSION_DENIED"
    # Upstream saw the operator's key and only the allowed requests; the refused ones never left.
    assert [r["path"] for r in fake.requests] == ["/v1/chat/completions", "/v1/chat/completions", "/v1beta/models/g:streamGenerateContent"]
    assert fake.requests[0]["headers"]["authorization"] == f"Bearer {KEY}" and fake.requests[2]["headers"]["x-goog-api-key"] == KEY
    assert "key" not in fake.requests[2]["query"]
    # The record: chained, no key in it, tools per request, refusals after an answer.
    assert KEY not in "".join(p.read_text() for p in (tmp_path / "agent" / "gateway").rglob("*") if p.is_file())
    assert not read_records(tmp_path)[1]
    s = summarize(tmp_path)
    assert s is not None and not s["problems"]
    assert [r["tools"] for r in s["requests"]] == [["shell"], ["shell"], ["mcp_ale_shell"], ["server:web_search"], ["server:googleSearch"]]
    assert [r["seq"] for r in s["refusals"]] == [r["seq"] for r in s["requests"][3:]] and not s["refusals"][0]["before_any_answer"]
    assert gw.usage["requests"] == 3 and gw.usage["input_tokens"] == 300 and gw.usage["cost_usd"] == pytest.approx(0.00028)  # two priced answers; "g" has no price
    assert gw.unauthorized == 1


def test_a_large_body_is_kept_as_a_file_and_an_edit_is_caught(tmp_path, fake):
    tools = [{"type": "function", "function": {"name": "shell", "description": "x" * 40000, "parameters": {}}}]
    asyncio.run(_exchange(tmp_path, fake, [("POST", "/openai/v1/chat/completions", {"authorization": "Bearer TOKEN"},
                                            {"model": "gpt-fake", "messages": [], "tools": tools})]))
    bodies = sorted((tmp_path / "agent" / "gateway" / "bodies").iterdir())
    assert [b.name for b in bodies] == ["000002-request"]
    doc = json.loads(bodies[0].read_text())
    doc["tools"] = []
    bodies[0].write_text(json.dumps(doc))
    s = summarize(tmp_path)
    assert s is not None and any("does not match the sha256" in p for p in s["problems"])
