"""The oracle agent: the task's own `solve(cfg, session)` (in its task process),
through the agent's tool box."""

from __future__ import annotations

from typing import Any

from ale.agents.base import Agent, AgentContext, AgentEnd, AgentOutcome
from ale.sandbox.session import ContainerSession


class OracleAgent(Agent):
    name = "oracle"
    takes_oracle = True

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = dict(config or {})

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        if ctx.oracle is None:
            return AgentOutcome(AgentEnd.FAILED, detail="the task defines no solve() oracle")
        session = ContainerSession(ctx.tools, default_timeout=ctx.tools.default_timeout)
        await ctx.oracle(session)
        return AgentOutcome(AgentEnd.FINISHED)
