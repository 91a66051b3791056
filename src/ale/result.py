"""`result.json`: the one record of a run's outcome (schema in schemas/)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ale.phases import Phase  # noqa: F401  (re-exported: result.json names phases)
from ale.status import (
    InvalidAttribution,
    RunStatus,
    counts_toward_score,
    headline_score,
    is_retryable,
)


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


def write_schema(path: str) -> None:
    import json

    with open(path, "w") as f:
        json.dump(RunResult.model_json_schema(), f, indent=2)
        f.write("\n")
