"""The model gateway: every model request of a run, through the trusted side.

``async with serve_gateway(gw) as url`` serves ``gw`` on ``127.0.0.1`` (a free
port; optionally also a unix socket, which a confined harness reaches through its
relay). Harnesses are pointed at ``{url}/openai/v1``, ``{url}/anthropic`` and
``{url}/gemini`` and hold only the run's token (as ``Authorization: Bearer``,
``x-api-key``, ``x-goog-api-key`` or ``?key=``); a request without it gets 401.
The gateway forwards to the upstream with the operator's key, which never
leaves this process, and passes the response (SSE included) through chunk by
chunk as it arrives.

Before a model request is forwarded, its tool declarations are extracted
(``tools.offered_tools``) and compared with the run's ``ToolPolicy``: a request
offering anything else is refused with 403 and an error naming the tools, in the
API's own error shape, and ``refused`` is set so the owner can end the turn.
Every request and response is recorded (``record.GatewayRecorder``).

A model call the provider fails is named (``failures.classify``: rate limited,
overloaded, a server error, a timeout, no connection, authentication, a quota,
an unknown model, the context length, a refusal). The provider's transient ones
are sent again with backoff within ``GatewayLimits``' retry budget, each failed
attempt recorded (``upstream_attempt``) and never shown to the harness; when the
last answer to a model call is still a failure that is not the agent's
(``ale.status.not_the_agents``), ``provider_failed`` is set and the owner ends
the agent's turn: the run is infrastructure's, never the agent's zero.

Usage and cost are kept per model from the provider's own usage fields
(``usage.usage_of``), priced with the run's table (``usage.price_table``: its
version and digest are recorded in ``gateway.start``). When the agent's turn
ends, ``end_turn()`` closes the gateway: a request after it is refused, recorded
(``turn_ended``) and never forwarded, so nothing spends after the turn.

A resumed run (``resume.py``: its folder holds a copy of an interrupted run's
record) is answered from that record while its model requests match the recorded
ones (canonical digest), without the upstream and without usage (``decision:
replayed``, a response ``by: replay``); from the first that differs, or after the
last recorded one, everything is forwarded (a ``resume.live`` record says where and
why). The agent cannot tell: every agent kind reaches its model through here.

The HTTP client is ``httpx2`` (what the ``openai`` SDK, already a dependency,
uses), the server uvicorn (as the MCP bridge): no new dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx2 as httpx

from ale.agents.gateway.failures import classify, transport_class
from ale.agents.gateway.limits import GatewayLimits, refusal, spent
from ale.agents.gateway.record import GatewayRecorder, redact_headers, redact_query
from ale.agents.gateway.resume import RecordedTurn, Replayer, load_resume
from ale.agents.gateway.tools import (
    ANTHROPIC,
    APIS,
    GEMINI,
    OPENAI,
    ToolPolicy,
    is_model_call,
    offered_tools,
)
from ale.agents.gateway.turns import write_turns
from ale.agents.gateway.usage import add_billing, cost, price_table, usage_of
from ale.agents.loopback import loopback_socket, serve_asgi
from ale.status import FAILURE_OWNER, AgentLimit, FailureOwner, ModelFailure, not_the_agents

log = logging.getLogger(__name__)

DEFAULT_UPSTREAMS = {
    OPENAI: "https://api.openai.com/v1",
    ANTHROPIC: "https://api.anthropic.com",
    GEMINI: "https://generativelanguage.googleapis.com",
}
UPSTREAM_VARS = {OPENAI: "ALE_GATEWAY_OPENAI_UPSTREAM", ANTHROPIC: "ALE_GATEWAY_ANTHROPIC_UPSTREAM",
                 GEMINI: "ALE_GATEWAY_GEMINI_UPSTREAM"}
# The operator's keys, read from the controller's own environment (first set wins).
KEY_VARS = {OPENAI: ("OPENAI_API_KEY", "CODEX_API_KEY"), ANTHROPIC: ("ANTHROPIC_API_KEY",), GEMINI: ("GEMINI_API_KEY",)}
# Each API's path prefix on the gateway (what the harness's base URL ends with).
PREFIXES = {OPENAI: "/openai/v1", ANTHROPIC: "/anthropic", GEMINI: "/gemini"}
_HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                  "proxy-authorization", "proxy-connection", "content-length", "accept-encoding", "authorization",
                  "x-api-key", "x-goog-api-key"})
_HOP_RESPONSE = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                           "content-encoding"})


def resolve_upstreams(config: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Config key, then the controller's environment variable, then the public endpoint."""
    env = os.environ if environ is None else environ
    c = config or {}
    return {api: str(c.get(var) or env.get(var) or DEFAULT_UPSTREAMS[api]).rstrip("/")
            for api, var in UPSTREAM_VARS.items()}


def resolve_keys(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {api: next((env[v] for v in names if env.get(v)), "") for api, names in KEY_VARS.items()}


def _error(api: str, status: int, message: str) -> bytes:
    if api == ANTHROPIC:
        kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}.get(status, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    if api == GEMINI:
        st = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}.get(status, "UNAVAILABLE")
        return json.dumps({"error": {"code": status, "message": message, "status": st}}).encode()
    code = "ale_tool_not_allowed" if status == 403 else None
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}}).encode()


class ModelGateway:
    """One run's gateway (an ASGI app). ``refused`` is set at the first refusal."""

    def __init__(
        self,
        run_dir: Path,
        policy: ToolPolicy,
        *,
        upstreams: dict[str, str] | None = None,
        keys: dict[str, str] | None = None,
        prices: dict[str, Any] | None = None,
        token: str | None = None,
        transport: Any = None,
        limits: GatewayLimits | None = None,
    ):
        self.policy = policy
        self.limits = limits or GatewayLimits()
        # Refusals of the endpoint, model, size or budget kind (recorded; they end no run).
        self.blocked: list[dict[str, Any]] = []
        self.budget_reached = asyncio.Event()  # the owner ends the agent's turn as timeout
        self.budget_reason: str | None = None
        self.budget_kind: AgentLimit | None = None
        # A model call the provider failed past the retries (not the agent's): the owner ends the turn.
        self.provider_failed = asyncio.Event()
        self.provider_failure: dict[str, Any] | None = None
        self.failures: list[dict[str, Any]] = []  # every named failure of a model call's last answer
        self.retry_waited_s = 0.0
        self.turn_ended = False
        self.in_flight = 0
        self.model_calls = 0
        self.upstreams = upstreams or resolve_upstreams()
        self._keys = keys if keys is not None else resolve_keys()
        self.price_version, self.prices = price_table(prices)
        self.billing: dict[str, dict[str, Any]] = {}  # model -> requests, tokens, cost
        self.token = token or "ale-run-" + secrets.token_urlsafe(32)
        self._auth_values = {self.token.encode(), f"Bearer {self.token}".encode()}
        self.recorder = GatewayRecorder(run_dir)
        # A resumed run (resume.py): the recorded model turns are answered from the source's record.
        resume = load_resume(run_dir)
        self.replayer = Replayer(run_dir, resume) if resume is not None else None
        self.replayed = 0
        self.went_live: dict[str, Any] | None = None
        self.refused = asyncio.Event()
        self.refusals: list[dict[str, Any]] = []
        self.answered = False  # a model response reached the harness
        self.requests = 0
        self.unauthorized = 0
        self.usage: dict[str, Any] = {"requests": 0, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=30.0, read=self.limits.upstream_timeout_s, write=60.0, pool=60.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            transport=transport,
            trust_env=False,
        )
        self.recorder.append(
            "gateway.start",
            policy=policy.to_dict(),
            upstreams=self.upstreams,
            keys_configured=sorted(api for api, k in self._keys.items() if k),
            prices=self.prices,
            price_table={"version": self.price_version, "sha256": _digest(self.prices)},
            limits=self.limits.to_dict(),
            **({"resume": {k: resume.get(k) for k in ("from_run", "run_id", "source_head", "source_turns")}}
               if resume else {}),
        )

    def end_turn(self) -> None:
        """The agent's turn is over: from now on every request is refused, unforwarded."""
        self.turn_ended = True

    async def aclose(self) -> None:
        self.turn_ended = True
        await self.client.aclose()
        self.recorder.append("gateway.end", requests=self.requests, unauthorized=self.unauthorized, usage=self.usage)
        self.recorder.close()
        try:
            write_turns(self.recorder.run_dir)
        except Exception as e:  # the model-side trajectory is a view; the record stands without it
            log.warning("model gateway: cannot write the model turns: %r", e)

    # -- ASGI ----------------------------------------------------------------
    def _authorized(self, scope: dict[str, Any], query: list[tuple[str, str]]) -> bool:
        for k, v in scope.get("headers", []):
            if k.lower() in (b"authorization", b"x-api-key", b"x-goog-api-key") \
                    and any(hmac.compare_digest(v, a) for a in self._auth_values):
                return True
        return any(k == "key" and hmac.compare_digest(v.encode(), self.token.encode()) for k, v in query)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        api = next((a for a in APIS if path == PREFIXES[a] or path.startswith(PREFIXES[a] + "/")), None)
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if not self._authorized(scope, query):
            self.unauthorized += 1
            await _respond(send, 401, _error(api or OPENAI, 401, "ale gateway: this run's token is required"))
            return
        if api is None:
            await _respond(send, 404,
                           _error(OPENAI, 404,
                                  f"ale gateway: no API under {path!r}; use /openai/v1, /anthropic or /gemini"))
            return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        await self._exchange(api, scope, path[len(PREFIXES[api]):] or "/", query, body, send)

    async def _exchange(self, api: str, scope: dict[str, Any], rest: str, query: list[tuple[str, str]], body: bytes,
                        send: Any) -> None:
        t0 = time.perf_counter()
        self.requests += 1
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        method = scope["method"]
        model_call = method == "POST" and is_model_call(api, rest)
        parsed: Any = None
        if body:
            with contextlib.suppress(ValueError, RecursionError):
                parsed = json.loads(body)
        tools = offered_tools(api, rest, parsed) if model_call else []
        forbidden = self.policy.forbidden(tools)
        model = parsed.get("model") if isinstance(parsed, dict) else None
        if api == GEMINI and "/models/" in rest:
            model = rest.split("/models/", 1)[1].split(":", 1)[0]
        seq = self.recorder.seq + 1
        model = model if isinstance(model, str) else None
        blocked = None if forbidden else refusal(self.limits, model_call=model_call, model=model,
                                                 body_bytes=len(body), body=parsed)
        if self.turn_ended:
            blocked = ("turn_ended", "ale gateway: the agent's turn has ended; nothing more is forwarded")
        if blocked is None and not forbidden and model_call:
            left = spent(self.limits, self.usage, self.model_calls)
            if self.budget_reason is not None or left is not None:
                blocked = ("budget", f"ale gateway: {self.budget_reason or (left[1] if left else '')}")
                if left is not None and self.budget_kind is None:
                    self.budget_kind = left[0]
            elif self.limits.max_concurrency is not None and self.in_flight >= self.limits.max_concurrency:
                blocked = ("concurrency", f"ale gateway: {self.in_flight} model requests in flight, the run's limit")
        if forbidden and self.policy.client_tools:
            # A native harness: its flags switch server-side tools off, so only a candidate's own
            # request offers one; refused, recorded, and the run goes on (it gains nothing).
            blocked = ("server_tool", f"ale gateway: server-side tools and hosted connectors are withheld in this run: "
                                      f"{', '.join(forbidden)}; the request did not reach the model")
        replay: RecordedTurn | None = None
        if self.replayer is not None and model_call and blocked is None and not forbidden:
            replay, live = self.replayer.take(api, method, rest, body)
            if live is not None:  # the divergence, or past the last recorded turn: live from here, shown
                self.went_live = live
                self.recorder.append("resume.live", **live)
                log.info("model gateway: resumed run goes live at turn %s (%s)", live["turn"], live["why"])
                seq = self.recorder.seq + 1
        decision = "refused" if forbidden or blocked else "replayed" if replay is not None else "forwarded"
        self.recorder.append(
            "request", api=api, method=method, path=rest, query=redact_query(query), headers=redact_headers(headers),
            body=self.recorder.body(seq, "request", body), model_call=model_call, model=model,
            tools=tools, forbidden=forbidden, decision=decision, **({"refused_for": blocked[0]} if blocked else {}),
        )
        if replay is not None:
            self.model_calls += 1
            await self._replay(replay, send, seq, t0)
            return
        if blocked is not None:
            kind, msg = blocked
            status = {"endpoint": 404, "body_size": 413, "budget": 429, "concurrency": 429,
                      "turn_ended": 409}.get(kind, 403)
            self.blocked.append({"seq": seq, "kind": kind, "path": rest, "model": model})
            data = _error(api, status, msg)
            await _respond(send, status, data)
            self.recorder.append("response", request=seq, status=status, headers=[],
                                 body=self.recorder.body(seq + 1, "response", data),
                                 streamed=False, model_call=model_call, by="gateway",
                                 seconds=round(time.perf_counter() - t0, 6))
            if kind == "budget":
                self.budget_reason = self.budget_reason or msg.removeprefix("ale gateway: ")
                self.budget_reached.set()
            return
        if forbidden:
            first = not self.answered
            self.refusals.append({"seq": seq, "forbidden": forbidden, "before_any_answer": first})
            msg = ("ale gateway: this request offers the model tool(s) outside the run's allowlist: "
                   f"{', '.join(forbidden)}. Allowed: the bridge's tools {list(self.policy.allowlist)} (as "
                   "mcp__ale__<tool>, mcp_ale_<tool> or <tool>)"
                   + (f" and the harness profile {self.policy.profile.name!r}'s {sorted(self.policy.profile.allow)}"
                      if self.policy.profile.allow else "")
                   + ". Switch the harness's own tools off; the request did not reach the model.")
            data = _error(api, 403, msg)
            await _respond(send, 403, data)
            self.recorder.append("response", request=seq, status=403, headers=[],
                                 body=self.recorder.body(seq + 1, "response", data),
                                 streamed=False, model_call=model_call, by="gateway",
                                 seconds=round(time.perf_counter() - t0, 6))
            self.refused.set()
            return
        if model_call:
            self.model_calls += 1
        self.in_flight += 1
        try:
            await self._forward(api, method, rest, query, headers, body, send, seq, model_call, t0)
        finally:
            self.in_flight -= 1
        left = spent(self.limits, self.usage, None) if model_call else None
        if left is not None:
            # Tokens or cost spent: the turn ends now (a request budget ends it at the next request).
            if self.budget_reason is None:
                self.budget_kind, self.budget_reason = left
            self.budget_reached.set()

    async def _forward(self, api: str, method: str, rest: str, query: list[tuple[str, str]],
                       headers: list[tuple[str, str]],
                       body: bytes, send: Any, seq: int, model_call: bool, t0: float) -> None:
        out_headers = [(k, v) for k, v in headers if k.lower() not in _HOP]
        out_headers.append(("accept-encoding", "identity"))  # the record reads the bytes the harness gets
        key = self._keys.get(api, "")
        if key:
            out_headers.append({OPENAI: ("authorization", f"Bearer {key}"), ANTHROPIC: ("x-api-key", key),
                                GEMINI: ("x-goog-api-key", key)}[api])
        q = [(k, v) for k, v in query if k != "key"]
        url = self.upstreams[api] + rest + (("?" + urlencode(q)) if q else "")
        collected = bytearray()
        status, streamed, first_byte = 502, False, None
        resp_headers: list[tuple[str, str]] = []
        failure: ModelFailure | None = None
        transport_error: str | None = None
        attempt = 0
        while True:
            resp = None
            transport_error = None
            try:
                req = self.client.build_request(method, url, headers=out_headers, content=body or None)
                resp = await self.client.send(req, stream=True)
            except httpx.HTTPError as e:
                transport_error = type(e).__name__
                failure = transport_class(transport_error) if model_call else None
                data = _error(api, 502,
                              f"ale gateway: the upstream {self.upstreams[api]} cannot be reached: "
                              f"{type(e).__name__}: {e}")
                status, resp_headers, streamed = 502, [], False
            else:
                status = resp.status_code
                resp_headers = [(k, v) for k, v in resp.headers.items() if k.lower() not in _HOP_RESPONSE]
                streamed = resp.headers.get("content-type", "").startswith("text/event-stream")
                failure = None
                if status >= 400:  # an error body is small: read whole, named, maybe retried
                    try:
                        data = await resp.aread()
                    except httpx.HTTPError as e:
                        data, transport_error = b"", type(e).__name__
                    finally:
                        await resp.aclose()
                    failure = classify(api, status, data, streamed) if model_call else None
                    if transport_error and model_call:
                        failure = transport_class(transport_error)
            wait = self._retry_wait(failure, attempt, resp_headers) if failure is not None else None
            if wait is None:
                break
            # A transient failure of the provider's: recorded, not shown to the harness, sent again.
            self.recorder.append(
                "upstream_attempt", request=seq, attempt=attempt + 1, status=status,
                headers=redact_headers(resp_headers),
                body=self.recorder.body(seq, f"attempt{attempt + 1}", data), streamed=streamed,
                failure=failure.value if failure else None, transport_error=transport_error, wait_s=round(wait, 3),
                seconds=round(time.perf_counter() - t0, 6))
            self.retry_waited_s += wait
            attempt += 1
            await asyncio.sleep(wait)
        if resp is None or status >= 400:
            await _respond(send, status, data, resp_headers if resp is not None else None)
            collected += data
        else:
            try:
                await send({"type": "http.response.start", "status": status,
                            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp_headers]})
                async for chunk in resp.aiter_raw():
                    if first_byte is None:
                        first_byte = time.perf_counter() - t0
                    collected += chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                await resp.aclose()
            if model_call:
                failure = classify(api, status, bytes(collected), streamed)
        data = bytes(collected)
        usage: dict[str, Any] = {}
        if model_call and 200 <= status < 300:
            self.answered = True
            usage = {"requests": 1, **usage_of(api, data, streamed)}
            price = cost(usage, usage.get("model"), self.prices)
            if price is not None:
                usage["cost_usd"] = price
            self._add_usage(usage)
            add_billing(self.billing, usage)
        if failure is not None:
            entry = {"request": seq, "failure": failure.value, "owner": FAILURE_OWNER[failure].value, "status": status,
                     "retries": attempt}
            self.failures.append(entry)
            if not_the_agents(failure) and not (200 <= status < 300) and self.provider_failure is None:
                self.provider_failure = entry
                self.provider_failed.set()
        self.recorder.append(
            "response", request=seq, status=status, headers=redact_headers(resp_headers),
            body=self.recorder.body(seq + 1, "response", data), streamed=streamed, model_call=model_call, by="upstream",
            usage={k: v for k, v in usage.items() if k != "model"}, model=usage.get("model"),
            **({"failure": failure.value, "retries": attempt} if failure is not None else {}),
            **({"transport_error": transport_error} if transport_error else {}),
            first_byte_s=None if first_byte is None else round(first_byte, 6),
            seconds=round(time.perf_counter() - t0, 6),
        )

    async def _replay(self, turn: RecordedTurn, send: Any, seq: int, t0: float) -> None:
        """Answer with the source run's recorded response, without the upstream; no usage (never billed)."""
        headers = [(k, v) for k, v in turn.headers if k.lower() != "content-length"]
        await _respond(send, turn.status, turn.data, headers)
        self.answered = True
        self.replayed += 1
        self.recorder.append(
            "response", request=seq, status=turn.status, headers=redact_headers(headers),
            body=self.recorder.body(seq + 1, "response", turn.data), streamed=turn.streamed,
            model_call=True, by="replay", usage={}, model=turn.model,
            replay_of={"turn": turn.turn, "request": turn.request, "response": turn.response,
                       "digest": turn.digest_response},
            seconds=round(time.perf_counter() - t0, 6))

    def _add_usage(self, u: dict[str, Any]) -> None:
        for k in ("requests", "input_tokens", "output_tokens", "total_tokens", "cached_input_tokens"):
            if u.get(k):
                self.usage[k] = self.usage.get(k, 0) + u[k]
        if "cost_usd" in u:
            self.usage["cost_usd"] = round(self.usage.get("cost_usd", 0.0) + u["cost_usd"], 8)

    def _retry_wait(self, failure: ModelFailure | None, attempt: int, headers: list[tuple[str, str]]) -> float | None:
        """Seconds to wait before sending a failed model call again, or None: not the
        provider's transient failure, or the retries or their time are spent."""
        if failure is None or FAILURE_OWNER[failure] is not FailureOwner.PROVIDER or attempt >= self.limits.retries:
            return None
        wait = self.limits.retry_base_s * (2 ** attempt)
        h = {k.lower(): v for k, v in headers}
        with contextlib.suppress(ValueError):
            if "retry-after-ms" in h:
                wait = float(h["retry-after-ms"]) / 1000
            elif "retry-after" in h:
                wait = float(h["retry-after"])
        wait = min(max(wait, 0.0), 60.0)
        if self.retry_waited_s + wait > self.limits.retry_budget_s:
            return None
        return wait

    def summary(self) -> dict[str, Any]:
        return {"requests": self.requests, "unauthorized": self.unauthorized, "refusals": list(self.refusals),
                "usage": dict(self.usage), "blocked": list(self.blocked), "budget_reached": self.budget_reason}


async def _respond(send: Any, status: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> None:
    """A whole response: the gateway's own (JSON), or an upstream's error as it came."""
    if headers is None:
        hs = [(b"content-type", b"application/json")]
    else:
        hs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers if k.lower() != "content-length"]
    await send({"type": "http.response.start", "status": status,
                "headers": [*hs, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def serve_gateway(gateway: ModelGateway, *, unix_path: Path | None = None) -> AsyncIterator[str]:
    """Serve on 127.0.0.1 (and ``unix_path`` when given); yields ``http://127.0.0.1:PORT``.
    Closes the gateway (its client and record) when the block ends."""
    socks = [loopback_socket()]
    if unix_path is not None:
        us = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        us.bind(str(unix_path))
        os.chmod(unix_path, 0o600)
        us.listen(128)
        us.setblocking(False)
        socks.append(us)
    try:
        async with serve_asgi(gateway, socks, what="model gateway") as port:
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                gateway.end_turn()  # refused from here, while the server winds down
    finally:
        await gateway.aclose()


def _digest(doc: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def harness_env(url: str, token: str) -> dict[str, str]:
    """What an external harness is given: base URLs pointing at the gateway and the
    run's token in place of every API key (never the operator's keys)."""
    return {
        "OPENAI_BASE_URL": f"{url}{PREFIXES[OPENAI]}",
        "ANTHROPIC_BASE_URL": f"{url}{PREFIXES[ANTHROPIC]}",
        "GOOGLE_GEMINI_BASE_URL": f"{url}{PREFIXES[GEMINI]}",
        "OPENAI_API_KEY": token,
        "CODEX_API_KEY": token,
        "ANTHROPIC_API_KEY": token,
        "GEMINI_API_KEY": token,
    }
