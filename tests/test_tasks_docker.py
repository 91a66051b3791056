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
