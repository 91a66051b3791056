"""Resume after a crash: what each unit still needs, and what a crash left behind.

- ``reconcile``: sandboxes labelled with the experiment are removed (the janitor),
  run folders without ``result.json`` are moved to ``<output>/.incomplete/`` (that
  attempt runs again), and scratch folders are released.
- ``interrupted_source``: the interrupted folder an attempt may resume from (its
  gateway record holds answered model turns), for ``ale exp run --resume-turns``.
- ``resume_states``: a unit whose latest attempt has a final ``result.json`` is
  done; otherwise its next attempt number is one past the last folder on disk.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ale import layout
from ale.result import RunResult
from ale.runs.exp_record import unit_info
from ale.runs.experiment import PlannedUnit, attempt_run_id
from ale.runs.store import RunIndex, read_result, runs_root
from ale.sandbox.scratch import release_scratch
from ale.status import InvalidAttribution, RunStatus

Janitor = Callable[[str], list[str]]  # experiment name -> removed sandbox names


@dataclass
class UnitState:
    unit: PlannedUnit
    next_attempt: int = 1
    final: RunResult | None = None


def reconcile(output: Path, experiment: str, janitor: Janitor) -> tuple[list[str], list[str]]:
    """Remove orphan sandboxes, move half-done run folders aside. Returns (orphans, moved)."""
    orphans = janitor(experiment)
    moved: list[str] = []
    root = runs_root(output)
    if root.is_dir():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        for run_dir in sorted(root.iterdir()):
            if not run_dir.is_dir() or run_dir.name.startswith("."):
                continue
            if not (run_dir / layout.RESULT).is_file():
                dest = output / layout.INCOMPLETE_DIR / f"{run_dir.name}.{stamp}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(run_dir), dest)
                moved.append(run_dir.name)
        scratch = root / layout.SCRATCH_DIR
        if scratch.is_dir():
            release_scratch(scratch)
    return orphans, moved


def interrupted_source(output: Path, run_id: str) -> Path | None:
    """The latest interrupted folder of this attempt (``.incomplete/<run_id>.<stamp>``)
    whose gateway record holds an answered model turn, or None: nothing to resume from.
    An interrupted resume holds its replayed turns too, so the latest one is the longest."""
    from ale.agents.gateway.resume import source_turns

    root = output / layout.INCOMPLETE_DIR
    if not root.is_dir():
        return None
    for cand in sorted((d for d in root.iterdir() if d.is_dir() and d.name.rsplit(".", 1)[0] == run_id), reverse=True):
        turns, _, problems = source_turns(cand)
        if turns and not problems:
            return cand
    return None


def ended_in_error(result: RunResult) -> bool:
    """A run that ended in the harness's error rather than a verdict on the agent:
    an infrastructure error (retryable or not), a grading failure or an invalid run
    not charged to the candidate. What ``ale exp run --retry-errors`` runs again."""
    status = RunStatus(result.status)
    if status is RunStatus.INFRASTRUCTURE_ERROR:
        return True
    if status in (RunStatus.GRADING_FAILED, RunStatus.INVALID_EVALUATION_ENVIRONMENT):
        return result.invalid_attribution in (
            InvalidAttribution.GRADING_ENVIRONMENT, InvalidAttribution.BEFORE_AGENT, None)
    return False


def resume_states(units: list[PlannedUnit], output: Path, index: RunIndex, max_attempts: int,
                  *, retry_errors: bool = False) -> list[UnitState]:
    """Each unit's next attempt, or its final result (read from the run folders).
    ``retry_errors``: a unit whose final attempt ended in an error
    (``ended_in_error``) gets one more attempt."""
    root = runs_root(output)
    states = []
    rows = []
    for unit in units:
        st = UnitState(unit)
        attempt = 1
        latest: RunResult | None = None
        while True:
            run_dir = root / attempt_run_id(unit.unit_id, attempt)
            result = read_result(run_dir) if run_dir.is_dir() else None
            if result is None:
                break
            rows.append((result, unit_info(unit), run_dir))
            latest = result
            attempt += 1
        st.next_attempt = attempt
        if latest is not None and (not latest.retryable or latest.attempt >= max_attempts):
            st.final = None if retry_errors and ended_in_error(latest) else latest
        states.append(st)
    index.record_many(rows)
    return states
