"""The MCP bridge, driven by the MCP SDK's own client against a real container."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from ale.agents.mcp_bridge import ToolBridge, mcp_config, serve_http
from tests.test_agents_support import ANSWER, NUMBERS, box, make_ctx  # noqa: F401 - box is a fixture

pytestmark = pytest.mark.docker


def _text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def _session(url: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers)
    return http, Client(streamable_http_client(url, http_client=http))


def test_http_bridge_lists_exactly_the_allowlist_writes_land_and_disallowed_is_refused(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path, allowlist=("read_file", "write_file"))

    async def scenario():
        async with serve_http(ctx.tools) as (url, token):
            assert url.startswith("http://127.0.0.1:")
            http, client = await _session(url, token)
            async with http, client:
                tools = (await client.list_tools()).tools
                names = sorted(t.name for t in tools)
                read = await client.call_tool("read_file", {"path": "/input/numbers.txt"})
                wrote = await client.call_tool("write_file", {"path": "/workspace/answer.txt", "content": ANSWER})
                shell = await client.call_tool("shell", {"command": "touch /workspace/pwned"})
                escape = await client.call_tool("write_file", {"path": "/input/numbers.txt", "content": "0"})
                return names, tools, read, wrote, shell, escape

    names, tools, read, wrote, shell, escape = asyncio.run(scenario())
    writer.close(end="finished")
    assert names == ["read_file", "write_file"]
    assert all(t.input_schema["type"] == "object" for t in tools)
    assert _text(read) == NUMBERS and not read.is_error
    assert not wrote.is_error and (box.workspace / "answer.txt").read_text() == ANSWER
    # The unlisted tool is refused, not run, and the refusal is in the trajectory.
    assert shell.is_error and "not allowed" in _text(shell)
    assert not (box.workspace / "pwned").exists()
    # The write tool runs as the candidate: the read-only input stays as it was.
    assert escape.is_error and (box.input_dir / "numbers.txt").read_text() == NUMBERS
    steps = json.loads((tmp_path / "trajectory.json").read_text())["steps"]
    assert [(s["tool"], s["refused"]) for s in steps] == [
        ("read_file", False), ("write_file", False), ("shell", True), ("write_file", False)
    ]  # the failed write ran and failed: an error, not an allowlist refusal
    assert "not allowed" in steps[2]["error"] and "not allowed" not in steps[3]["error"]
    assert steps[2]["args"] == {"command": "touch /workspace/pwned"}
    assert steps[3]["ok"] is False and steps[3]["error"]


def test_http_bridge_rejects_missing_and_wrong_tokens(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    bridge = ToolBridge(ctx.tools)

    async def scenario():
        async with serve_http(bridge) as (url, token):
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            hdrs = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
            async with httpx2.AsyncClient() as raw:
                none = await raw.post(url, json=body, headers=hdrs)
                wrong = await raw.post(url, json=body, headers={**hdrs, "Authorization": "Bearer nope"})
                other = await raw.post(url, json=body, headers={**hdrs, "Authorization": f"Basic {token}"})
            http, client = await _session(url, "wrong-token")
            with pytest.raises(Exception):  # noqa: B017 - the SDK's error type for an HTTP 401 varies
                async with http, client:
                    await client.list_tools()
            return none, wrong, other

    none, wrong, other = asyncio.run(scenario())
    writer.close(end="finished")
    assert (none.status_code, wrong.status_code, other.status_code) == (401, 401, 401)
    assert none.headers["www-authenticate"].startswith("Bearer")
    assert bridge.rejected_requests >= 4
    assert json.loads((tmp_path / "trajectory.json").read_text())["steps"] == []


def test_bridge_step_limit_refuses_and_records(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    bridge = ToolBridge(ctx.tools, max_steps=2)

    async def scenario():
        async with serve_http(bridge) as (url, token):
            http, client = await _session(url, token)
            async with http, client:
                return [await client.call_tool("list_dir", {"path": "/input"}) for _ in range(3)]

    results = asyncio.run(scenario())
    writer.close(end="finished")
    assert [r.is_error for r in results] == [False, False, True]
    assert "step limit of 2" in _text(results[2]) and bridge.limit_reached.is_set()
    steps = json.loads((tmp_path / "trajectory.json").read_text())["steps"]
    assert [s["refused"] for s in steps] == [False, False, True]


def test_mcp_config_shapes():
    claude = mcp_config("http://127.0.0.1:1/mcp", "tok")
    assert claude == {"mcpServers": {"ale": {"type": "http", "url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer tok"}}}}
    gemini = mcp_config("http://127.0.0.1:1/mcp", "tok", fmt="gemini")
    assert gemini["mcpServers"]["ale"]["httpUrl"] == "http://127.0.0.1:1/mcp"
    assert gemini["tools"] == {"core": ["mcp_ale_shell", "mcp_ale_read_file", "mcp_ale_write_file", "mcp_ale_list_dir"]}
    narrow = mcp_config("http://127.0.0.1:1/mcp", "tok", fmt="gemini", tools=("read_file",))
    assert narrow["tools"] == {"core": ["mcp_ale_read_file"]}


def test_stdio_bridge_with_the_sdk_client(box, tmp_path):  # noqa: F811
    box.reset_workspace()
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "ale.cli.agents", "mcp-stdio", "--container", box.sandbox.name,
              "--allow", "list_dir,write_file", "--trajectory-dir", str(tmp_path)],
    )

    async def scenario():
        async with Client(params) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            wrote = await client.call_tool("write_file", {"path": "/workspace/stdio.txt", "content": "via stdio"})
            refused = await client.call_tool("read_file", {"path": "/input/numbers.txt"})
            return names, wrote, refused

    names, wrote, refused = asyncio.run(scenario())
    assert names == ["list_dir", "write_file"]
    assert not wrote.is_error and (box.workspace / "stdio.txt").read_text() == "via stdio"
    assert refused.is_error and "not allowed" in _text(refused)
    lines = [json.loads(x) for x in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    assert [(s["tool"], s["refused"]) for s in lines] == [("write_file", False), ("read_file", True)]
