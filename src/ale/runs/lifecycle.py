"""The run engine's one driver: the phase table of ``ale.phases``, executed.

``drive`` runs the steps of a run-like thing's kind (``RunKind``: a run, a grading
probe, a regrade) in the order ``ale.phases.kind_steps`` gives; a run's are its
shape's phase table. Each step lives in ``ale.runs.steps`` and does its one job; a
phase that finds the seal broken adds violations, and a gating phase ends the run
there (``invalid_evaluation_environment``, no score). Every kind shares one
preflight (``prepare``), one directory set-up (``make_dirs``), one classifier
(``classify_failure``: where a step's exception becomes a status) and one cleanup
(``cleanup``: sandboxes removed, scratch mounts and the shared package's lock
released on every path out, cancellation (Ctrl-C) included). ``execute_run`` is the
run's kind with its finisher (``result.json``, the signed manifest).

The run's state (``ale.runs.state``) is three things: what is fixed at its start (``Prepared``, the
``RunFolder`` whose properties are its paths), the record being written
(``RunRecord``), and the live handles (``LiveHandles``). A desktop task's run is
the same table in its ``live_grading`` shape, with the desktop's hooks
(``DesktopExtension``) called at the points the table names.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import ale
from ale import layout, lossless
from ale.agents.base import AgentEnd
from ale.agents.gateway.resume import prepare_resume, resumed_result
from ale.layout import Evidence
from ale.phases import WHEN_START, KindStep, Phase, kind_steps
from ale.plan import RunPlan
from ale.record import evidence as ev
from ale.record.signing import load_or_create_signing_key
from ale.result import RunResult
from ale.runs.state import Prepared, RunFolder, RunState, now
from ale.runs.steps.agent import agent_step
from ale.runs.steps.cleanup import cleanup, release_package
from ale.runs.steps.deliverables import collect_deliverables, deliverables_step
from ale.runs.steps.folder import make_dirs, new_state
from ale.runs.steps.grade import grade_step, scores_of, stage_reference
from ale.runs.steps.outcome import SealBroken, classify_failure, status_after_agent
from ale.runs.steps.preflight import PreflightError, check_card, prepare, task_environment
from ale.runs.steps.provide_software import provide_software
from ale.runs.steps.provision import provision_step
from ale.runs.steps.stage_input import stage_input
from ale.runs.steps.stop import release_sandbox, stop_step
from ale.runs.steps.task_start import start_in_grading_sandbox, task_start_step
from ale.runs.steps.verify_before import commit_reference, hash_input, verify_before_step
from ale.sandbox.base import SandboxError, SandboxProvider
from ale.sandbox.host_kernel import core_pattern_warning
from ale.status import FAILURE_OWNER, FailureOwner, InvalidAttribution, RunStatus

__all__ = [
    "LIBRARY",
    "PreflightError",
    "STEPS",
    "Step",
    "check_card",
    "classify_failure",
    "cleanup",
    "drive",
    "execute_run",
    "make_dirs",
    "new_state",
    "prepare",
    "release_package",
    "status_after_agent",
    "task_environment",
]


Step = Callable[[RunState], Awaitable[None]]


STEPS: dict[Phase, Step] = {
    Phase.STAGE_INPUT: stage_input,
    Phase.PROVISION: provision_step,
    Phase.TASK_START: task_start_step,
    Phase.VERIFY_BEFORE: verify_before_step,
    Phase.AGENT: agent_step,
    Phase.STOP: stop_step,
    Phase.DELIVERABLES: deliverables_step,
    Phase.GRADE: grade_step,
}


# The library every kind's steps are named from (``ale.phases.kind_steps``).
LIBRARY: dict[str, Step] = {
    **{phase.value: step for phase, step in STEPS.items()},
    "provide_software": provide_software,
    "start_in_grading_sandbox": start_in_grading_sandbox,
    "hash_input": hash_input,
    "commit_reference": commit_reference,
    "collect_deliverables": collect_deliverables,
    "stage_reference": stage_reference,
    "grade_with_retries": scores_of,
}


def _wanted(state: RunState, row: KindStep) -> bool:
    if row.when == WHEN_START:
        return state.prep.task.has("start") and not state.live.start_kept
    return True


async def drive(state: RunState, own: dict[str, Step] | None = None, *, stages: dict[str, float] | None = None) -> None:
    """The one driver: each step of the state's kind in order (``kind_steps``; a
    kind's own steps in ``own``), recorded as its phase where the table names one
    and timed into ``stages``; the candidate's sandbox released where the table puts
    it (also when the step failed: a grader's failure still leaves it stopped and
    inspected); a gate ends the run on any violation. ``state.live.at`` names the
    step a failure came from."""
    library = {**LIBRARY, **(own or {})}
    for row in kind_steps(state.kind, state.prep.shape):
        if not _wanted(state, row):
            continue
        state.live.at = row.step
        t0 = time.monotonic()
        try:
            async with state.record.phase(row.phase) if row.phase is not None else contextlib.nullcontext():
                try:
                    await library[row.step](state)
                except Exception:
                    if row.releases_sandbox:
                        with contextlib.suppress(Exception):  # the step's failure is the one to report
                            await release_sandbox(state)
                    raise
                if row.releases_sandbox:
                    await release_sandbox(state)
        finally:
            if stages is not None:
                stages[row.timed_as] = round(stages.get(row.timed_as, 0.0) + time.monotonic() - t0, 4)
        if row.gate and state.record.violations:
            raise SealBroken()
    state.live.at = None


async def execute_run(
    plan: RunPlan, *, provider: SandboxProvider | None = None, prepared: Prepared | None = None
) -> RunResult:
    """Run one plan to its end and return the result (written last, atomically).

    Raises PreflightError (nothing created) for a bad task, variant, engine or
    image. Every later failure becomes a status; containers are always removed.
    """
    prep: Prepared = prepared if prepared is not None else await prepare(plan, provider)
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=False)
    ev.write_json_new(run_dir / layout.PLAN, json.loads(plan.model_dump_json()))
    prep.process.log_path = run_dir / layout.TASK_LOG
    scratch = layout.scratch_dir(plan.runs_dir, plan.run_id)
    state = new_state(prep, RunFolder(run_dir, scratch, prep.variant), run_dir)
    record = state.record
    started = now()
    status: RunStatus = RunStatus.INFRASTRUCTURE_ERROR
    error: str | None = None
    extra: dict[str, Any] = {}
    record.events.append("run.start", run_id=plan.run_id, plan_digest=plan.digest())
    raised = (prep.agent.sandbox_limits or {}).get("raised")
    if raised:  # the agent's needs raised the planned policy's limits (evidence/policy.json is what ran)
        record.events.append("policy.raised", by=prep.agent.name, raised=raised)
    with record.cost("evidence"):
        _record_static_evidence(state)
    try:
        make_dirs(state)
        if plan.resume_from:  # the source run's gateway record, copied in: its turns are replayed
            info = prepare_resume(run_dir, Path(plan.resume_from))
            record.events.append("run.resume", **{k: v for k, v in info.items() if k != "source_usage"})
        await drive(state)
        status = status_after_agent(state.live.agent_outcome)
        if state.live.agent_outcome and state.live.agent_outcome.end is not AgentEnd.FINISHED:
            error = state.live.agent_outcome.detail
    except Exception as e:
        status, error, more = classify_failure(e, state)
        record.scores = None
        extra.update(more)
    finally:
        await cleanup(state)
    result = _run_result(state, status, error, extra, started)
    _finish_record(state, result)
    return result


def _run_result(state: RunState, status: RunStatus, error: str | None, extra: dict[str, Any],
                started: datetime) -> RunResult:
    """The run kind's finisher: its result, from what its steps recorded and how it ended."""
    plan, prep, record, run_dir = state.plan, state.prep, state.record, state.folder.run_dir
    scores = record.scores
    if status is RunStatus.INFRASTRUCTURE_ERROR:  # the model's provider failed: no score is the agent's
        scores = None
    attribution = state.record.invalid_attribution if status is RunStatus.GRADING_FAILED else None
    if state.record.violations:
        status, scores = RunStatus.INVALID_EVALUATION_ENVIRONMENT, None
        attribution = state.record.invalid_attribution or (
            InvalidAttribution.AFTER_AGENT_START if state.live.agent_started else InvalidAttribution.BEFORE_AGENT)
    outcome = state.live.agent_outcome
    if outcome and outcome.usage:
        extra["usage"] = outcome.usage
    gw_summary = state.live.gateway or {}
    if "billing" in gw_summary:  # the run's cost, per model, as its gateway record derives it
        extra["billing"] = gw_summary["billing"]
        named = Counter(f["failure"] for f in gw_summary.get("failures") or [])
        if named or gw_summary.get("retries"):
            extra["model_failures"] = {**dict(sorted(named.items())), "retries": gw_summary.get("retries", 0)}
    model_failure = outcome.model_failure if outcome is not None else None
    if model_failure is not None and FAILURE_OWNER[model_failure] is FailureOwner.OPERATOR:
        extra["retryable"] = False  # the key, the quota or the model name: another attempt cannot change it
    resumed = resumed_result(gw_summary["resumed"], run_dir) if isinstance(gw_summary.get("resumed"), dict) else None
    if prep.agent.mode is not None:  # a named harness: native or bridge, never mixed up
        extra["agent_mode"] = prep.agent.mode
    extra["costs"] = {k: round(v, 4) for k, v in state.record.costs.items()}
    if state.record.environment is not None:
        extra["environment"] = state.record.environment
    if state.record.warnings:
        extra["warnings"] = list(state.record.warnings)
    return RunResult(
        run_id=plan.run_id,
        task_id=prep.variant.task_id,
        task_dir=str(prep.task.path),
        variant=prep.variant.index,
        agent=plan.agent.display,
        status=status,
        scores=scores,
        score=(sum(scores) / len(scores)) if scores else None,
        error=None if error is None else lossless.display(error),  # an agent may put any text in its end
        violations=state.record.violations,
        invalid_attribution=attribution,
        phases=state.record.phases,
        started_at=started,
        ended_at=now(),
        harness_version=ale.__version__,
        experiment=plan.experiment,
        attempt=plan.attempt,
        model_failure=model_failure,
        agent_limit=outcome.limit if outcome is not None and status is RunStatus.TIMEOUT else None,
        resumed=resumed,
        extra=extra,
    )


def _record_static_evidence(state: RunState) -> None:
    plan = state.plan
    state.record.store.write_json(Evidence.POLICY, json.loads(plan.policy.model_dump_json()))
    state.record.store.write_json(Evidence.TASK_PROCESS, state.prep.process.evidence())
    state.record.store.write_json(
        Evidence.HARNESS,
        {
            "ale_version": ale.__version__,
            "python": platform.python_version(),
            "task_dir": str(state.prep.task.path),
            "task_code_sha256": state.prep.task.code_hash,
            "plan_sha256": plan.digest(),
            "run_shape": str(state.prep.shape),  # ale verify reads the phase table of this shape
        },
    )
    try:
        engine = state.prep.provider.engine_record()
        state.record.store.write_json(Evidence.ENGINE, engine)
        pipe = core_pattern_warning(engine)
        if pipe:
            state.record.warnings.append(pipe)
            state.record.events.append("engine.core_pattern_pipe", core_pattern=engine.get("core_pattern"))
    except SandboxError as e:
        state.record.store.write_json(Evidence.ENGINE, {"error": str(e)})


def _finish_record(state: RunState, result: RunResult) -> None:
    if state.record.workspace_at_creation is not None \
            and not state.record.store.path(Evidence.WORKSPACE_EMPTY).exists():
        # The run stopped before the agent's start: keep the creation proof alone.
        state.record.store.write_json(Evidence.WORKSPACE_EMPTY, {"at_creation": state.record.workspace_at_creation})
    if state.record.screens:
        state.record.store.write_json(Evidence.SCREENS, state.record.screens)
    state.record.store.write_json(Evidence.CHECKS, state.record.checks)
    state.record.store.write_json(Evidence.PHASES, [p.model_dump(mode="json") for p in state.record.phases])
    state.record.events.append("run.end", status=result.status.value, score=result.score)
    tmp = state.folder.run_dir / layout.RESULT_TMP
    tmp.write_text(result.model_dump_json(indent=2))
    os.replace(tmp, state.folder.run_dir / layout.RESULT)
    # Nothing may be written into the run folder after this: the manifest covers it all.
    key = load_or_create_signing_key(Path(state.plan.signing_key) if state.plan.signing_key else None)
    ev.write_manifest_and_sign(state.folder.run_dir, key)
