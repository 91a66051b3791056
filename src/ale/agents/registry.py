"""Agent names -> agent objects, and the agent part of a run's evidence."""

from __future__ import annotations

import importlib
from typing import Any

from ale.agents.base import Agent
from ale.agents.errors import AgentConfigError
from ale.agents.secrets import redact
from ale.plan import AgentSpec
from ale.sandbox.tools import ALL_TOOLS

# name -> (module, class); imported on use so `ale` starts fast and the oracle
# (with the task loader behind it) is only loaded when asked for.
AGENTS: dict[str, tuple[str, str]] = {
    "oracle": ("ale.agents.oracle", "OracleAgent"),
    "nop": ("ale.agents.nop", "NopAgent"),
    "replay": ("ale.agents.replay", "ReplayAgent"),
    "command": ("ale.agents.command", "CommandAgent"),
    "llm": ("ale.agents.llm", "LLMAgent"),
}


def known_agents() -> tuple[str, ...]:
    return tuple(AGENTS)


def _agent_class(name: str) -> type:
    if name not in AGENTS:
        raise AgentConfigError(f"unknown agent {name!r}; known agents: {', '.join(AGENTS)}")
    module, cls = AGENTS[name]
    return getattr(importlib.import_module(module), cls)


def make_agent(spec: AgentSpec) -> Agent:
    """Build the agent a spec names; configuration errors raise AgentConfigError."""
    unknown = set(spec.allowlist) - set(ALL_TOOLS)
    if unknown:
        raise AgentConfigError(f"agent {spec.display!r}: unknown tools in allowlist {sorted(unknown)}; known: {', '.join(ALL_TOOLS)}")
    cls = _agent_class(spec.name)
    try:
        return cls(dict(spec.config))
    except AgentConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise AgentConfigError(f"agent {spec.name!r}: bad configuration: {e}") from e


def agent_evidence(spec: AgentSpec) -> dict[str, Any]:
    """What the run records about its agent: name, effective allowlist, the
    configuration with secrets redacted, and agent-specific facts (e.g. the
    environment variable names a command agent's process gets)."""
    doc: dict[str, Any] = {
        "name": spec.name,
        "label": spec.display,
        "allowlist": [t for t in ALL_TOOLS if t in spec.allowlist],
        "refused_tools": [t for t in ALL_TOOLS if t not in spec.allowlist],
        "config": redact(dict(spec.config)),
    }
    try:
        agent = make_agent(spec)
    except AgentConfigError as e:
        doc["config_error"] = str(e)
        return doc
    details = getattr(agent, "evidence", None)
    if callable(details):
        doc["details"] = redact(details())
    return doc
