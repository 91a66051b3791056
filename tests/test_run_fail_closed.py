"""Fail closed: a sandbox that is not proven sealed gets no agent and no score."""

from __future__ import annotations

import asyncio
import io
import json
import textwrap

import pytest

from ale.isolation import rules
from ale.isolation.checks import Check
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider
from ale.status import RunStatus, counts_toward_score
from tests.conftest import EXAMPLES, TOOLS_IMAGE, our_containers
from tests.test_run_e2e import plan_for

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def volume_image(docker_client):
    """A tools image that declares a VOLUME: a real image built wrong in one way."""
    tag = "ale-test-failclosed-volume:latest"
    dockerfile = f"FROM {TOOLS_IMAGE}\nVOLUME /data\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield tag
    docker_client.images.remove(tag, force=True)


def test_image_volume_means_no_agent_and_no_score(volume_image, docker_client, tmp_path):
    plan = plan_for(EXAMPLES / "secrets" / "echo_secret", tmp_path, agent="oracle", image=volume_image)
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT
    assert result.scores is None and result.score is None
    assert any("image.no_volumes" in v for v in result.violations)
    assert not (plan.run_dir / "trajectory.json").exists(), "the agent must never start"
    assert not counts_toward_score(result.status, result.score)
    assert our_containers(docker_client, **{"ale.run_id": plan.run_id}) == []
    # The anonymous volume the engine created with the container is gone too.
    inspect = json.loads((plan.run_dir / "evidence" / "inspect-before.json").read_text())
    vols = [m["Name"] for m in inspect["Mounts"] if m.get("Type") == "volume"]
    assert vols and all(not docker_client.volumes.list(filters={"name": v}) for v in vols)


def test_task_writing_into_the_workspace_makes_the_run_invalid(docker_client, tmp_path):
    task = tmp_path / "t"
    task.mkdir()
    (task / "main.py").write_text(textwrap.dedent('''
        import cua_bench as cb

        @cb.tasks_config
        def load():
            return [cb.Task(description="x", task_id="ws")]

        @cb.setup_task
        async def start(cfg, session):
            await session.write_file("/workspace/planted.txt", "a head start")

        @cb.evaluate_task
        async def evaluate(cfg, session):
            return [1.0]
    '''))
    plan = plan_for(task, tmp_path / "runs", agent="nop")
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT
    assert any("ws.empty_at_start" in v for v in result.violations) and result.score is None


def test_drift_found_after_the_agent_withholds_the_score(docker_client, tmp_path, monkeypatch):
    real = rules.judge

    def drifting(moment, **kw):
        checks = real(moment, **kw)
        if moment == "after" and "inspect" in kw:
            checks.append(Check("test.drift", False, "sealed", "drifted", "injected by the test"))
        return checks

    monkeypatch.setattr(rules, "judge", drifting)
    plan = plan_for(EXAMPLES / "secrets" / "echo_secret", tmp_path, agent="oracle")
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT
    assert result.scores is None and any("test.drift" in v for v in result.violations)
    assert (plan.run_dir / "trajectory.json").exists()  # the agent did run
    assert not (plan.run_dir / "evidence" / "reference-check.json").exists()  # reference never staged
