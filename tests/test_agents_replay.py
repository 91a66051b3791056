"""The replay agent against a real container, and the tool limits it runs into."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from ale.agents.base import AgentEnd
from ale.agents.replay import ReplayAgent
from ale.sandbox.tools import TRUNCATION_MARKER
from tests.test_agents_support import ANSWER, box, make_ctx  # noqa: F401 - box is a fixture

pytestmark = pytest.mark.docker


def _steps(tmp_path) -> list[dict]:
    return json.loads((tmp_path / "trajectory.json").read_text())["steps"]


def test_replay_script_file_solves_the_task(box, tmp_path):  # noqa: F811
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"tool": "list_dir", "args": {"path": "/input"}},
        {"tool": "shell", "args": {"command": "tr ' ' '\\n' < /input/numbers.txt | awk '{s+=$1} END {print s}' > answer.txt"}},
        {"tool": "read_file", "args": {"path": "/workspace/answer.txt"}},
        {"tool": "write_file", "args": {"path": "/workspace/notes/hello.txt", "content": "hi"}},
    ]))
    run_dir = tmp_path / "run"
    ctx, writer = make_ctx(box, run_dir)
    out = asyncio.run(ReplayAgent({"script": str(script)}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.FINISHED, out.detail
    assert (box.workspace / "answer.txt").read_text() == ANSWER
    assert (box.workspace / "notes" / "hello.txt").read_text() == "hi"
    steps = _steps(run_dir)
    assert [(s["tool"], s["ok"]) for s in steps] == [("list_dir", True), ("shell", True), ("read_file", True), ("write_file", True)]
    assert steps[0]["output"] == "numbers.txt\n" and steps[1]["exit_code"] == 0


def test_replay_failures_are_recorded_and_the_replay_goes_on(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    steps = [
        {"tool": "write_file", "args": {"path": "/input/evil.txt", "content": "x"}},
        {"tool": "shell", "args": {"command": "echo x > /etc/evil; ls /nonexistent"}},
        {"tool": "write_file", "args": {"path": "/workspace/ok.txt", "content": "ok"}},
    ]
    out = asyncio.run(ReplayAgent({"steps": steps}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.FINISHED
    assert not (box.input_dir / "evil.txt").exists() and (box.workspace / "ok.txt").read_text() == "ok"
    recorded = _steps(tmp_path)
    assert [s["ok"] for s in recorded] == [False, False, True]
    assert recorded[1]["exit_code"] != 0 and "Read-only file system" in recorded[1]["stderr"]
    stopped = asyncio.run(ReplayAgent({"steps": steps, "stop_on_error": True}).run(make_ctx(box, tmp_path / "b")[0]))
    assert stopped.end == AgentEnd.FAILED and "index 0" in stopped.detail


def test_replay_step_limit_is_a_timeout(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path, max_steps=2)
    steps = [{"tool": "shell", "args": {"command": f"echo {i}"}} for i in range(5)]
    out = asyncio.run(ReplayAgent({"steps": steps}).run(ctx))
    writer.close(end=out.end.value)
    assert out.end == AgentEnd.TIMEOUT and "step limit of 2" in out.detail
    assert len(_steps(tmp_path)) == 2


def test_a_command_that_never_ends_is_cut_at_its_timeout(box, tmp_path):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    t0 = time.monotonic()
    steps = [
        {"tool": "shell", "args": {"command": "sleep 600 & sleep 600", "timeout": 2}},
        {"tool": "shell", "args": {"command": "echo after"}},
    ]
    out = asyncio.run(ReplayAgent({"steps": steps}).run(ctx))
    writer.close(end=out.end.value)
    assert time.monotonic() - t0 < 20
    recorded = _steps(tmp_path)
    assert recorded[0]["timed_out"] is True and recorded[0]["ok"] is False
    assert recorded[1]["stdout"] == "after\n"


def test_a_flood_of_output_is_capped_and_stored_beside_the_trajectory(box, tmp_path):  # noqa: F811
    limit = 256 * 1024
    ctx, writer = make_ctx(box, tmp_path, output_limit=limit)
    out = asyncio.run(ReplayAgent({"steps": [{"tool": "shell", "args": {"command": "yes flood | head -c 20000000; yes err | head -c 400000 >&2"}}]}).run(ctx))
    writer.close(end=out.end.value)
    step = _steps(tmp_path)[0]
    assert step["truncated"] is True and step["exit_code"] == 0
    full = (tmp_path / step["files"]["stdout"]["path"]).read_text()
    assert full.startswith("flood\nflood\n") and full.endswith(TRUNCATION_MARKER.format(limit=limit))
    assert len(full.encode()) == limit + len(TRUNCATION_MARKER.format(limit=limit).encode())
    assert "stderr" in step["files"]
    assert (tmp_path / "trajectory.json").stat().st_size < 64 * 1024
