"""What a failed oracle or nop run of ``ale task check`` says about the task, so an
author can tell a flaw of the task from a failure of the harness.

- ``nop`` (the agent that does nothing) scored above 0 in a run that was graded:
  the task's start state already passes its grader. That is the task's flaw
  (cua-bench-basic's ``drag-slider`` variant 1: the slider starts at its target),
  whatever the harness does.
- the oracle (the task's own ``solve()``) was graded below 1.0: its solution did
  not solve the task here; the run's trajectory shows what it did.
- a run that was not graded (``error``, ``infrastructure_error``, ...): the run
  failed, the harness or the task's code; its reason says which.
"""

from __future__ import annotations

from typing import Any

from ale.status import RunStatus

TASK_FLAW = "task flaw"
ORACLE_MISSED = "oracle missed"
RUN_FAILED = "run failed"


def classify(agent: str, result: Any) -> str:
    """``TASK_FLAW``, ``ORACLE_MISSED`` or ``RUN_FAILED`` for a run that failed its check."""
    if result.status is not RunStatus.SCORED or result.scores is None:
        return RUN_FAILED
    return TASK_FLAW if agent == "nop" else ORACLE_MISSED


def run_problem(variant: int, agent: str, result: Any) -> str:
    """One line for a failed oracle or nop run: what kind of failure, the variant,
    the scores, and what it means."""
    kind = classify(agent, result)
    scores = result.scores
    if kind == TASK_FLAW:
        return (f"{TASK_FLAW}: variant {variant}: nop (no action at all) scored {scores}: the task's start state "
                f"already passes its grader (the task's, not a harness failure)")
    if kind == ORACLE_MISSED:
        return (f"{ORACLE_MISSED}: variant {variant}: the oracle (the task's solve()) scored {scores}, not 1.0: its "
                f"solution did not solve the task here (see the run's trajectory)")
    why = (result.error or "").strip().splitlines()
    return f"{RUN_FAILED}: variant {variant} {agent}: {result.status.value}{': ' + why[0][:300] if why else ''}"
