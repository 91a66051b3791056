"""`result.json`: the one record of a run's outcome (schema in schemas/)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ale.phases import Phase  # noqa: F401  (re-exported: result.json names phases)
from ale.status import (
    AgentLimit,
    InvalidAttribution,
    ModelFailure,
    RunStatus,
    counts_toward_score,
    headline_score,
    is_retryable,
)

# The one tolerance on scores: how far past 0 or 1 a score may be and still be that
# bound, and how close two scores must be to count as equal (a score above another
# by more; a mean recomputed from its scores). Here, beside the result it judges, so
# that `ale verify` needs no grading code; tests/test_defined_once.py keeps it the only one.
SCORE_EPSILON = 1e-9

class PhaseTiming(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    started_at: datetime
    ended_at: datetime
    seconds: float


class RunResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    run_id: str
    task_id: str
    task_dir: str
    variant: int
    agent: str
    status: RunStatus
    scores: list[float] | None = None
    score: float | None = None
    error: str | None = None
    violations: list[str] = Field(default_factory=list)
    # For invalid runs: who the run is charged to (status.InvalidAttribution).
    invalid_attribution: InvalidAttribution | None = None
    phases: list[PhaseTiming] = Field(default_factory=list)
    started_at: datetime
    ended_at: datetime
    harness_version: str
    experiment: str | None = None
    attempt: int = 1
    # The model call that ended the run, named (status.ModelFailure): the provider's or the
    # operator's make it infrastructure_error; the agent's (context length, refusal) say so.
    model_failure: ModelFailure | None = None
    # The limit that stopped the agent (status timeout): a gateway budget, the step limit, the wall time.
    agent_limit: AgentLimit | None = None
    # A run resumed from an interrupted run's gateway record (ale.agents.gateway.resume): from_run,
    # replayed_turns, diverged_at, ...; absent from every other result.
    resumed: dict[str, Any] | None = Field(None, exclude_if=lambda v: v is None)
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def counts(self) -> bool:
        return counts_toward_score(self.status, self.score)

    @property
    def headline(self) -> float | None:
        return headline_score(self.status, self.score, self.invalid_attribution)

    @property
    def retryable(self) -> bool:
        return is_retryable(self.status, self.invalid_attribution, allowed=self.extra.get("retryable", True))


_STATUS_REASON = {
    RunStatus.INVALID_EVALUATION_ENVIRONMENT: "the sandbox was not proven sealed",
    RunStatus.AGENT_FAILED: "the agent ended without finishing",
    RunStatus.TIMEOUT: "the agent ran out of time",
    RunStatus.GRADING_FAILED: "the grader gave no valid score",
    RunStatus.INFRASTRUCTURE_ERROR: "the harness could not run it",
}
_CHARGED_TO = {
    InvalidAttribution.BEFORE_AGENT: "before the agent started; retried",
    InvalidAttribution.AFTER_AGENT_START: "charged to the candidate",
    InvalidAttribution.CONTROLLER_CONFIGURATION: "the controller's configuration",
    InvalidAttribution.GRADING_ENVIRONMENT: "the grading environment; retried",
}


def reason_line(result: Any, limit: int = 240) -> str | None:
    """Why a run did not score, in one line (None for a scored run): the one
    wording of ``ale run``/``ale exp``'s status lines, ``ale report``, the HTML
    report and ``ale exp status``. Takes a ``RunResult`` or anything with its
    ``status``, ``error`` and ``invalid_attribution`` (or ``attribution``), and
    optionally ``violations``."""
    status = RunStatus(result.status)
    if status is RunStatus.SCORED:
        return None
    text = ""
    violations = list(getattr(result, "violations", None) or [])
    if status is RunStatus.INVALID_EVALUATION_ENVIRONMENT and violations:
        text = str(violations[0]) + (f" (+{len(violations) - 1} more)" if len(violations) > 1 else "")
    error = getattr(result, "error", None)
    if not text and error:
        lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
        if lines:
            # a traceback's last line says what happened; any other text, its first
            text = lines[-1] if lines[0].startswith("Traceback (most recent call last)") else lines[0]
    if not text:
        text = _STATUS_REASON[status]
    attribution = getattr(result, "invalid_attribution", None) or getattr(result, "attribution", None)
    if attribution is not None and status in (RunStatus.INVALID_EVALUATION_ENVIRONMENT, RunStatus.GRADING_FAILED):
        note = _CHARGED_TO.get(InvalidAttribution(attribution))
        if note:
            text = f"{text} [{note}]"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def write_schema(path: str) -> None:
    import json

    with open(path, "w") as f:
        json.dump(RunResult.model_json_schema(), f, indent=2)
        f.write("\n")
