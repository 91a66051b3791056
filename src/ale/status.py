"""Run statuses: the only place they are spelled."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    SCORED = "scored"
    INVALID_EVALUATION_ENVIRONMENT = "invalid_evaluation_environment"
    AGENT_FAILED = "agent_failed"
    TIMEOUT = "timeout"
    GRADING_FAILED = "grading_failed"
    INFRASTRUCTURE_ERROR = "infrastructure_error"

    @property
    def carries_score(self) -> bool:
        """Statuses whose scores may enter an aggregate (when a score exists)."""
        return self in (RunStatus.SCORED, RunStatus.AGENT_FAILED, RunStatus.TIMEOUT)

    @property
    def retryable(self) -> bool:
        return self is RunStatus.INFRASTRUCTURE_ERROR


def counts_toward_score(status: RunStatus | str, score: float | None) -> bool:
    """The one rule every aggregate, report and tier uses to admit a run.

    Invalid runs, grading failures and infrastructure errors never count; a run
    without a score never counts.
    """
    return RunStatus(status).carries_score and score is not None
