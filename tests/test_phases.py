"""The phase table (ale.phases): one declaration the lifecycle executes and ale verify
reads. Units over the table; then a real desktop run (live_grading shape) and a real
standard run, each verified from its folder alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ale import layout
from ale.layout import Evidence, evidence_path
from ale.phases import (
    GROUP_EVIDENCE,
    PHASES,
    VM_GROUP_EVIDENCE,
    CheckGroup,
    Phase,
    RunShape,
    moment_order,
    phase_evidence,
    phase_table,
    required_evidence,
    spec_of,
)
from ale.plan import AgentSpec, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs import lifecycle
from ale.status import RunStatus

ROOT = Path(__file__).resolve().parent.parent


def test_every_shape_runs_every_phase_in_the_enum_order() -> None:
    for shape in RunShape:
        assert [s.phase for s in phase_table(shape)] == list(Phase)


def test_the_lifecycle_has_one_step_per_phase() -> None:
    assert set(lifecycle.STEPS) == set(Phase)


def test_the_sandbox_is_released_once_before_the_reference_in_a_standard_run() -> None:
    table = phase_table(RunShape.STANDARD)
    released = [s.phase for s in table if s.releases_sandbox]
    assert released == [Phase.STOP]
    assert evidence_path(Evidence.INSPECT_AFTER) in spec_of(Phase.STOP).writes
    assert moment_order(RunShape.STANDARD).index("container finished") < moment_order(RunShape.STANDARD).index("reference unpacked")


def test_a_live_grading_run_keeps_the_sandbox_through_grading_but_kills_the_candidate_first() -> None:
    table = phase_table(RunShape.LIVE_GRADING)
    assert [s.phase for s in table if s.releases_sandbox] == [Phase.GRADE]
    grade = spec_of(Phase.GRADE, RunShape.LIVE_GRADING)
    assert evidence_path(Evidence.INSPECT_AFTER) in grade.writes and CheckGroup.INSPECT_AFTER in grade.checks
    order = moment_order(RunShape.LIVE_GRADING)
    assert order.index("candidate processes killed") < order.index("reference unpacked") < order.index("container finished")


def test_gates_follow_the_checks_that_can_void_the_run() -> None:
    for shape in RunShape:
        gates = [s.phase for s in phase_table(shape) if s.gate]
        assert gates == [Phase.VERIFY_BEFORE, Phase.DELIVERABLES]


def test_required_evidence_grows_with_the_phases_reached() -> None:
    none = set(required_evidence(RunShape.STANDARD, set(), graded=False))
    agent = set(required_evidence(RunShape.STANDARD, {Phase.STAGE_INPUT, Phase.PROVISION, Phase.AGENT}, graded=False))
    graded = set(required_evidence(RunShape.STANDARD, set(), graded=True))
    assert none < agent < graded
    assert evidence_path(Evidence.AGENT) in agent and evidence_path(Evidence.probes("after")) not in agent
    assert evidence_path(Evidence.REFERENCE_CHECK) in graded and layout.DELIVERABLES in graded
    # input-staged.json is recorded, never required (folders of ale 0.1 lack it)
    assert evidence_path(Evidence.INPUT_STAGED) in phase_evidence() and evidence_path(Evidence.INPUT_STAGED) not in graded


def test_check_groups_with_evidence_are_recorded_by_some_phase() -> None:
    for shape, table in PHASES.items():
        recorded = {g for s in table for g in s.checks}
        # a VM run records the VM's groups in place of the container's, never both
        want, other = (VM_GROUP_EVIDENCE, GROUP_EVIDENCE) if shape is RunShape.VM else (GROUP_EVIDENCE, VM_GROUP_EVIDENCE)
        assert set(want) <= recorded and not set(other) & recorded, shape


def _plan(task: Path, runs: Path, agent: str = "oracle") -> RunPlan:
    from tests.conftest import TOOLS_IMAGE

    return RunPlan(run_id=f"{task.name}-{agent}", task_dir=str(task), agent=AgentSpec(name=agent), image=TOOLS_IMAGE,
                   runs_dir=str(runs))


@pytest.mark.docker
def test_a_desktop_run_verifies(docker_client, tmp_path) -> None:
    """A GUI grader reads the live window: the sandbox outlives the reference's
    staging. ale verify reads that shape from the run and accepts it."""
    from ale.sandbox.docker import DockerProvider
    from tests.test_desktop import _desktop_image

    _desktop_image(docker_client)
    plan = _plan(ROOT / "examples" / "tasks" / "gui" / "click_button", tmp_path)
    result = asyncio.run(lifecycle.execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.error, result.violations)
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
    order = [c for c in report.checks if c["id"] == "times.order"]
    assert any("reference unpacked < container finished" in str(c["expected"]) for c in order), order
    harness = (plan.run_dir / "evidence" / "harness.json").read_text()
    assert '"run_shape": "live_grading"' in harness


@pytest.mark.docker
def test_a_standard_run_verifies_with_its_shape(docker_client, tmp_path) -> None:
    from ale.sandbox.docker import DockerProvider

    plan = _plan(ROOT / "examples" / "tasks" / "files" / "word_count", tmp_path)
    result = asyncio.run(lifecycle.execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.SCORED, result.error
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
    assert any("container finished < reference unpacked" in str(c["expected"]) for c in report.checks)
    names = [p.name for p in result.phases]
    assert names == [str(p) for p in Phase]
