"""`ale verify` on the folder of a real run (Docker): it verifies where it was made
and as a copy elsewhere, and a change to it is named."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path

import pytest

from ale.record.signing import public_key_pem
from ale.record.verify import verify_run_dir
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import IsolationPolicy
from tests.conftest import EXAMPLES, TOOLS_IMAGE, our_containers

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def real_run(docker_client, tmp_path_factory) -> tuple[Path, Path]:
    from ale.plan import AgentSpec, RunPlan
    from ale.record.signing import load_or_create_signing_key
    from ale.runs.lifecycle import execute_run

    base = tmp_path_factory.mktemp("real-run")
    key_path = base / "operator-key.pem"
    plan = RunPlan(
        run_id=f"evreal-{uuid.uuid4().hex[:10]}",
        task_dir=str(EXAMPLES / "files" / "word_count"),
        agent=AgentSpec(name="oracle"),
        image=TOOLS_IMAGE,
        policy=IsolationPolicy(memory_bytes=512 * 1024**2),
        runs_dir=str(base / "runs"),
        signing_key=str(key_path),
    )
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert our_containers(docker_client, **{"ale.run_id": plan.run_id}) == []
    assert result.status.value == "scored", (result.error, result.violations)
    pub = base / "operator.pub.pem"
    pub.write_bytes(public_key_pem(load_or_create_signing_key(key_path)))
    return plan.run_dir, pub


def test_real_run_verifies_here_and_as_a_copy(real_run, tmp_path: Path) -> None:
    run_dir, pub = real_run
    report = verify_run_dir(run_dir, pub)
    assert report.valid, report.reasons
    phases = {c.get("phase") for c in report.checks}
    assert {"inspect-before", "inspect-after", "probes-before", "probes-after"} <= phases
    copy_dir = tmp_path / "archive" / run_dir.name
    shutil.copytree(run_dir, copy_dir)
    assert verify_run_dir(copy_dir, pub).valid


def test_real_run_tampered_is_named(real_run, tmp_path: Path) -> None:
    run_dir, pub = real_run
    copy_dir = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy_dir)
    p = copy_dir / "evidence" / "inspect-after.json"
    doc = json.loads(p.read_text())
    doc["HostConfig"]["CapAdd"] = ["SYS_ADMIN"]
    p.write_text(json.dumps(doc))
    report = verify_run_dir(copy_dir, pub)
    assert report.exit_code == 1
    text = "\n".join(report.reasons)
    assert "evidence/inspect-after.json changed after signing" in text
    assert "[inspect-after] caps.add_empty" in text
