"""One redaction rule for everything that becomes evidence or a log: agent
configurations, events, gateway records. Secret-sounding keys and
secret-looking values are replaced by ``***REDACTED***``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***REDACTED***"

_SECRET_KEY = re.compile(r"key|token|secret|passw|credential|authori[sz]ation|auth(?!or)|cookie", re.IGNORECASE)
_SECRET_VALUE = re.compile(
    r"sk-[A-Za-z0-9_\-]{8,}"  # OpenAI / Anthropic style keys
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub tokens
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face tokens
    r"|xox[abpors]-[A-Za-z0-9\-]{10,}"  # Slack tokens
    r"|AKIA[0-9A-Z]{16}"  # AWS access key ids
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/\-]{8,}=*"
)
# Markers that already stand for a removed secret (this module's and the agents').
REDACTION_MARKERS = frozenset({REDACTED, "<redacted>"})


def _secret_key(key: Any) -> bool:
    return isinstance(key, str) and _SECRET_KEY.search(key) is not None


def redact(config: Any) -> Any:
    """A copy of ``config`` fit to be evidence.

    A non-empty string under a secret-sounding key (key, token, secret, password,
    credential, authorization, cookie) becomes ``***REDACTED***``, and so does any
    secret-looking substring (``sk-…``, ``ghp_…``, ``Bearer …``) of any string.
    Numbers stay: ``max_tokens: 4096`` is configuration, not a secret.
    """
    if isinstance(config, Mapping):
        return {
            k: REDACTED if _secret_key(k) and isinstance(v, str) and v and v not in REDACTION_MARKERS else redact(v)
            for k, v in config.items()
        }
    if isinstance(config, list | tuple):
        return [redact(v) for v in config]
    if isinstance(config, str):
        return _SECRET_VALUE.sub(REDACTED, config)
    return config


def unredacted_secrets(obj: Any, prefix: str = "") -> list[str]:
    """Paths (``a.b[0]``) of values ``redact`` would still change: secrets left in clear."""
    if isinstance(obj, Mapping):
        out = []
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if _secret_key(k) and isinstance(v, str) and v and v not in REDACTION_MARKERS:
                out.append(path)
            else:
                out += unredacted_secrets(v, path)
        return out
    if isinstance(obj, list | tuple):
        return [p for i, v in enumerate(obj) for p in unredacted_secrets(v, f"{prefix}[{i}]")]
    if isinstance(obj, str) and _SECRET_VALUE.search(obj):
        return [prefix or "."]
    return []


