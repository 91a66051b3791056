"""Shared fixtures for the agent tests: a real sealed container with /input and
/workspace, a ToolBox over it, and a trajectory writer. Imported by the
test_agents_* modules (this module holds no tests of its own)."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from ale.agents.base import AgentContext
from ale.agents.trajectory import TrajectoryWriter
from ale.sandbox.base import SandboxSpec
from ale.sandbox.tools import ToolBox
from tests.conftest import TOOLS_IMAGE

FIXTURES = Path(__file__).parent / "fixtures"
STANDIN = FIXTURES / "standin_harness.py"
NUMBERS = "3 5 8 13 21\n"
ANSWER = "50\n"
TEST_LABEL = "ale.test"
TEST_LABEL_VALUE = "agents"


@dataclass
class Box:
    """A running container for one test module."""

    sandbox: object
    input_dir: Path
    workspace: Path

    def reset_workspace(self) -> None:
        for p in self.workspace.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


@pytest.fixture(scope="module")
def box(tmp_path_factory, docker_client):
    """A sealed container (the run template) with input numbers.txt, removed at the end."""
    import asyncio

    from ale.sandbox.base import Mount
    from ale.sandbox.docker import DockerSandbox
    from ale.sandbox.policy import IsolationPolicy

    root = tmp_path_factory.mktemp("agents-box")
    input_dir, workspace = root / "input", root / "workspace"
    input_dir.mkdir()
    workspace.mkdir()
    (input_dir / "numbers.txt").write_text(NUMBERS)
    os.chmod(input_dir, 0o755)
    os.chmod(workspace, 0o777)
    sandbox = DockerSandbox.create(
        docker_client, SandboxSpec(name=f"ale-test-agents-{uuid.uuid4().hex[:10]}",
        image=TOOLS_IMAGE,
        policy=IsolationPolicy(cpus=1.0, memory_bytes=512 * 1024**2),
        mounts=[Mount(str(input_dir), "/input", True), Mount(str(workspace), "/workspace", False)],
        labels={TEST_LABEL: TEST_LABEL_VALUE},
        workdir="/workspace",
        environment={}))
    try:
        asyncio.run(sandbox.start())
        yield Box(sandbox, input_dir, workspace)
    finally:
        asyncio.run(sandbox.remove())


def make_ctx(box: Box, run_dir: Path, *, allowlist=("shell", "read_file", "write_file", "list_dir"),
             wall_time_s: float = 60.0, max_steps: int | None = None, prompt: str | None = None,
             output_limit: int | None = None) -> tuple[AgentContext, TrajectoryWriter]:
    box.reset_workspace()
    writer = TrajectoryWriter(run_dir, "test-run", "test-agent")
    kwargs = {} if output_limit is None else {"output_limit": output_limit}
    tools = ToolBox(box.sandbox, workdir="/workspace", allowlist=tuple(allowlist), recorder=writer, default_timeout=30, **kwargs)
    ctx = AgentContext(
        prompt=prompt or "Read /input/numbers.txt and write the sum of the numbers to /workspace/answer.txt.",
        tools=tools,
        workdir="/workspace",
        input_dir="/input",
        run_dir=run_dir,
        wall_time_s=wall_time_s,
        max_steps=max_steps,
    )
    return ctx, writer


def standin_command(mode: str = "solve", *extra: str) -> list[str]:
    return [sys.executable, str(STANDIN), "--mcp-config", "{mcp_config}", "--prompt", "{prompt}",
            "--workdir", "{workdir}", "--mode", mode, *extra]
