"""Errors an agent configuration can raise before any run starts."""

from __future__ import annotations


class AgentConfigError(ValueError):
    """An agent's configuration is unusable; the message names the key, file or value at fault."""
