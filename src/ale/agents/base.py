"""What an agent is: something that works on a task through a ToolBox, outside the sandbox."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from ale.sandbox.tools import ToolBox
from ale.status import AgentLimit, ModelFailure


class AgentEnd(StrEnum):
    FINISHED = "finished"
    FAILED = "failed"  # the agent crashed -> run status agent_failed
    TIMEOUT = "timeout"  # wall time or step limit -> run status timeout
    # the model's provider failed past the gateway's retries -> infrastructure_error, never the agent's
    PROVIDER_FAILED = "provider_failed"


@dataclass
class AgentContext:
    """Everything an agent may use. No grader secret, no reference path, ever."""

    prompt: str
    tools: ToolBox
    workdir: str  # the workspace path inside the sandbox
    input_dir: str  # the input path inside the sandbox
    run_dir: Path  # the run folder on the controller side (for raw logs)
    wall_time_s: float
    max_steps: int | None = None
    # The task's solve(session), run in the task process (oracle only).
    oracle: Callable[[Any], Awaitable[Any]] | None = None


@dataclass
class AgentOutcome:
    end: AgentEnd
    detail: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    limit: AgentLimit | None = None  # which limit stopped it (TIMEOUT)
    model_failure: ModelFailure | None = None  # the named failure of the model call that ended it


def provider_outcome(gw: Any, usage: dict[str, Any]) -> AgentOutcome:
    """The turn ended because the gateway's provider failed (``gw.provider_failure``)."""
    f = gw.provider_failure or {}
    failure = ModelFailure(f["failure"]) if f.get("failure") else None
    return AgentOutcome(AgentEnd.PROVIDER_FAILED, usage=usage, model_failure=failure,
                        detail=f"the model's provider failed: {f.get('failure')} (HTTP {f.get('status')}) on request "
                               f"{f.get('request')} after {f.get('retries', 0)} retries; harness stopped")


class Agent(Protocol):
    name: str
    config: dict[str, Any]  # recorded as evidence, secrets redacted

    async def run(self, ctx: AgentContext) -> AgentOutcome: ...
