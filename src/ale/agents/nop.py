"""The `nop` agent: does nothing (the baseline a task must not reward)."""

from __future__ import annotations

from typing import Any

from ale.agents.base import Agent, AgentContext, AgentEnd, AgentOutcome


class NopAgent(Agent):
    name = "nop"

    def __init__(self, config: dict[str, Any] | None = None):
        if config:
            raise ValueError(f"the nop agent takes no configuration, got keys {sorted(config)}")
        self.config: dict[str, Any] = {}

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        return AgentOutcome(AgentEnd.FINISHED, detail="nop: no action taken")
