"""The `replay` agent: executes a fixed list of tool calls, in order.

Configuration: ``script`` (path to a JSON file) or ``steps`` (the list itself),
each element ``{"tool": NAME, "args": {...}}``. Optional ``stop_on_error``
(default false: a refused or failing call is recorded and the replay goes on,
which is what probing scripts want).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ale.agents.base import Agent, AgentContext, AgentEnd, AgentOutcome
from ale.agents.errors import AgentConfigError
from ale.documents import load_document
from ale.sandbox.tools import ALL_TOOLS

_KNOWN_KEYS = {"script", "steps", "stop_on_error"}


class ReplayCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tool: str
    args: dict[str, Any] = {}


def parse_script(data: Any, source: str) -> list[ReplayCall]:
    """Validate a replay script; errors name the source and the index at fault."""
    if not isinstance(data, list):
        raise AgentConfigError(f"replay script {source}: expected a JSON list of tool calls, got {type(data).__name__}")
    calls: list[ReplayCall] = []
    for i, item in enumerate(data):
        try:
            call = ReplayCall.model_validate(item)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(item)'}: {err['msg']}"
                                 for err in e.errors())
            raise AgentConfigError(
                f"replay script {source}, index {i}: {problems} (each item is "
                '{"tool": NAME, "args": {...}})'
            ) from None
        if call.tool not in ALL_TOOLS:
            raise AgentConfigError(
                f"replay script {source}, index {i}: unknown tool {call.tool!r}; known: {', '.join(ALL_TOOLS)}"
            )
        calls.append(call)
    return calls


def load_script(path: str | Path) -> list[ReplayCall]:
    data = load_document(path, "replay script", AgentConfigError)
    return parse_script(data, str(path))


class ReplayAgent(Agent):
    name = "replay"

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = dict(config or {})
        unknown = set(self.config) - _KNOWN_KEYS
        if unknown:
            raise AgentConfigError(f"replay agent: unknown config keys {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
        has_script, has_steps = "script" in self.config, "steps" in self.config
        if has_script == has_steps:
            raise AgentConfigError(
                "replay agent: give exactly one of config 'script' (a JSON file path) or 'steps' (a list)")
        if has_script:
            self.calls = load_script(self.config["script"])
        else:
            self.calls = parse_script(self.config["steps"], "(config 'steps')")
        self.stop_on_error = bool(self.config.get("stop_on_error", False))

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        done = 0
        for i, call in enumerate(self.calls):
            if ctx.max_steps is not None and done >= ctx.max_steps:
                return AgentOutcome(AgentEnd.TIMEOUT,
                                    detail=f"step limit of {ctx.max_steps} reached at script index {i}")
            out = await ctx.tools.call(call.tool, dict(call.args))
            done += 1
            if self.stop_on_error and not out.ok:
                return AgentOutcome(AgentEnd.FAILED,
                                    detail=f"script index {i} ({call.tool}) failed: {out.error or out.exit_code}")
        return AgentOutcome(AgentEnd.FINISHED, detail=f"replayed {done} call(s)")
