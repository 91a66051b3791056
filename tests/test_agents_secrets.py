"""Secrets hygiene: a judge API key set for grading in the controller's environment
reaches none of the agent process's environment, the container's environment,
any file in the container the agent can read, or the trajectory."""

from __future__ import annotations

import asyncio
import json
import secrets

import pytest

from ale.agents.base import AgentEnd
from ale.agents.command import CommandAgent
from ale.agents.errors import AgentConfigError
from ale.agents.registry import agent_evidence
from ale.plan import AgentSpec
from tests.test_agents_support import ANSWER, box, make_ctx, standin_command  # noqa: F401 - box is a fixture

pytestmark = pytest.mark.docker


def test_judge_key_reaches_no_agent_surface(box, tmp_path, monkeypatch):  # noqa: F811
    key = "judge-" + secrets.token_hex(16)
    monkeypatch.setenv("ALE_JUDGE_API_KEY", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-" + secrets.token_hex(8))

    # Listing it is refused outright, under its own name or smuggled in another one.
    with pytest.raises(AgentConfigError, match="ALE_JUDGE_API_KEY"):
        CommandAgent({"command": standin_command(), "env_pass": ["ALE_JUDGE_API_KEY"]})
    with pytest.raises(AgentConfigError, match="forbidden variable"):
        CommandAgent({"command": standin_command(), "env": {"OPENAI_API_KEY": key}})

    # A command agent that asks for everything it may: the key is still absent.
    ctx, writer = make_ctx(box, tmp_path)
    agent = CommandAgent({"command": standin_command("solve"), "env_pass": ["LANG", "TERM"]})
    out = asyncio.run(agent.run(ctx))
    steps = [
        {"command": "env; cat /proc/1/environ | tr '\\0' '\\n'; for p in /proc/[0-9]*; do cat $p/environ 2>/dev/null; done"},
    ]
    for args in steps:
        asyncio.run(ctx.tools.call("shell", args))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FINISHED, out.detail
    assert (box.workspace / "answer.txt").read_text() == ANSWER

    # 1. the agent process's environment (the stand-in dumped it to its raw log)
    log = (tmp_path / "agent" / "stdout.log").read_text()
    env = json.loads(next(line for line in log.splitlines() if line.startswith("ENV "))[4:])
    assert "ALE_JUDGE_API_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert key not in log

    # 2. the container's environment, as docker states it and as its processes see it
    inspect = box.sandbox.inspect()
    assert key not in json.dumps(inspect["Config"].get("Env") or [])
    seen = asyncio.run(box.sandbox.exec(["sh", "-c", "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"], timeout=30))
    assert key.encode() not in seen.stdout

    # 3. any file in the container the candidate can read. The key goes in on stdin,
    #    so it is in no command line this search could match on.
    def search_for(needle: str) -> str:
        r = asyncio.run(box.sandbox.exec(
            ["sh", "-c", "grep -rlsF -f /dev/stdin / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev; echo searched"],
            stdin=(needle + "\n").encode(), timeout=120,
        ))
        return r.stdout.decode().strip()

    planted = "planted-" + secrets.token_hex(8)
    (box.workspace / "planted.txt").write_text(planted)
    assert search_for(planted) == "/workspace/planted.txt\nsearched"  # the search does find things
    assert search_for(key) == "searched"

    # 4. the trajectory and everything else in the run folder (raw logs, MCP config)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), f"judge key found in {path}"

    # 5. the agent evidence
    assert key not in json.dumps(agent_evidence(AgentSpec(name="command", config={"command": standin_command()})))
