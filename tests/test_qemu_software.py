"""A task's declared software in a VM: the environment image a container run would
start from, made a VM guest of its own (``build_vm_image(root_image=...)``), booted
under ``--provider qemu``.

The same task tree as ``test_software_runs`` (pandas and jq on its card, tomli in its
variant's ``input/runtime_env/``, a grader that runs ``uv run --with pandas``): a
replay agent uses that software inside the sealed VM, offline, then answers; the run
scores 1.0, nop 0 (graded in a fresh VM of the same guest), both verify, and the
evidence ties the guest's base disk to the environment image it was made of."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.policy import MIB, IsolationPolicy
from ale.sandbox.qemu.provider import QemuProvider
from ale.status import RunStatus
from tests.qemu_support import qemu_processes, use_built_guest
from tests.test_software_runs import STEPS, tree  # noqa: F401  (the task tree, a module fixture)

pytestmark = pytest.mark.docker


@pytest.fixture
def guest(monkeypatch) -> None:
    use_built_guest(monkeypatch)


def _run(task: Path, tmp_path: Path, agent: str) -> tuple[RunPlan, object]:
    plan = RunPlan(run_id=f"qs-{agent}-{uuid.uuid4().hex[:8]}", task_dir=str(task), provider="qemu",
                   agent=AgentSpec(name=agent, config={"steps": STEPS} if agent == "replay" else {}),
                   policy=IsolationPolicy(memory_bytes=1024 * MIB), runs_dir=str(tmp_path))
    return plan, asyncio.run(execute_run(plan, provider=QemuProvider()))


def test_the_declared_software_is_in_the_vm_and_a_replay_uses_it(tree, tmp_path, guest) -> None:  # noqa: F811
    plan, result = _run(tree, tmp_path, "replay")
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.status, result.error, result.violations)
    steps = json.loads((plan.run_dir / "trajectory.json").read_text())["steps"]
    outs = [s["stdout"] + s["stderr"] for s in steps]
    assert all(s["exit_code"] == 0 for s in steps), outs
    assert outs[0].strip()[0].isdigit()  # pandas imported inside the VM
    assert outs[1].startswith("jq-") and "already satisfied" in outs[2] and "tomli tomli" in outs[3]
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
    assert {c["id"] for c in report.checks if c.get("area") == "environment"} == {"environment.image", "environment.record"}
    env = json.loads((plan.run_dir / "evidence" / "environment.json").read_text())
    assert env["kind"] == "environment image" and env["image"].startswith("ale-vm:"), env["image"]
    assert env["root_image"].startswith("ale-env:") and env["root_image_id"].startswith("sha256:")
    assert env["image_id"] == f"sha256:{env['vm_guest']['base_sha256']}"
    assert env["missing"] == []
    assert not [c for c in qemu_processes() if plan.run_id in c]  # its VMs (the candidate's, the grader's) are gone


def test_nop_scores_zero_in_the_same_guest(tree, tmp_path, guest) -> None:  # noqa: F811
    plan, result = _run(tree, tmp_path, "nop")
    assert result.status is RunStatus.SCORED and result.score == 0.0, (result.status, result.error)
    assert verify_run_dir(plan.run_dir).valid
    env = json.loads((plan.run_dir / "evidence" / "environment.json").read_text())
    assert env["image"].startswith("ale-vm:") and env.get("cached") is not False


def test_an_operators_own_guest_runs_as_given(tmp_path, guest) -> None:
    """A guest folder the operator names (not ale's default) gets nothing added: the run
    records it as given and warns that the declared software is whatever it holds."""
    from ale.sandbox.qemu.image import resolve_vm_image

    folder = str(resolve_vm_image("ale-vm:latest").folder)
    task = Path(__file__).parent.parent / "examples" / "tasks" / "files" / "word_count"
    plan = RunPlan(run_id=f"qs-own-{uuid.uuid4().hex[:8]}", task_dir=str(task), provider="qemu", image=folder,
                   agent=AgentSpec(name="oracle"), runs_dir=str(tmp_path))
    result = asyncio.run(execute_run(plan, provider=QemuProvider()))
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.status, result.error)
    env = json.loads((plan.run_dir / "evidence" / "environment.json").read_text())
    assert env["kind"] == "as given" and env["image"] == folder
