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


def is_retryable(status: RunStatus | str, attribution: InvalidAttribution | str | None, *,
                 allowed: bool = True) -> bool:
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


class ModelFailure(StrEnum):
    """A model request that failed, or an answer the provider flagged, as the run's
    gateway saw it (``result.json``'s ``model_failure``: the one that ended the run, or
    the last one when the agent did not finish). ``FAILURE_OWNER`` says whose it is.

    - the provider's, transient (retried by the gateway with backoff, up to its
      budget; then the run ends as ``infrastructure_error``, excluded and counted):
      ``rate_limited`` (429, ``rate_limit_error``, ``rate_limit_exceeded``, Gemini
      ``RESOURCE_EXHAUSTED``), ``overloaded`` (529 ``overloaded_error``, 503,
      ``UNAVAILABLE``), ``server_error`` (other 5xx), ``provider_timeout`` (408, 504,
      ``DEADLINE_EXCEEDED``, no answer in time), ``unreachable`` (no connection);
    - the operator's account or configuration (never retried: a retry cannot change
      it; ``infrastructure_error``, excluded, not retried as a new attempt):
      ``authentication`` (401/403, an invalid key), ``quota_exhausted``
      (``insufficient_quota``, ``billing_error``, a spend limit, a daily quota),
      ``unknown_model`` (404 naming the model, ``model_not_found``);
    - the agent's (its own turn, its own result): ``context_length`` (``prompt is
      too long``, ``context_length_exceeded``, Gemini's input token count over the
      maximum) and ``refusal`` (Anthropic ``stop_reason: refusal``, OpenAI
      ``finish_reason: content_filter`` or a ``refusal`` message part, Gemini
      ``finishReason`` ``SAFETY``/``PROHIBITED_CONTENT``/``BLOCKLIST``/``SPII`` or a
      prompt ``blockReason``).
    """

    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    PROVIDER_TIMEOUT = "provider_timeout"
    UNREACHABLE = "unreachable"
    AUTHENTICATION = "authentication"
    QUOTA_EXHAUSTED = "quota_exhausted"
    UNKNOWN_MODEL = "unknown_model"
    CONTEXT_LENGTH = "context_length"
    REFUSAL = "refusal"


class FailureOwner(StrEnum):
    PROVIDER = "provider"  # transient: retried with backoff, then infrastructure
    OPERATOR = "operator"  # the account or configuration: infrastructure, never retried
    AGENT = "agent"  # the agent's own: its run, its result


FAILURE_OWNER: dict[ModelFailure, FailureOwner] = {
    **{f: FailureOwner.PROVIDER for f in (ModelFailure.RATE_LIMITED, ModelFailure.OVERLOADED, ModelFailure.SERVER_ERROR,
                                          ModelFailure.PROVIDER_TIMEOUT, ModelFailure.UNREACHABLE)},
    **{f: FailureOwner.OPERATOR
       for f in (ModelFailure.AUTHENTICATION, ModelFailure.QUOTA_EXHAUSTED, ModelFailure.UNKNOWN_MODEL)},
    ModelFailure.CONTEXT_LENGTH: FailureOwner.AGENT,
    ModelFailure.REFUSAL: FailureOwner.AGENT,
}


def not_the_agents(failure: ModelFailure | str | None) -> bool:
    """A failure that ends a run as infrastructure, never as the agent's zero."""
    return failure is not None and FAILURE_OWNER[ModelFailure(failure)] is not FailureOwner.AGENT


class AgentLimit(StrEnum):
    """The limit that stopped the agent (``result.json``'s ``agent_limit``; status
    ``timeout``, the agent's own): the gateway's budgets (model requests, input or
    output tokens, cost), the tool-call step limit, or the run's wall time."""

    MODEL_REQUESTS = "model_requests"
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    TOTAL_TOKENS = "total_tokens"
    COST = "cost"
    TOOL_CALLS = "tool_calls"
    WALL_TIME = "wall_time"
