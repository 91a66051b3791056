"""What an agent is: something that works on a task through a ToolBox, outside the sandbox."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from ale.sandbox.policy import IsolationPolicy
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
    """What the run asks of an agent: ``run``. Every agent class subclasses this
    protocol, so the optional abilities below are there with their defaults (an agent
    that has one overrides it) and the run asks for them by name, never by look-up."""

    name: str
    config: dict[str, Any]  # recorded as evidence, secrets redacted
    # The agent is given the task's solve() in its context (``AgentContext.oracle``).
    takes_oracle: bool = False
    # A named harness's mode ("native" or "bridge"), recorded in result.json.
    mode: str | None = None
    # What ``fit_policy`` did to the sandbox's limits (its "raised" ones are an event).
    sandbox_limits: dict[str, Any] | None = None

    @property
    def native(self) -> bool:
        """The agent runs inside the sandbox (a native harness: the run layers its image)."""
        return False

    def preflight(self, *, private: list[Path]) -> None:
        """Before a run: check the agent's set-up against the run's private folders
        (the runs and task folders); AgentConfigError names what is wrong."""

    def fit_policy(self, policy: IsolationPolicy) -> IsolationPolicy:
        """The run's policy with the sandbox limits the agent needs (raised within the
        policy's bounds), or AgentConfigError; by default the policy as given."""
        return policy

    def evidence(self) -> dict[str, Any] | None:
        """What the agent is given, for the run's evidence (names, never values); None
        when it has nothing beyond its name and config."""
        return None

    async def run(self, ctx: AgentContext) -> AgentOutcome: ...
