"""The example tasks' oracles inside a real sealed container (the tools image).

solve() goes through the agent's tool box into the container (python3 + numpy of
the image, `wc`, file tools as uid 1000); evaluate() then grades the workspace
on the host. This shows the committed references agree with what the image
computes, not only with the host's numpy.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from ale.sandbox.base import Mount, SandboxSpec
from ale.sandbox.docker import DockerSandbox, remove_containers
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.session import ContainerSession
from ale.sandbox.tools import ToolBox
from ale.tasks.loader import call_task_fn
from tests.conftest import TOOLS_IMAGE, our_containers
from tests.test_tasks_examples import ALL, Run

pytestmark = pytest.mark.docker


@pytest.mark.parametrize(("defn", "v"), ALL)
def test_oracle_in_the_tools_image_scores_one(docker_client, tmp_path, label, defn, v):
    run = Run(tmp_path, defn, v)
    run.start()
    os.chown(run.workspace, 1000, 1000)
    labels = {"ale.run_id": label, "ale.test": "tasks"}
    sb = DockerSandbox.create(
        docker_client, SandboxSpec(name=f"ale-{label}",
        image=TOOLS_IMAGE,
        policy=IsolationPolicy(memory_bytes=512 * 1024**2, cpus=1.0),
        mounts=[
            Mount(str(run.input), v.input_dir, True),
            Mount(str(run.workspace), v.output_dir, False),
        ],
        labels=labels,
        workdir=v.output_dir))
    try:

        async def go() -> None:
            await sb.start()
            session = ContainerSession(ToolBox(sb, workdir=v.output_dir, default_timeout=120))
            await call_task_fn(defn.solve_fn, v.cfg, session)
            assert await sb.kill_user_processes() == 0

        asyncio.run(go())
    finally:
        remove_containers(docker_client, run_id=label)
    assert our_containers(docker_client, **{"ale.run_id": label}) == []
    scores = run.evaluate()
    assert scores and all(s == 1.0 for s in scores), scores


def test_a_tasks_command_runs_with_bash_as_on_ales_vm(docker_client, tmp_path, label):
    """ALE's driver runs a task's command as `bash cmd.sh`: `[[ ]]`, brace expansion
    and a literal backslash in echo behave as there, not as dash would have them."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    sb = DockerSandbox.create(docker_client, SandboxSpec(
        name=f"ale-{label}", image=TOOLS_IMAGE, policy=IsolationPolicy(memory_bytes=512 * 1024**2, cpus=1.0),
        mounts=[Mount(str(tmp_path), "/input", True), Mount(str(ws), "/workspace", False)],
        labels={"ale.run_id": label, "ale.test": "tasks"}, workdir="/workspace"))
    try:

        async def go():
            await sb.start()
            session = ContainerSession(ToolBox(sb, workdir="/workspace", default_timeout=60))
            a = await session.run_command("[[ -d /workspace ]] && echo {1..3} && echo 'x\\ny'")
            b = await session.run_command("exit 3")
            c = await session.run_command("echo \"$0\" '$HOME' \"it's\"")
            return a, b, c

        a, b, c = asyncio.run(go())
    finally:
        remove_containers(docker_client, run_id=label)
    assert a["return_code"] == 0 and a["stdout"] == "1 2 3\nx\\ny\n", a
    assert b["return_code"] == 3
    assert c["stdout"] == "bash $HOME it's\n", c
