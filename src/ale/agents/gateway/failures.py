"""What a model response says went wrong, in the provider's own words.

``classify(api, status, body, streamed)`` names a failed model request or a flagged
answer (``ale.status.ModelFailure``) from the upstream's status code and its error
body (or the SSE stream as it was passed through), the same way for the gateway as
it forwards and for ``record.derive`` (so ``ale verify``) on the recorded response:

- Anthropic: ``{"type": "error", "error": {"type": ..., "message": ...}}``:
  ``rate_limit_error`` (429; a spend limit, ``enforced_spend_limit_reached``, is a
  quota), ``overloaded_error`` (529), ``api_error`` (500), ``timeout_error`` (504),
  ``authentication_error`` (401), ``permission_error`` (403), ``billing_error``
  (402), ``not_found_error`` (404), ``invalid_request_error`` with ``prompt is too
  long`` (the context) or a credit balance (a quota); an ``error`` event in a stream;
  ``stop_reason: "refusal"``.
- OpenAI: ``{"error": {"type", "code", "message"}}``: ``rate_limit_exceeded``,
  ``insufficient_quota`` (both 429), ``invalid_api_key``, ``model_not_found``,
  ``context_length_exceeded``; Responses' ``response.failed`` and ``error`` events;
  ``finish_reason: "content_filter"``, a ``refusal`` message or output part.
- Gemini: ``{"error": {"code", "status", "message", "details"}}``:
  ``RESOURCE_EXHAUSTED`` (429; a per-day quota is a quota), ``UNAVAILABLE`` (503),
  ``DEADLINE_EXCEEDED`` (504), ``UNAUTHENTICATED``, ``PERMISSION_DENIED``,
  ``API_KEY_INVALID``, ``NOT_FOUND`` naming a model, ``INVALID_ARGUMENT`` with the
  input token count over the maximum; ``finishReason`` ``SAFETY``, ``PROHIBITED_CONTENT``,
  ``BLOCKLIST``, ``SPII``, and a prompt's ``blockReason``.

A 4xx the provider gives for a malformed request is the harness's own and not
named here (None), as is every success that is not a refusal.
"""

from __future__ import annotations

import json
from typing import Any

from ale.agents.gateway.tools import ANTHROPIC, GEMINI, OPENAI
from ale.agents.gateway.usage import sse_events
from ale.status import ModelFailure

GEMINI_BLOCKED = frozenset({"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "IMAGE_SAFETY"})
_CONTEXT_WORDS = ("prompt is too long", "context_length_exceeded", "maximum context length", "context window",
                  "exceeds the maximum number of tokens", "input is too long")
_QUOTA_WORDS = ("insufficient_quota", "credit balance", "spend limit", "enforced_spend_limit_reached",
                "billing", "perday")


def _docs(body: bytes, streamed: bool) -> list[Any]:
    if streamed:
        return sse_events(body)
    try:
        return [json.loads(body)] if body else []
    except (ValueError, RecursionError):
        return []


def _error_of(doc: Any) -> dict[str, Any] | None:
    """The error object of an error body or stream event (None when it holds none)."""
    if not isinstance(doc, dict):
        return None
    if doc.get("type") == "response.failed" and isinstance(doc.get("response"), dict):
        err = doc["response"].get("error")
        return err if isinstance(err, dict) else {"message": "response.failed"}
    err = doc.get("error")
    if isinstance(err, dict):
        return err
    if doc.get("type") == "error" and isinstance(doc.get("message"), str):  # Responses' stream error event
        return doc
    return None


def _error_class(status: int, err: dict[str, Any]) -> ModelFailure | None:
    kind = str(err.get("type") or "").lower()
    code = str(err.get("code") or "").lower()
    gstatus = str(err.get("status") or "").upper()
    text = json.dumps(err).lower()
    if any(w in text for w in _CONTEXT_WORDS) or ("input token count" in text and "exceeds" in text):
        return ModelFailure.CONTEXT_LENGTH
    if status == 402 or kind in ("billing_error", "insufficient_quota") or code == "insufficient_quota" or \
            any(w in text for w in _QUOTA_WORDS):
        return ModelFailure.QUOTA_EXHAUSTED
    if status in (401, 403) or kind in ("authentication_error", "permission_error") or code == "invalid_api_key" or \
            gstatus in ("UNAUTHENTICATED", "PERMISSION_DENIED") or "api_key_invalid" in text:
        return ModelFailure.AUTHENTICATION
    if code == "model_not_found" or (status == 404 and "model" in text):
        return ModelFailure.UNKNOWN_MODEL
    if status == 429 or kind == "rate_limit_error" or code == "rate_limit_exceeded" or gstatus == "RESOURCE_EXHAUSTED":
        return ModelFailure.RATE_LIMITED
    if status in (529, 503) or kind == "overloaded_error" or gstatus == "UNAVAILABLE" or "overloaded" in text:
        return ModelFailure.OVERLOADED
    if status in (408, 504) or kind == "timeout_error" or gstatus == "DEADLINE_EXCEEDED":
        return ModelFailure.PROVIDER_TIMEOUT
    if status >= 500 or kind in ("api_error", "server_error") or code == "server_error" or gstatus == "INTERNAL":
        return ModelFailure.SERVER_ERROR
    return None


def _refused(api: str, doc: Any) -> bool:
    if not isinstance(doc, dict):
        return False
    if api == ANTHROPIC:
        msg: dict[str, Any] = doc["message"] if isinstance(doc.get("message"), dict) else doc
        delta: dict[str, Any] = doc["delta"] if isinstance(doc.get("delta"), dict) else {}
        return msg.get("stop_reason") == "refusal" or delta.get("stop_reason") == "refusal"
    if api == OPENAI:
        r = doc["response"] if isinstance(doc.get("response"), dict) else doc
        for c in r.get("choices") or []:
            if not isinstance(c, dict):
                continue
            m: dict[str, Any] = c["message"] if isinstance(c.get("message"), dict) \
                else c["delta"] if isinstance(c.get("delta"), dict) else {}
            if c.get("finish_reason") == "content_filter" or m.get("refusal"):
                return True
        inc = r.get("incomplete_details")
        if isinstance(inc, dict) and inc.get("reason") == "content_filter":
            return True
        items = list(r.get("output") or [])
        if isinstance(doc.get("item"), dict):
            items.append(doc["item"])
        for item in items:
            if isinstance(item, dict) and any(isinstance(p, dict) and p.get("type") == "refusal"
                                              for p in item.get("content") or []):
                return True
        return False
    if api == GEMINI:
        fb = doc.get("promptFeedback")
        if isinstance(fb, dict) and fb.get("blockReason"):
            return True
        return any(isinstance(c, dict) and c.get("finishReason") in GEMINI_BLOCKED for c in doc.get("candidates") or [])
    return False


def classify(api: str, status: int, body: bytes, streamed: bool) -> ModelFailure | None:
    """The named failure of one upstream response to a model call, or None."""
    docs = _docs(body, streamed)
    if status >= 400:
        err = next((e for e in map(_error_of, docs) if e is not None), None)
        return _error_class(status, err or {})
    for d in docs:  # an error inside a stream that began with 200
        err = _error_of(d)
        if err is not None:
            return _error_class(0, err) or ModelFailure.SERVER_ERROR
    if any(_refused(api, d) for d in docs):
        return ModelFailure.REFUSAL
    return None


def transport_class(error_name: str) -> ModelFailure:
    """A request that got no response at all: timed out, or no connection."""
    return ModelFailure.PROVIDER_TIMEOUT if "Timeout" in error_name else ModelFailure.UNREACHABLE
