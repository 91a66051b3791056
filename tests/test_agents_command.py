"""The command agent with a stand-in harness that speaks MCP over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from ale.agents.base import AgentEnd
from ale.agents.command import CommandAgent
from tests.test_agents_support import ANSWER, box, make_ctx, standin_command  # noqa: F401 - box is a fixture

pytestmark = pytest.mark.docker


def _alive_naming(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line holds `marker`: found from the
    host whatever PID namespace they run in (a confined harness has its own)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes() and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(d.name))
        except OSError:
            continue
    return found


def _pidfile(tmp_path: Path, name: str) -> Path:
    return tmp_path / "agent" / "cwd" / name  # the harness's working folder: writable when confined too


CONFINE = pytest.mark.parametrize("confine", [False, True], ids=["unconfined", "confined"])


def _log(tmp_path, name="stdout.log") -> str:
    return (tmp_path / "agent" / name).read_text()


def test_command_agent_solves_the_file_task_and_keeps_raw_logs(box, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("ALE_TEST_PASSED", "visible")
    monkeypatch.setenv("ALE_TEST_NOT_PASSED", "hidden")
    ctx, writer = make_ctx(box, tmp_path)
    agent = CommandAgent({"command": standin_command("solve"), "env_pass": ["ALE_TEST_PASSED"], "env": {"MODE": "{workdir}"}})
    out = asyncio.run(agent.run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FINISHED, out.detail
    assert (box.workspace / "answer.txt").read_text() == ANSWER
    log = _log(tmp_path)
    env = json.loads(next(line for line in log.splitlines() if line.startswith("ENV "))[4:])
    gateway = {"OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "GOOGLE_GEMINI_BASE_URL", "OPENAI_API_KEY", "CODEX_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"}
    assert set(env) <= {"PATH", "HOME", "LANG", "PWD", "ALE_TEST_PASSED", "MODE", "ALE_MCP_URL", "ALE_MCP_TOKEN", "ALE_MCP_CONFIG", *gateway}
    # Every API key the harness holds is the run's token, for the run's gateway.
    assert len({env[k] for k in gateway if k.endswith("_KEY")}) == 1 and env["OPENAI_API_KEY"].startswith("ale-run-")
    assert env["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:") and env["ANTHROPIC_BASE_URL"].endswith("/anthropic")
    assert env["ALE_TEST_PASSED"] == "visible" and env["MODE"] == "/workspace"
    assert "PROMPT Read /input/numbers.txt" in log and 'TOOLS ["list_dir", "read_file", "shell", "write_file"]' in log
    assert (tmp_path / "agent" / "stderr.log").exists()
    # The token in the kept MCP config is redacted once the bridge is gone.
    assert "***REDACTED***" in (tmp_path / "agent" / "mcp-config.json").read_text()
    assert env["ALE_MCP_TOKEN"] not in (tmp_path / "agent" / "mcp-config.json").read_text()
    steps = json.loads((tmp_path / "trajectory.json").read_text())["steps"]
    assert [s["tool"] for s in steps] == ["read_file", "write_file"]
    assert out.usage["tool_calls"] == 2 and out.usage["exit_code"] == 0


def test_command_agent_refused_tool_is_recorded(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path, allowlist=("read_file", "write_file"))
    out = asyncio.run(CommandAgent({"command": standin_command("disallowed")}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.FINISHED, out.detail
    assert 'DISALLOWED {"is_error": true' in _log(tmp_path)
    steps = json.loads((tmp_path / "trajectory.json").read_text())["steps"]
    assert [(s["tool"], s["refused"]) for s in steps] == [("shell", True), ("read_file", False), ("write_file", False)]


def test_command_agent_nonzero_exit_is_failed(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent({"command": standin_command("fail")}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.FAILED
    assert "exited with code 3" in out.detail and "failing on purpose" in out.detail


@CONFINE
def test_command_agent_that_never_stops_is_cut_at_wall_time_and_killed(box, tmp_path, confine):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path, wall_time_s=4)
    pidfile = _pidfile(tmp_path, "harness.pid")
    t0 = time.monotonic()
    out = asyncio.run(CommandAgent({"command": standin_command("hang", "--pidfile", str(pidfile)), "kill_grace_s": 0.5,
                                    "confine": confine}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.TIMEOUT and "wall time" in out.detail
    assert time.monotonic() - t0 < 15
    assert pidfile.exists() and not _alive_naming(str(pidfile))


@CONFINE
def test_command_agent_cancelled_from_outside_kills_its_group(box, tmp_path, confine):  # noqa: F811
    """The lifecycle's own wall clock cancels the agent task: the harness must still die."""
    ctx, writer = make_ctx(box, tmp_path, wall_time_s=600)
    pidfile = _pidfile(tmp_path, "harness.pid")
    agent = CommandAgent({"command": standin_command("hang", "--pidfile", str(pidfile)), "kill_grace_s": 0.5, "confine": confine})

    async def scenario():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(agent.run(ctx), timeout=4)

    asyncio.run(scenario())
    writer.close(end="timeout")
    assert pidfile.exists() and not _alive_naming(str(pidfile))


@CONFINE
def test_command_agent_kills_background_children_of_the_harness(box, tmp_path, confine):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    pidfile = _pidfile(tmp_path, "child.pid")
    out = asyncio.run(CommandAgent({"command": standin_command("spawn", "--pidfile", str(pidfile)), "kill_grace_s": 0.5,
                                    "confine": confine}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.FINISHED, out.detail
    assert pidfile.exists() and not _alive_naming(str(pidfile))


def test_command_agent_step_limit_is_a_timeout(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path, max_steps=3)
    out = asyncio.run(CommandAgent({"command": standin_command("steps"), "kill_grace_s": 0.5}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.TIMEOUT and "step limit of 3" in out.detail
    steps = json.loads((tmp_path / "trajectory.json").read_text())["steps"]
    assert [s["refused"] for s in steps] == [False, False, False, True]


def test_command_agent_missing_binary_is_failed(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent({"command": ["/nonexistent/harness", "{prompt}"], "confine": False}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.FAILED and "/nonexistent/harness" in out.detail


def test_a_harness_that_cannot_be_found_to_confine_is_a_config_error() -> None:
    from ale.agents.errors import AgentConfigError

    with pytest.raises(AgentConfigError, match="cannot find the harness program '/nonexistent/harness' to confine it"):
        CommandAgent({"command": ["/nonexistent/harness", "{prompt}"]})
