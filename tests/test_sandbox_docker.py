"""The docker provider against the conformance suite, on a real sealed container."""

from __future__ import annotations

import asyncio
import os

import pytest

from ale.sandbox.base import Mount, SandboxSpec
from ale.sandbox.docker import DockerSandbox, remove_containers
from ale.sandbox.policy import IsolationPolicy
from tests.conftest import TOOLS_IMAGE, our_containers
from tests.sandbox_conformance import run_conformance

pytestmark = pytest.mark.docker


@pytest.fixture
def sandbox(docker_client, tmp_path, label):
    inp = tmp_path / "input"
    ws = tmp_path / "workspace"
    inp.mkdir()
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    (inp / "data.txt").write_text("hello\n")
    sb = DockerSandbox.create(
        docker_client, SandboxSpec(name=f"ale-{label}",
        image=TOOLS_IMAGE,
        policy=IsolationPolicy(memory_bytes=512 * 1024**2),
        mounts=[Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)],
        labels={"ale.run_id": label},
        workdir="/workspace"))
    asyncio.run(sb.start())
    yield sb
    remove_containers(docker_client, run_id=label)
    assert our_containers(docker_client, **{"ale.run_id": label}) == []


def test_docker_provider_conformance(sandbox):
    asyncio.run(run_conformance(sandbox))


def test_input_is_read_only_and_workspace_writable(sandbox):
    async def go():
        r = await sandbox.exec(["sh", "-c", "echo x > /input/new"])
        assert r.exit_code != 0
        r = await sandbox.exec(["sh", "-c", "echo x > /workspace/new && cat /workspace/new"])
        assert r.stdout == b"x\n"

    asyncio.run(go())


def test_create_with_missing_image_is_a_clear_error(docker_client, tmp_path, label):
    from ale.sandbox.base import SandboxError

    with pytest.raises(SandboxError, match="ale image build"):
        DockerSandbox.create(
            docker_client, SandboxSpec(name=f"ale-{label}",
            image="ale-no-such-image:nope",
            policy=IsolationPolicy(),
            mounts=[Mount(str(tmp_path), "/input", True)],
            labels={"ale.run_id": label},
            workdir="/workspace"))
    assert our_containers(docker_client, **{"ale.run_id": label}) == []
