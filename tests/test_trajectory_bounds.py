"""Every call is a step of the record: values no serializer takes, a recorder that
fails, a call whose exec raised."""

from __future__ import annotations

import asyncio
import json

import pytest

from ale.agents.trajectory import MAX_DEPTH, TrajectoryWriter, load_trajectory
from ale.sandbox.base import SandboxGone
from ale.sandbox.tools import ToolBox


class _Gone:
    name, id = "gone", "gone"

    async def exec(self, *a, **kw):
        raise SandboxGone("container gone is gone")


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_deep_large_and_unprintable_values_are_kept_as_files_or_marked(tmp_path):
    w = TrajectoryWriter(tmp_path, "r", "replay", inline_limit=1000)
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    w.record({"tool": "shell", "args": {"command": "ls", "deep": deep, "big": list(range(5000)),
                                        "odd": _Unprintable()}, "ok": True, "started_at": "t", "ended_at": "t"})
    w.close(end="finished")
    step = load_trajectory(tmp_path / "trajectory.json").steps[0]
    assert set(step.files) == {"args.deep", "args.big"}
    assert step.files["args.deep"].kind == "json" and f"deeper than {MAX_DEPTH}" in step.args["deep"]
    assert json.loads((tmp_path / step.files["args.big"].path).read_text()) == list(range(5000))
    assert step.args["odd"] == "<unprintable _Unprintable>"
    assert len((tmp_path / "trajectory.jsonl").read_text().splitlines()) == 1


def test_a_step_that_cannot_be_kept_whole_is_kept_with_its_outcome(tmp_path):
    w = TrajectoryWriter(tmp_path, "r", "replay")
    w.record({"index": 1, "tool": "shell", "args": {"command": "ls"}, "ok": True, "exit_code": 0,
              "started_at": "t", "ended_at": "t", "seconds": -5})  # invalid: seconds < 0
    step = w.steps[0]
    assert step.index == 1 and step.ok and step.exit_code == 0 and "recorder_error" in step.extra


def test_a_call_whose_exec_raised_is_recorded_then_raises(tmp_path):
    w = TrajectoryWriter(tmp_path, "r", "replay")
    tools = ToolBox(_Gone(), workdir="/workspace", recorder=w)  # type: ignore[arg-type]
    with pytest.raises(SandboxGone):
        asyncio.run(tools.call("shell", {"command": "true"}))
    assert len(w.steps) == 1 and "SandboxGone" in (w.steps[0].error or "") and not w.steps[0].ok


def test_a_recorder_that_raises_never_fails_the_call(tmp_path):
    def broken(step):
        raise OSError("disk full")

    tools = ToolBox(_Gone(), workdir="/workspace", recorder=broken)  # type: ignore[arg-type]
    out = asyncio.run(tools.call("nope", {}))
    assert not out.ok and tools.steps == 1
