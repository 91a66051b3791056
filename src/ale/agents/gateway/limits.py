"""What the gateway forwards at all, besides the tool policy: the endpoints, the
model, the request's size, and the run's budgets.

``GatewayLimits`` is recorded in the gateway's ``gateway.start`` record
(``limits``), and ``refusal(...)`` is the one function that decides, for a request,
whether one of them refuses it; the gateway calls it before forwarding and
``record.derive`` (so ``ale verify``) calls it again on the recorded request, so a
forwarded request that should have been refused is caught from the record alone.

- ``model_calls_only``: only model calls are forwarded (``tools.is_model_call``:
  messages and token counting, chat completions and responses, generateContent
  and countTokens); every other path (files, batches, models, vector stores, ...)
  is refused (``endpoint``).
- ``models``: the run's model(s); a model call naming another model, or none, is
  refused (``model``).
- ``max_body_bytes``: a bigger request body is refused (``body_size``).
- ``local_only``: a model call that asks for provider-side state (OpenAI Responses
  ``previous_response_id``, ``background``, ``store: true``, ``conversation``;
  Anthropic ``container``) is refused (``provider_state``), and so is one holding a
  remote media or file reference instead of inline data (an image or document by URL or
  file id: Anthropic ``source.type`` ``url``/``file``, OpenAI ``image_url`` that is not a
  ``data:`` URL, ``file_id``, ``file_url``, Gemini ``fileData``) (``remote_media``):
  the conversation lives in the record and nowhere else;
- budgets (``max_requests``, ``max_input_tokens``, ``max_output_tokens``,
  ``max_cost_usd``, ``max_concurrency``): a model call past one is refused
  (``budget``), and the gateway's ``budget_reached`` ends the agent's turn as
  ``timeout`` with the reason (concurrency refuses the request only), named by
  ``spent(...)`` as an ``ale.status.AgentLimit``;
- retries (``retries``, ``retry_base_s``, ``retry_budget_s``): a model call the
  provider failed transiently (``ale.status.FailureOwner.PROVIDER``: rate limited,
  overloaded, a server error, a timeout, no connection) is sent again up to
  ``retries`` times, waiting ``retry_base_s`` doubled each time (or the provider's
  ``retry-after``, at most 60 s), while the run's waits stay within
  ``retry_budget_s`` seconds; ``upstream_timeout_s`` is the longest the gateway
  waits for the upstream's next bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ale.agents.errors import AgentConfigError
from ale.status import AgentLimit

BUDGET_KEYS = ("max_requests", "max_input_tokens", "max_output_tokens", "max_cost_usd", "max_concurrency")
RETRY_KEYS = ("retries", "retry_base_s", "retry_budget_s", "upstream_timeout_s")


@dataclass(frozen=True)
class GatewayLimits:
    model_calls_only: bool = False
    models: tuple[str, ...] = ()
    local_only: bool = False
    max_body_bytes: int | None = None
    max_requests: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost_usd: float | None = None
    max_concurrency: int | None = None
    retries: int = 4
    retry_base_s: float = 1.0
    retry_budget_s: float = 300.0
    upstream_timeout_s: float | None = 600.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["models"] = list(self.models)
        return d

    @classmethod
    def from_dict(cls, doc: dict[str, Any] | None) -> GatewayLimits:
        doc = dict(doc or {})
        doc["models"] = tuple(doc.get("models") or ())
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in doc.items() if k in known})

    @classmethod
    def from_config(cls, budgets: Any, *, models: tuple[str, ...], model_calls_only: bool,
                    max_body_bytes: int | None = 32 * 1024 * 1024) -> GatewayLimits:
        b = dict(budgets or {})
        unknown = set(b) - {*BUDGET_KEYS, *RETRY_KEYS, "max_body_bytes"}
        if unknown:
            raise AgentConfigError(f"budgets: unknown keys {sorted(unknown)}; known: "
                                   f"{', '.join((*BUDGET_KEYS, *RETRY_KEYS, 'max_body_bytes'))}")
        for k, v in b.items():
            zero_ok = k in ("retries", "retry_budget_s")  # no retries at all: 0
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or v < 0
                                  or (v == 0 and not zero_ok)):
                raise AgentConfigError(f"budgets: {k} must be a {'non-negative' if zero_ok else 'positive'} "
                                       f"number, not {v!r}")
        retry = {k: b[k] for k in RETRY_KEYS if k in b}
        return cls(model_calls_only=model_calls_only, models=models, local_only=model_calls_only,
                   max_body_bytes=b.get("max_body_bytes", max_body_bytes),
                   **{k: b.get(k) for k in BUDGET_KEYS}, **retry)  # type: ignore[arg-type]


def spent(limits: GatewayLimits, usage: dict[str, Any], requests: int | None) -> tuple[AgentLimit, str] | None:
    """Which of the run's budgets is spent and why (None while none is): ``usage`` is
    the gateway's running total, ``requests`` the model calls forwarded so far (None:
    not judged)."""
    if limits.max_requests is not None and requests is not None and requests >= limits.max_requests:
        return AgentLimit.MODEL_REQUESTS, f"the run's budget of {limits.max_requests} model requests is spent"
    for key, field in (("input_tokens", limits.max_input_tokens), ("output_tokens", limits.max_output_tokens)):
        if field is not None and int(usage.get(key) or 0) >= field:
            return AgentLimit(key), f"the run's budget of {field} {key.replace('_', ' ')} is spent ({usage.get(key)})"
    if limits.max_cost_usd is not None and float(usage.get("cost_usd") or 0) >= limits.max_cost_usd:
        return AgentLimit.COST, f"the run's budget of ${limits.max_cost_usd} is spent (${usage.get('cost_usd')})"
    return None


def budget_left(limits: GatewayLimits, usage: dict[str, Any], requests: int | None) -> str | None:
    """``spent``'s reason alone."""
    s = spent(limits, usage, requests)
    return None if s is None else s[1]


def refusal(limits: GatewayLimits, *, model_call: bool, model: str | None, body_bytes: int,
            body: Any = None) -> tuple[str, str] | None:
    """(kind, message) when the endpoint, the model, the body size or what the body
    asks for refuses the request; None when they let it through (budgets are judged
    by the gateway)."""
    if limits.model_calls_only and not model_call:
        return "endpoint", ("ale gateway: only model calls are forwarded (messages, responses, chat completions, "
                            "generateContent, token counting)")
    if limits.max_body_bytes is not None and body_bytes > limits.max_body_bytes:
        return "body_size", (f"ale gateway: the request body ({body_bytes} bytes) is over the run's limit of "
                             f"{limits.max_body_bytes}")
    if model_call and limits.models and model not in limits.models:
        return "model", f"ale gateway: model {model!r} is not the run's model ({', '.join(limits.models)})"
    if model_call and limits.local_only and isinstance(body, dict):
        state = provider_state(body)
        if state:
            return "provider_state", f"ale gateway: provider-side state is not allowed in this run ({', '.join(state)})"
        remote = remote_media(body)
        if remote:
            return "remote_media", ("ale gateway: only inline data is allowed; remote media or file references at "
                                    f"{', '.join(remote[:5])}")
    return None


def provider_state(body: dict[str, Any]) -> list[str]:
    """The body's requests for state kept by the provider."""
    out = [k for k in ("previous_response_id", "conversation", "container") if body.get(k)]
    if body.get("background") is True:
        out.append("background")
    if body.get("store") is True:
        out.append("store")
    return out


def remote_media(body: Any, where: str = "") -> list[str]:
    """Where the body refers to media or files by URL or id instead of holding them."""
    out: list[str] = []
    if isinstance(body, dict):
        src = body.get("source")
        if isinstance(src, dict) and src.get("type") in ("url", "file"):
            out.append(f"{where}.source")
        for key in ("file_id", "file_url", "fileData", "file_data"):
            if body.get(key):
                out.append(f"{where}.{key}")
        url = body.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if isinstance(url, str) and not url.startswith("data:"):
            out.append(f"{where}.image_url")
        for k, v in body.items():
            if isinstance(v, dict | list) and k not in ("tools", "functions"):
                out += remote_media(v, f"{where}.{k}")
    elif isinstance(body, list):
        for i, v in enumerate(body):
            out += remote_media(v, f"{where}[{i}]")
    return out
