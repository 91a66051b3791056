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



class InvalidAttribution(StrEnum):
    """Who a run that carries no valid score is charged to (``invalid_evaluation_environment``
    and ``grading_failed`` runs; ``result.json``'s ``invalid_attribution``).

    - ``before_agent``: the harness could not prove the seal before the candidate
      started. The candidate did nothing: excluded from every mean, retried.
    - ``after_agent_start``: charged to the candidate. An invalid run: a violation
      found after the candidate started, possibly its doing. A grading failure: the
      grader failed again and again on the candidate's signed deliverables (raised,
      timed out, killed its process, returned no valid scores). Never retried; counts
      as a failure (0) in the agent's headline mean, pass rate and pass@k, and is
      flagged for review.
    - ``controller_configuration``: the controller offered the model a forbidden
      tool in its first request: a configuration to fix. Excluded, never retried.
    - ``grading_environment``: a grading failure the harness can show was its own
      (the grading sandbox failed to start, the engine went away, the reference could
      not be staged). Excluded, retried.
    """

    BEFORE_AGENT = "before_agent"
    AFTER_AGENT_START = "after_agent_start"
    CONTROLLER_CONFIGURATION = "controller_configuration"
    GRADING_ENVIRONMENT = "grading_environment"


CHARGED_STATUSES = frozenset({RunStatus.INVALID_EVALUATION_ENVIRONMENT, RunStatus.GRADING_FAILED})


def is_charged(status: RunStatus | str, attribution: InvalidAttribution | str | None) -> bool:
    """A run without a valid score that counts as 0 for its agent and is flagged for
    review: invalid after the agent started, or a grading failure that repeated on
    the candidate's deliverables."""
    return RunStatus(status) in CHARGED_STATUSES and attribution == InvalidAttribution.AFTER_AGENT_START


def counts_toward_score(status: RunStatus | str, score: float | None) -> bool:
    """The rule for a *valid* score: valid-only means and difficulty tiers.

    Invalid runs, grading failures and infrastructure errors never count here; a
    run without a score never counts.
    """
    return RunStatus(status).carries_score and score is not None


def headline_score(
    status: RunStatus | str, score: float | None, attribution: InvalidAttribution | str | None
) -> float | None:
    """The run's score in an agent's headline numbers (mean, pass rate, pass@k), or
    None when it is left out: a valid score as it is, a run charged to the candidate
    (``is_charged``) as 0, anything else left out."""
    if counts_toward_score(status, score):
        return score
    if is_charged(status, attribution):
        return 0.0
    return None


def is_retryable(status: RunStatus | str, attribution: InvalidAttribution | str | None, *, allowed: bool = True) -> bool:
    """Only what the harness can attribute to itself earns another attempt: an
    infrastructure error, a seal it could not prove before the candidate started,
    or a grading environment that failed. ``allowed=False`` (e.g. a malformed task,
    a reference that is missing) overrides."""
    st = RunStatus(status)
    if not allowed:
        return False
    if st is RunStatus.INFRASTRUCTURE_ERROR:
        return True
    if st is RunStatus.GRADING_FAILED:
        return attribution == InvalidAttribution.GRADING_ENVIRONMENT
    return st is RunStatus.INVALID_EVALUATION_ENVIRONMENT and attribution == InvalidAttribution.BEFORE_AGENT
