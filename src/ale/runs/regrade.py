"""`ale regrade RUN_DIR|EXP_DIR`: grade finished runs again from their signed deliverables.

A regrade re-runs the GRADE phase of a finished run, with the task code as it is
now (or the same task in another tree, ``--tasks``), and nothing else. It is a kind
of the one run engine (``RunKind.REGRADE``): the run's preflight, directory set-up,
steps and cleanup, driven by the lifecycle as ``ale.phases.kind_steps`` lists them,
with three steps of its own (the kept start() writes, the two comparisons):

1. the run must verify (``ale verify``), regrades before this one included;
2. the input is staged again from the run's data source (``plan.json``) and what the
   run's ``start()`` wrote is laid over it from the run's signed folder (``start/``,
   ``ale.runs.start_writes``; a folder written before those were kept has ``start()``
   re-run instead: its commands in a grading sandbox, its writes on the host), and
   the public package's digest compared with
   the one the run committed (``evidence/input-after-start.json``); the reference's
   commitment likewise (``evidence/reference-commit.json``). A difference refuses
   the regrade, naming the file: the regrade would not grade what the run graded;
3. the reference is staged and ``evaluate()`` runs as in the run (the lifecycle's
   own ``stage_reference`` and ``grade``), over the run's signed ``deliverables/``;
   a grader that fails on them is retried as in a run (``grade_with_retries``: a fresh
   task process, the plan's ``grading_attempts``) and, when the failure repeats,
   recorded as ``grading_failed`` charged to the candidate (``after_agent_start``),
   as the counting policy says;
4. the regrade is appended to the run's record (``ale.record.regrades``): old and
   new grading, both task-code digests, when, why, the grader's error, the task log,
   signed and chained to the run's signature. The run's own files never change.

Failures that are not the grader's on the deliverables (the engine, the data source,
a task that does not load) refuse the regrade and append nothing.
``latest_grading`` gives the grading reports must use.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import ale
from ale import layout
from ale.agents.base import AgentEnd, AgentOutcome
from ale.grading.grader import GradingError
from ale.layout import Evidence
from ale.phases import RunKind, RunShape
from ale.plan import AgentSpec, RunPlan
from ale.record import evidence as ev
from ale.record import regrades as rg
from ale.record.signing import load_or_create_signing_key
from ale.record.verify import verify_run_dir
from ale.result import RunResult
from ale.runs import lifecycle, start_writes
from ale.runs.state import RunFolder, RunRecord, RunState, now
from ale.runs.store import iter_results, read_result
from ale.sandbox.base import SandboxProvider
from ale.sandbox.scratch import release_scratch
from ale.status import InvalidAttribution, RunStatus

# A run whose candidate's turn ended and whose deliverables were collected: graded,
# or its grading failed. Invalid runs carry no score by design; nothing to regrade.
REGRADABLE = frozenset({RunStatus.SCORED, RunStatus.AGENT_FAILED, RunStatus.TIMEOUT, RunStatus.GRADING_FAILED})


class RegradeRefused(RuntimeError):
    """The run cannot be regraded (it does not verify, its input or reference
    differ from what it committed, it is not a finished run, ...); nothing was written."""


class Grading(NamedTuple):
    """A run's grading as reports must count it: the latest regrade's, else its own."""

    status: RunStatus
    score: float | None
    scores: list[float] | None
    regrade: dict[str, Any] | None  # the latest regrade's record (None: never regraded)


@dataclass
class RegradeOutcome:
    run_dir: Path
    number: int
    old: dict[str, Any]
    new: dict[str, Any]
    task_code_old: str | None
    task_code_new: str
    error: str | None = None


@dataclass
class ExperimentRegrade:
    regraded: list[RegradeOutcome] = field(default_factory=list)
    refused: list[tuple[Path, str]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


# -- what reports read ------------------------------------------------------------
def latest_grading(run_dir: Path) -> Grading:
    """The grading a report counts: the last regrade's ``new`` when the run was
    regraded, else result.json's. Reads the files as they are (``ale verify``
    checks them: verify the run before trusting this)."""
    run_dir = Path(run_dir)
    record = rg.latest_record(run_dir)
    if record is not None and isinstance(record.get("new"), dict):
        new = record["new"]
        scores = new.get("scores")
        return Grading(RunStatus(new["status"]), new.get("score"), list(scores) if scores is not None else None, record)
    result = read_result(run_dir)
    if result is None:
        raise FileNotFoundError(f"{run_dir}: no readable {layout.RESULT}")
    return Grading(result.status, result.score, result.scores, None)


def apply_latest_grading(run_dir: Path, result: RunResult) -> RunResult:
    """``result`` with the latest regrade's grading in place of its own (unchanged
    when the run was never regraded): what an aggregate over runs should read."""
    record = rg.latest_record(run_dir)
    if record is None or not isinstance(record.get("new"), dict):
        return result
    new = record["new"]
    return result.model_copy(update={
        "status": RunStatus(new["status"]),
        "score": new.get("score"),
        "scores": new.get("scores"),
        "error": new.get("error"),
        "invalid_attribution": new.get("invalid_attribution"),
    })


def regrade_summary(run_dir: Path) -> dict[str, Any] | None:
    """What a report says of a regraded run: how often, when, why, with which task
    code, and the run's own grading it replaced (None: never regraded)."""
    record = rg.latest_record(run_dir)
    if record is None:
        return None
    first = rg.read_json(rg.regrade_dir(run_dir, 1) / rg.REGRADE_RECORD)
    task = record.get("task") or {}
    return {
        "regrades": record.get("regrade"),
        "at": record.get("at"),
        "reason": record.get("reason"),
        "task_dir": task.get("dir_new"),
        "task_code_sha256": task.get("code_sha256_new"),
        "original": rg.grading_summary(first.get("old") or {}) if isinstance(first, dict) else None,
    }


# -- regrading ----------------------------------------------------------------------
def map_task(original: str | Path, tree: Path) -> Path:
    """The task of ``original`` (an absolute task folder) in another task tree: the
    longest trailing part of its path found under ``tree`` holding a ``main.py``
    (``tree`` itself when it is that task's folder)."""
    tree = Path(tree).expanduser().resolve()
    parts = Path(original).parts
    for k in range(len(parts) - 1, 0, -1):
        candidate = tree.joinpath(*parts[-k:])
        if (candidate / "main.py").is_file():
            return candidate
    if (tree / "main.py").is_file() and tree.name == Path(original).name:
        return tree
    raise RegradeRefused(f"{tree} holds no task matching {original} (looked for .../{'/'.join(parts[-3:])}/main.py)")


def _read(run_dir: Path, rel: str) -> dict[str, Any]:
    doc = rg.read_json(run_dir / rel)
    return doc if isinstance(doc, dict) else {}


def _agent_status(run_dir: Path, result: RunResult) -> RunStatus:
    """The status the run has once graded: its own, or for a grading failure, what
    the agent's end (``agent.ended`` in events.jsonl) makes it."""
    if result.status is not RunStatus.GRADING_FAILED:
        return result.status
    events, _ = ev.read_chain(run_dir / layout.EVENTS)
    ended = [e for e in events if e.get("type") == "agent.ended"]
    end = (ended[-1].get("data") or {}).get("end") if ended else None
    try:
        return lifecycle.status_after_agent(AgentOutcome(AgentEnd(str(end))))
    except ValueError as e:
        raise RegradeRefused(f"{run_dir}: the event log records no agent end to grade after ({e})") from e


def _check_regradable(run_dir: Path, public_key: Path | None,
                      trusted: dict[str, bytes] | None) -> tuple[RunPlan, RunResult, dict[str, Any]]:
    report = verify_run_dir(run_dir, public_key, regrade_keys=trusted)
    if not report.valid:
        raise RegradeRefused(f"{run_dir} does not verify ({report.reasons[0] if report.reasons else 'unusable'}); "
                             "a run is regraded only from a verified record")
    result = read_result(run_dir)
    assert result is not None  # it verified
    plan = RunPlan.model_validate(_read(run_dir, layout.PLAN))
    previous = report.latest_grading or rg.grading_summary(json.loads(result.model_dump_json()))
    if result.status not in REGRADABLE:
        raise RegradeRefused(f"{run_dir}: a {result.status.value} run has no graded deliverables to grade again")
    if not (run_dir / layout.DELIVERABLES).is_file():
        raise RegradeRefused(f"{run_dir}: no {layout.DELIVERABLES}: the candidate's turn never ended with deliverables")
    shape = _read(run_dir, layout.evidence_path(Evidence.HARNESS)).get("run_shape", RunShape.STANDARD)
    if shape != RunShape.STANDARD:
        raise RegradeRefused(f"{run_dir}: a {shape} run's grader read the candidate's live desktop; it "
                             "cannot be graded again")
    return plan, result, previous


async def regrade_run(
    run_dir: Path, *, tasks: Path | None = None, reason: str = "", signing_key: Path | None = None,
    public_key: Path | None = None, trusted: dict[str, bytes] | None = None, provider: SandboxProvider | None = None,
) -> RegradeOutcome:
    """Regrade one run folder (see the module's docstring). Raises ``RegradeRefused``
    (nothing written) when it cannot; returns what the appended regrade says."""
    run_dir = Path(run_dir).resolve()
    plan, result, previous = _check_regradable(run_dir, public_key, trusted)
    task_dir = map_task(plan.task_dir, tasks) if tasks is not None else Path(plan.task_dir)
    numbers = rg.regrade_numbers(run_dir)
    n = (numbers[-1] if numbers else 0) + 1
    prev_record = rg.latest_record(run_dir)
    code_old = ((prev_record or {}).get("task") or {}).get("code_sha256_new") or \
        _read(run_dir, layout.evidence_path(Evidence.HARNESS)).get("task_code_sha256")
    staging = rg.partial_dir(run_dir, n)
    if staging.exists():
        shutil.rmtree(staging)  # a regrade that did not finish: never signed, never counted
    staging.mkdir(parents=True)
    scratch_root = Path(tempfile.mkdtemp(prefix="ale-regrade-"))
    try:
        new, error, extra, task = await _grade_again(run_dir, plan, result, task_dir, staging,
                                                     scratch_root / "s", provider)
        record = {
            "regrade": n,
            "run_id": result.run_id,
            "at": now().isoformat(),
            "reason": reason,
            "by": {"ale_version": ale.__version__, "user": _user()},
            "task": {"dir_old": plan.task_dir, "dir_new": str(task_dir), "code_sha256_old": code_old,
                     "code_sha256_new": task.code_hash},
            "deliverables_digest": _read(run_dir, layout.DELIVERABLES).get("digest"),
            "input_digest": _read(run_dir, layout.evidence_path(Evidence.INPUT_AFTER_START)).get("digest"),
            "reference_sha256": (_read(run_dir, layout.evidence_path(Evidence.REFERENCE_COMMIT)).get("source")
                                 or {}).get("sha256"),
            "old": previous,
            "new": {**new, "error": error, **extra},
        }
        ev.write_json_new(staging / rg.REGRADE_RECORD, record)
        key = load_or_create_signing_key(signing_key if signing_key is not None else
                                         (Path(plan.signing_key) if plan.signing_key
                                          and Path(plan.signing_key).is_file() else None))
        rg.seal_regrade(run_dir, n, key, {
            "run_id": result.run_id, "old": previous, "new": rg.grading_summary(new),
            "task_code_sha256": task.code_hash, "deliverables_digest": record["deliverables_digest"],
        })
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            staging.parent.rmdir()  # regrades/, when this was to be its first
        raise
    finally:
        await asyncio.to_thread(release_scratch, scratch_root)
    return RegradeOutcome(run_dir, n, previous, rg.grading_summary(new), code_old, task.code_hash, error)


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


async def _grade_again(
    run_dir: Path, plan: RunPlan, result: RunResult, task_dir: Path, staging: Path, scratch: Path,
    provider: SandboxProvider | None,
) -> tuple[dict[str, Any], str | None, dict[str, Any], Any]:
    """Stage, check, grade: the regrade's kind of the one driver (``RunKind.REGRADE``),
    with its own steps (start()'s kept writes, the two comparisons) and its finisher.
    Returns the new grading, the grader's error, extra record fields and the task's info."""
    # its turn is over
    regrade_plan = plan.model_copy(update={"task_dir": str(task_dir), "agent": AgentSpec(name="nop")})
    try:
        prep = await lifecycle.prepare(regrade_plan, provider)
    except lifecycle.PreflightError as e:
        raise RegradeRefused(f"{task_dir}: the task cannot be loaded: {e}") from e
    prep.process.log_path = staging / layout.TASK_LOG
    task, variant = prep.task, prep.variant
    state = lifecycle.new_state(prep, RunFolder(run_dir, scratch, variant), staging, kind=RunKind.REGRADE)
    record = state.record
    try:
        if variant.task_id != result.task_id:
            raise RegradeRefused(f"{task_dir}: variant {plan.variant} is now {variant.task_id!r}, the run graded "
                                 f"{result.task_id!r}")
        if prep.shape is not RunShape.STANDARD:
            raise RegradeRefused(f"{task_dir}: the task now asks for a {prep.shape} run; its run was graded "
                                 "as a standard one")
        record.events.append("regrade.start", run_id=plan.run_id, task_dir=str(task_dir),
                             task_code_sha256=task.code_hash)
        lifecycle.make_dirs(state)
        new, error, extra = await _drive_and_finish(state, run_dir, result)
        return new, error, extra, task
    finally:
        # the last process to close writes task.log into the regrade's folder: the last attempt's
        await lifecycle.cleanup(state)


def _own_steps(run_dir: Path) -> dict[str, lifecycle.Step]:
    """The regrade's own steps (``ale.phases``'s REGRADE kind names them)."""

    async def apply_start_writes(state: RunState) -> None:
        kept = start_writes.kept(run_dir) if state.prep.task.has("start") else None
        if kept is not None:  # what start() wrote in the run, from its signed folder
            try:
                await asyncio.to_thread(start_writes.apply, run_dir, *kept, state.folder.public_host,
                                        state.folder.setup_reference_host)
            except start_writes.KeptWritesError as e:
                raise RegradeRefused(f"{run_dir}: {e}") from e
            state.live.start_kept = True

    async def compare_input(state: RunState) -> None:
        start_from = (f"the run's record ({start_writes.START_DIR}/)" if state.live.start_kept
                      else "start() run again" if state.prep.task.has("start") else "no start()")
        state.record.events.append("regrade.start_writes", source=start_from)
        _compare_input(run_dir, state.folder)

    async def compare_reference(state: RunState) -> None:
        state.record.reference_commit = _compare_reference(run_dir, state.record)
        state.live.agent_started = True  # what fails from here on is graded as in the run

    return {"apply_start_writes": apply_start_writes, "compare_input": compare_input,
            "compare_reference": compare_reference}


async def _drive_and_finish(state: RunState, run_dir: Path,
                            result: RunResult) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
    """The regrade's finisher: a failure before grading refuses it; the grader's own
    failure, repeated on the deliverables, is recorded as the run's would be."""
    extra: dict[str, Any] = {}
    try:
        await lifecycle.drive(state, _own_steps(run_dir))
        scores = state.record.scores or []
        status = _agent_status(run_dir, result)
        new: dict[str, Any] = {"status": status.value, "score": sum(scores) / len(scores), "scores": scores,
                               "invalid_attribution": None}
        error = result.error if status in (RunStatus.AGENT_FAILED, RunStatus.TIMEOUT) else None
    except RegradeRefused:
        raise
    except Exception as e:
        if state.live.at != "grade_with_retries":
            raise RegradeRefused(f"{run_dir}: the input or reference could not be staged again: "
                                 f"{type(e).__name__}: {e}") from e
        if not isinstance(e, GradingError):
            raise RegradeRefused(f"{run_dir}: grading could not run: {type(e).__name__}: {e}") from e
        if not e.charged:  # the grading sandbox, the engine, a task process that did not start
            raise RegradeRefused(f"{run_dir}: grading could not run (the harness's failure, not the grader's on the "
                                 f"deliverables): {e}") from e
        new = {"status": RunStatus.GRADING_FAILED.value, "score": None, "scores": None,
               "invalid_attribution": InvalidAttribution.AFTER_AGENT_START.value}
        error = str(e)
        if e.traceback:
            extra["grading_traceback"] = e.traceback[-8000:]
    state.record.store.write_json(Evidence.TASK_PROCESS, state.prep.process.evidence())
    state.record.events.append("regrade.end", status=new["status"], score=new["score"])
    return new, error, extra


def _compare_input(run_dir: Path, folder: RunFolder) -> None:
    rel = layout.evidence_path(Evidence.INPUT_AFTER_START)
    want = _read(run_dir, rel).get("digest")
    tree = ev.hash_tree(folder.public_host)
    if tree["digest"] != want:
        committed = _read(run_dir, rel).get("files") or {}
        differ = sorted(k for k in set(committed) | set(tree["files"]) if committed.get(k) != tree["files"].get(k))
        raise RegradeRefused(f"{run_dir}: the input staged again differs from {rel} (digest {str(want)[:16]}… "
                             f"now {tree['digest'][:16]}…; files {differ[:5]}): the data source or start() changed")


def _compare_reference(run_dir: Path, record: RunRecord) -> dict[str, Any]:
    rel = layout.evidence_path(Evidence.REFERENCE_COMMIT)
    committed = _read(run_dir, rel)
    now_ = record.reference_commit or {}
    for part, what in (("source", "sha256"), ("setup_written", "digest")):
        want = (committed.get(part) or {}).get(what)
        got = (now_.get(part) or {}).get(what)
        if want != got:
            raise RegradeRefused(f"{run_dir}: the reference differs from {rel} ({part}: committed {str(want)[:16]}…, "
                                 f"now {str(got)[:16]}…): the data source or start() changed")
    return committed


# -- an experiment ------------------------------------------------------------------
async def regrade_experiment(
    exp_dir: Path, *, tasks: Path | None = None, reason: str = "", signing_key: Path | None = None,
    public_key: Path | None = None, trusted: dict[str, bytes] | None = None, provider: SandboxProvider | None = None,
    progress: Any = None,
) -> ExperimentRegrade:
    """Regrade each unit's final attempt that can be (one after another). A run that is
    refused is listed and the others go on."""
    out = ExperimentRegrade()
    latest: dict[str, tuple[Path, RunResult]] = {}
    for run_dir, result in iter_results(exp_dir):
        unit = result.run_id.removesuffix(f"-a{result.attempt}")
        if unit not in latest or result.attempt > latest[unit][1].attempt:
            latest[unit] = (run_dir, result)
    for run_dir, result in sorted(latest.values(), key=lambda x: x[1].run_id):
        if result.status not in REGRADABLE:
            out.skipped.append((run_dir, f"a {result.status.value} run"))
            continue
        try:
            outcome = await regrade_run(run_dir, tasks=tasks, reason=reason, signing_key=signing_key,
                                        public_key=public_key, trusted=trusted, provider=provider)
            out.regraded.append(outcome)
            if progress is not None:
                progress(outcome)
        except RegradeRefused as e:
            out.refused.append((run_dir, str(e)))
    return out

