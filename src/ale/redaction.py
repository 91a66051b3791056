"""One redaction rule for everything that becomes evidence or a log: agent
configurations, events, gateway records. Secret-sounding keys and
secret-looking values are replaced by ``***REDACTED***``.

And the one rule for what counts as a secret *name* (``is_secret_name``), which
the agents' environment (``ale.agents.secrets``), this redaction and the
sandbox's environment check (``ale.isolation``) share:

- ``is_trusted_side_credential``: the trusted side's credentials, never handed to
  an agent process or a sandbox whatever a configuration says: grader, signing and
  reference keys, cloud, cluster and data-source credentials, the Docker engine,
  the operator's SSH agent;
- ``is_secret_name``: those, and any secret-sounding name (key, token, secret,
  password, credential, authorization, cookie): its value is a secret.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***REDACTED***"

_SECRET_KEY = re.compile(r"key|token|secret|passw|credential|authori[sz]ation|auth(?!or)|cookie", re.IGNORECASE)

# Patterns (fnmatch, upper-case) of the trusted side's credentials.
TRUSTED_SIDE_CREDENTIALS = (
    "ALE_JUDGE_*",
    "ALE_GRADER_*",
    "ALE_SIGNING_*",
    "ALE_REFERENCE_*",
    "AWS_*",
    "GOOGLE_*",
    "GCLOUD_*",
    "GCP_*",
    "CLOUDSDK_*",
    "AZURE_*",
    "ARM_CLIENT_*",
    "DOCKER_*",
    "KUBECONFIG",
    "HF_*",
    "HUGGING_FACE_*",
    "SSH_AUTH_SOCK",
)


def is_trusted_side_credential(name: str) -> bool:
    """A variable of the trusted side (``TRUSTED_SIDE_CREDENTIALS``): never passed on."""
    up = name.upper()
    return any(fnmatch.fnmatchcase(up, p) for p in TRUSTED_SIDE_CREDENTIALS)


def is_secret_name(name: str) -> bool:
    """A name whose value is a secret: a trusted-side credential, or secret-sounding
    (key, token, secret, password, credential, authorization, cookie)."""
    return is_trusted_side_credential(name) or _SECRET_KEY.search(name) is not None
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
    return isinstance(key, str) and is_secret_name(key)


def redact(config: Any) -> Any:
    """A copy of ``config`` fit to be evidence.

    A non-empty string under a secret name (``is_secret_name``) becomes ``***REDACTED***``, and so does any
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


