"""The one place a step's exception becomes a status (``classify_failure``), and the
status an agent's end gives a run."""

from __future__ import annotations

import traceback
from typing import Any

from ale.agents.base import AgentEnd, AgentOutcome
from ale.data.base import DataError
from ale.grading.grader import GradingError
from ale.isolation.checks import Check
from ale.phases import CheckGroup
from ale.runs import software
from ale.runs.state import RunState
from ale.sandbox.base import SandboxError, UnsupportedGuest
from ale.status import InvalidAttribution, RunStatus
from ale.tasks.process import TaskCallFailed


class SealBroken(Exception):
    """Verification found violations: the agent must not (or no longer) run."""


def classify_failure(e: Exception, state: RunState) -> tuple[RunStatus, str, dict[str, Any]]:
    """What a phase's exception means for the run: its status, error, extra record.

    Before the agent starts, provider and data failures are the infrastructure's
    (retryable). Once it has started, nothing may become a retryable
    infrastructure error but an engine that stopped answering: a failure to finish
    the run's checks makes the run invalid (charged to the candidate), a data
    source failing while the reference is staged is a grading failure.
    """
    if isinstance(e, SealBroken):
        return RunStatus.INVALID_EVALUATION_ENVIRONMENT, "the sandbox was not proven sealed; see violations", {}
    if isinstance(e, GradingError):
        # Charged to the candidate only when it repeated on its deliverables; a single
        # failure of the grading environment is the harness's (retried).
        state.record.invalid_attribution = (
            InvalidAttribution.AFTER_AGENT_START if e.charged else InvalidAttribution.GRADING_ENVIRONMENT)
        return RunStatus.GRADING_FAILED, str(e), ({"grading_traceback": e.traceback} if e.traceback else {})
    if isinstance(e, software.SoftwareError):  # before the sandbox: the task's software could not be provided
        return RunStatus.INFRASTRUCTURE_ERROR, str(e), ({} if e.retryable else {"retryable": False})
    if isinstance(e, TaskCallFailed):  # start() raised: the task could not be set up
        return RunStatus.INFRASTRUCTURE_ERROR, f"start() raised {e}", {"traceback": e.traceback[-8000:],
                                                                       "retryable": False}
    if isinstance(e, DataError):
        if state.live.agent_started:  # the reference could not be staged: the harness's
            state.record.invalid_attribution = InvalidAttribution.GRADING_ENVIRONMENT
            return RunStatus.GRADING_FAILED, f"{type(e).__name__}: {e}", ({} if e.retryable else {"retryable": False})
        # A reference failing its digest, password or limits is grading_failed;
        # an unreachable input is infrastructure_error (retryable), a missing one
        # too, recorded once (another attempt finds the same).
        return RunStatus(e.status), f"{type(e).__name__}: {e}", ({} if e.retryable else {"retryable": False})
    if isinstance(e, UnsupportedGuest) and not state.live.agent_started:  # the same guest on every attempt
        return RunStatus.INFRASTRUCTURE_ERROR, f"{type(e).__name__}: {e}", {"retryable": False}
    detail = f"{type(e).__name__}: {e}"
    if state.live.agent_started and not engine_down(state):
        state.record.add_checks(CheckGroup.AFTER_AGENT, [Check(
            "run.checks_completed", False, "the run's checks completed", detail,
            "the run's checks could not be completed")])
        return (RunStatus.INVALID_EVALUATION_ENVIRONMENT,
                f"the seal could not be proven after the agent started: {detail}",
                {"traceback": traceback.format_exc()[-8000:]})
    return RunStatus.INFRASTRUCTURE_ERROR, detail, {"traceback": traceback.format_exc()[-8000:]}


def engine_down(state: RunState) -> bool:
    try:
        state.prep.provider.ping()
    except SandboxError:
        return True
    return False


def status_after_agent(outcome: AgentOutcome | None) -> RunStatus:
    if outcome is None:
        return RunStatus.AGENT_FAILED
    return {AgentEnd.FINISHED: RunStatus.SCORED, AgentEnd.FAILED: RunStatus.AGENT_FAILED,
            AgentEnd.TIMEOUT: RunStatus.TIMEOUT, AgentEnd.PROVIDER_FAILED: RunStatus.INFRASTRUCTURE_ERROR}[outcome.end]
