"""What an agent's process may inherit, and how agent configuration is redacted.

Grader keys (``ALE_JUDGE_*``), signing keys, cloud and data-source credentials
never reach an agent process, whatever its configuration lists: naming one is
a configuration error, and a value equal to (or containing) one of them is
refused too, so ``MY_VAR=$ALE_JUDGE_API_KEY`` cannot smuggle it through.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ale.agents.errors import AgentConfigError
from ale.redaction import REDACTED, TRUSTED_SIDE_CREDENTIALS, is_trusted_side_credential
from ale.redaction import redact as redact_evidence

BASE_ENV = ("PATH", "HOME", "LANG")

# Variables no agent process ever gets: the trusted side's credentials (one rule,
# ale.redaction's, shared with the evidence's redaction and the sandbox's checks).
FORBIDDEN_ENV_PATTERNS = TRUSTED_SIDE_CREDENTIALS
is_forbidden_env = is_trusted_side_credential


def forbidden_values(environ: Mapping[str, str] | None = None) -> set[str]:
    """Values of forbidden variables in the controller's environment (long enough to matter)."""
    env = os.environ if environ is None else environ
    return {v for k, v in env.items() if is_forbidden_env(k) and len(v) >= 8}


def build_agent_env(
    *,
    passthrough: list[str] | tuple[str, ...] = (),
    constants: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The allowlisted environment of an agent process.

    ``PATH``, ``HOME``, ``LANG`` and the ``passthrough`` names are copied from
    ``environ`` (when set there); ``constants`` are set as given. Raises
    AgentConfigError for a forbidden name, or a value that carries a forbidden
    variable's value.
    """
    env_src = os.environ if environ is None else environ
    constants = dict(constants or {})
    for name in [*passthrough, *constants]:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise AgentConfigError(f"agent environment: {name!r} is not a valid variable name")
        if is_forbidden_env(name):
            raise AgentConfigError(
                f"agent environment: {name!r} is never passed to an agent (grader, signing, cloud "
                f"and data-source credentials stay on the trusted side; forbidden: {', '.join(FORBIDDEN_ENV_PATTERNS)})"
            )
    env = {k: env_src[k] for k in (*BASE_ENV, *passthrough) if k in env_src}
    env.update(constants)
    bad = forbidden_values(env_src)
    for k, v in env.items():
        if any(b in v for b in bad):
            raise AgentConfigError(
                f"agent environment: the value of {k!r} contains the value of a forbidden variable "
                "(a grader or cloud credential); refusing to start the agent"
            )
    return env


def redact(value: Any) -> Any:
    """An agent configuration fit to be evidence: the evidence rules (secret-sounding
    keys, secret-looking values), plus the value of any forbidden variable of the
    controller's environment wherever it appears."""
    return _replace_values(redact_evidence(value), forbidden_values())


def _replace_values(value: Any, bad: set[str]) -> Any:
    if not bad:
        return value
    if isinstance(value, Mapping):
        return {k: _replace_values(v, bad) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_replace_values(v, bad) for v in value]
    if isinstance(value, str):
        for b in bad:
            value = value.replace(b, REDACTED)
    return value
