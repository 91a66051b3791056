"""GRADE: the reference staged on the trusted side, evaluate() in the task process, retried as the plan says."""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

from ale import lossless
from ale.data.hashing import restore_runnable
from ale.grading.grader import Grader, GradingEnvironmentError, GradingError, GradingInputs
from ale.layout import Evidence
from ale.record import evidence as ev
from ale.runs import start_writes
from ale.runs.state import RunState, now
from ale.runs.steps.outcome import engine_down
from ale.tasks.errors import TaskError
from ale.tasks.process import TaskCallFailed, TaskProcess, TaskProcessError, judge_env


async def stage_reference(state: RunState) -> None:
    """Trusted side, candidate container gone: source reference + start()'s writes."""
    dest = state.folder.reference_host
    if state.live.source is not None:
        await asyncio.to_thread(state.live.source.stage_reference, state.variant.data_key, dest,
                                state.record.commitment)
    else:
        dest.mkdir(mode=0o700)
    setup_tree = await asyncio.to_thread(ev.hash_tree, state.folder.setup_reference_host)
    committed = state.record.reference_commit or {}
    if setup_tree["digest"] != (committed.get("setup_written") or {}).get("digest"):
        raise GradingError("reference written by start() changed after it was committed")
    for rel in setup_tree["files"]:
        target = dest / rel
        if target.exists():
            raise GradingError(f"start() wrote {rel} into the reference, which the data source also holds")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(state.folder.setup_reference_host / rel, target)
    # The grading container reads it as the candidate uid: readable, on the trusted side
    # only; what is meant to run (execute bits, #!, ELF) stays runnable on its read-only mount.
    restore_runnable(dest)
    staged_tree = await asyncio.to_thread(ev.hash_tree, dest)  # off the loop: a reference may be large
    # start()'s reference writes, kept in the run folder (the candidate's turn is over) for a regrade
    kept = await asyncio.to_thread(start_writes.keep_reference, state.folder.run_dir, state.folder.setup_reference_host,
                                   setup_tree) if state.record.public_before_start is not None else None
    state.record.store.write_json(
        Evidence.REFERENCE_CHECK,
        {
            "source_sha256": None if state.record.commitment is None else state.record.commitment.sha256,
            "setup_written_digest": setup_tree["digest"],
            **({"kept": kept} if kept is not None else {}),
            "staged_tree": staged_tree,
            "unpacked_at": now().isoformat(),
        },
    )
    state.record.events.append("reference.staged")


async def grade(state: RunState, process: TaskProcess, *, attempt: int = 1) -> list[float]:
    plan, v = state.plan, state.variant
    state.live.grader = Grader(
        state.prep.provider,
        image=state.grading_image,
        policy=plan.policy,
        run_id=plan.run_id,
        experiment=plan.experiment,
        inputs=GradingInputs(
            input_host=state.folder.input_host.resolve(),
            deliverables_host=state.folder.deliverables.resolve(),
            reference_host=state.folder.reference_host.resolve(),
            input_dir=v.input_dir,
            output_dir=v.output_dir,
            reference_dir=v.reference_dir,
            software_host=None if state.folder.software_host is None else state.folder.software_host.resolve(),
            software_dir=f"{v.public_root}/software" if state.folder.software_host is not None else None,
            task_dir=v.task_dir,
            scratch_host=state.folder.grading_scratch_for(attempt),
        ),
        command_timeout=plan.limits.grading_timeout_s,  # ALE graders run commands for up to about an hour
        gui=state.extension.grading_gui(state),
    )
    try:
        timeout, env = plan.limits.grading_timeout_s, judge_env(names=plan.judge_env)

        async def evaluate(session: Any) -> Any:
            return await process.call("evaluate", v.index, session, timeout=timeout, env=env)

        return await state.live.grader.grade(evaluate)
    finally:
        await state.live.grader.close()
        _warn_copy_problems(state, state.live.grader.copy_problems, attempt)


def _warn_copy_problems(state: RunState, problems: list[str], attempt: int) -> None:
    """The grader's working copy left entries out (the harness's copy failed, never
    the candidate's work): graded without them, recorded and warned about."""
    if not problems:
        return
    state.record.events.append("grading.copy_incomplete", attempt=attempt, problems=problems[:50], count=len(problems))
    state.record.warnings.append(
        f"grading: the grader's working copy left out {len(problems)} "
        f"entr{'y' if len(problems) == 1 else 'ies'} of the deliverables (the harness's copy, not the candidate's: "
        f"graded without them), first: {problems[0]}")


async def grade_step(state: RunState) -> None:
    try:
        await stage_reference(state)
    except GradingError as e:  # start()'s reference changed: not the candidate's doing
        raise GradingEnvironmentError(str(e), e.traceback) from e
    state.record.scores = await grade_with_retries(state)


async def grade_with_retries(state: RunState) -> list[float]:
    """evaluate() on the same signed deliverables and the same reference, up to
    ``limits.grading_attempts`` times (each retry with a fresh task process and a
    fresh grading sandbox, after a backoff). A failure the harness can show is its
    own (the grading sandbox, the engine) ends it at once, retryable; a failure that
    repeats on every attempt is charged to the candidate."""
    lim = state.plan.limits
    attempts: list[dict[str, Any]] = []
    try:
        for n in range(1, lim.grading_attempts + 1):
            # A desktop task's grader reads the live window through what start() kept in
            # its process (window ids): it is tried again in that process while it lives.
            keep = n == 1 or (state.prep.desktop is not None and state.prep.process.alive)
            process = state.prep.process if keep else await _fresh_task_process(state)
            started = now()
            try:
                scores = await grade(state, process, attempt=n)
                attempts.append({"attempt": n, "started_at": started.isoformat(), "ended_at": now().isoformat(),
                                 "scores": scores})
                return scores
            except GradingError as e:
                attempts.append({"attempt": n, "started_at": started.isoformat(), "ended_at": now().isoformat(),
                                 "error": lossless.display(str(e))[:4000],
                                 "traceback": None if e.traceback is None else lossless.display(e.traceback)[-4000:],
                                 "harness_failure": isinstance(e, GradingEnvironmentError)})
                if isinstance(e, GradingEnvironmentError):
                    raise
                state.record.events.append("grading.failed", attempt=n, error=lossless.display(str(e))[:500])
                if engine_down(state):
                    raise GradingEnvironmentError(f"the engine stopped answering while grading: {e}",
                                                  e.traceback) from e
                if n == lim.grading_attempts:
                    raise GradingError(f"evaluate() failed on all {n} attempts on the same deliverables; last: {e}",
                                       e.traceback, charged=True) from e
                await asyncio.sleep(lim.grading_backoff_s * 2 ** (n - 1))
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        state.record.store.write_json(Evidence.GRADING_ATTEMPTS, attempts)


async def _fresh_task_process(state: RunState) -> TaskProcess:
    """A new task process for a grading retry (its load() run again); the old one is
    closed, so a grader that left it broken cannot break the next attempt."""
    old = state.live.task_process or state.prep.process
    await old.close()
    process = old.fresh()
    state.live.task_process = process
    try:
        await process.start()
    except (TaskProcessError, TaskCallFailed, TaskError) as e:
        raise GradingError(f"the task process for a grading retry did not start: {e}") from e
    return process


async def scores_of(state: RunState) -> None:
    state.record.scores = await grade_with_retries(state)
