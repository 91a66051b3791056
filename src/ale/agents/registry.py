"""Agent names -> agent objects, and the agent part of a run's evidence."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
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
    # Named harnesses, each at its pinned version, ``mode: native`` or ``bridge`` (ale.agents.harness).
    "claude-code": ("ale.agents.harness", "ClaudeCodeAgent"),
    "codex": ("ale.agents.harness", "CodexAgent"),
    "gemini-cli": ("ale.agents.harness", "GeminiCliAgent"),
}


def known_agents() -> tuple[str, ...]:
    return tuple(AGENTS)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _agent_class(name: str) -> type:
    if name not in AGENTS:
        raise AgentConfigError(
            f"unknown agent {name!r}{_did_you_mean(name, AGENTS)} (known agents: {', '.join(AGENTS)})")
    module, cls = AGENTS[name]
    return getattr(importlib.import_module(module), cls)


def known_config_keys(name: str) -> frozenset[str] | None:
    """The configuration keys agent ``name`` accepts (None: it does not say)."""
    if name not in AGENTS:
        return None
    keys = getattr(importlib.import_module(AGENTS[name][0]), "_KNOWN_KEYS", None)
    if keys is None and name == "nop":
        return frozenset()
    return None if keys is None else frozenset(keys)


def check_agent(spec: AgentSpec) -> None:
    """Refuse what an agent spec gets wrong before any run: an unknown agent or
    config key (with a "did you mean"), then whatever the agent's own constructor
    refuses (a missing script, a bad value). AgentConfigError says which."""
    _agent_class(spec.name)
    keys = known_config_keys(spec.name)
    if keys is not None:
        for key in sorted(set(spec.config) - keys):
            raise AgentConfigError(
                f"{spec.name} agent: unknown config key {key!r}{_did_you_mean(key, keys)} "
                f"(known: {', '.join(sorted(keys)) or 'none'})")
    make_agent(spec)


def make_agent(spec: AgentSpec) -> Agent:
    """Build the agent a spec names; configuration errors raise AgentConfigError."""
    unknown = set(spec.allowlist) - set(ALL_TOOLS)
    if unknown:
        raise AgentConfigError(f"agent {spec.display!r}: unknown tools in allowlist {sorted(unknown)}; "
                               f"known: {', '.join(ALL_TOOLS)}")
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
    details = agent.evidence()
    if details is not None:
        doc["details"] = redact(details)
    return doc
