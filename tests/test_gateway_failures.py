"""Failures the model's provider caused, named and retried by the gateway; cost per
model from the provider's own usage fields; nothing forwarded after the agent's turn.
The fake upstream (tests/fake_model_api.py) injects each failure in its API's own shape."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx2 as httpx
import pytest

from ale.agents.gateway.failures import classify
from ale.agents.gateway.limits import GatewayLimits
from ale.agents.gateway.record import summarize
from ale.agents.gateway.server import ModelGateway, serve_gateway
from ale.agents.gateway.tools import ToolPolicy
from ale.status import FAILURE_OWNER, FailureOwner, ModelFailure, not_the_agents
from tests.fake_model_api import FakeModelAPI

KEY = "sk-operator-key-0123456789abcdef"
F = ModelFailure


def _ant(kind: str, message: str = "x") -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _oai(code: str | None, message: str = "x", kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "code": code}}


def _gem(code: int, status: str, message: str = "x", details: list | None = None) -> dict:
    return {"error": {"code": code, "status": status, "message": message, "details": details or []}}


def _sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


@pytest.mark.parametrize(("api", "status", "body", "want"), [
    # Anthropic (docs.claude.com/en/api/errors)
    ("anthropic", 429, _ant("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"), F.RATE_LIMITED),
    ("anthropic", 429, {"type": "error", "error": {"type": "rate_limit_error", "message": "spend",
                                                   "details": {"error_code": "enforced_spend_limit_reached"}}}, F.QUOTA_EXHAUSTED),
    ("anthropic", 529, _ant("overloaded_error", "Overloaded"), F.OVERLOADED),
    ("anthropic", 500, _ant("api_error", "Internal server error"), F.SERVER_ERROR),
    ("anthropic", 504, _ant("timeout_error", "Request timed out"), F.PROVIDER_TIMEOUT),
    ("anthropic", 401, _ant("authentication_error", "invalid x-api-key"), F.AUTHENTICATION),
    ("anthropic", 403, _ant("permission_error", "no access"), F.AUTHENTICATION),
    ("anthropic", 402, _ant("billing_error", "payment"), F.QUOTA_EXHAUSTED),
    ("anthropic", 400, _ant("invalid_request_error", "Your credit balance is too low to access the Anthropic API"), F.QUOTA_EXHAUSTED),
    ("anthropic", 404, _ant("not_found_error", "model: claude-nonexistent"), F.UNKNOWN_MODEL),
    ("anthropic", 400, _ant("invalid_request_error", "prompt is too long: 210351 tokens > 200000 maximum"), F.CONTEXT_LENGTH),
    ("anthropic", 400, _ant("invalid_request_error", "messages: field required"), None),  # the harness's own bad request
    ("anthropic", 200, {"type": "message", "content": [], "stop_reason": "refusal", "usage": {}}, F.REFUSAL),
    ("anthropic", 200, {"type": "message", "content": [], "stop_reason": "end_turn", "usage": {}}, None),
    # OpenAI
    ("openai", 429, _oai("rate_limit_exceeded", "Rate limit reached for gpt-x", "requests"), F.RATE_LIMITED),
    ("openai", 429, _oai("insufficient_quota", "You exceeded your current quota", "insufficient_quota"), F.QUOTA_EXHAUSTED),
    ("openai", 401, _oai("invalid_api_key", "Incorrect API key provided"), F.AUTHENTICATION),
    ("openai", 404, _oai("model_not_found", "The model `gpt-9` does not exist"), F.UNKNOWN_MODEL),
    ("openai", 400, _oai("context_length_exceeded", "This model's maximum context length is 128000 tokens"), F.CONTEXT_LENGTH),
    ("openai", 503, _oai(None, "The engine is currently overloaded", "server_error"), F.OVERLOADED),
    ("openai", 500, _oai(None, "The server had an error", "server_error"), F.SERVER_ERROR),
    ("openai", 200, {"choices": [{"message": {"content": None, "refusal": "I can't help"}, "finish_reason": "stop"}]}, F.REFUSAL),
    ("openai", 200, {"choices": [{"message": {"content": ""}, "finish_reason": "content_filter"}]}, F.REFUSAL),
    ("openai", 200, {"object": "response", "output": [{"type": "message", "content": [{"type": "refusal", "refusal": "no"}]}]}, F.REFUSAL),
    # Gemini
    ("gemini", 429, _gem(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted"), F.RATE_LIMITED),
    ("gemini", 429, _gem(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota",
                         [{"violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}]), F.QUOTA_EXHAUSTED),
    ("gemini", 503, _gem(503, "UNAVAILABLE", "The model is overloaded. Please try again later."), F.OVERLOADED),
    ("gemini", 504, _gem(504, "DEADLINE_EXCEEDED", "Deadline expired"), F.PROVIDER_TIMEOUT),
    ("gemini", 400, _gem(400, "INVALID_ARGUMENT", "API key not valid.", [{"reason": "API_KEY_INVALID"}]), F.AUTHENTICATION),
    ("gemini", 404, _gem(404, "NOT_FOUND", "models/gemini-9 is not found for API version v1beta"), F.UNKNOWN_MODEL),
    ("gemini", 400, _gem(400, "INVALID_ARGUMENT", "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."),
     F.CONTEXT_LENGTH),
    ("gemini", 200, {"candidates": [{"finishReason": "SAFETY", "content": {"parts": []}}]}, F.REFUSAL),
    ("gemini", 200, {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}, F.REFUSAL),
    ("gemini", 200, {"candidates": [{"finishReason": "STOP", "content": {"parts": [{"text": "ok"}]}}]}, None),
])
def test_each_providers_failure_is_named_in_its_own_words(api, status, body, want):
    assert classify(api, status, json.dumps(body).encode(), False) == want


def test_failures_inside_a_stream_are_named():
    ant = _sse({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}, _ant("overloaded_error", "Overloaded"))
    assert classify("anthropic", 200, ant, True) is F.OVERLOADED
    refusal = _sse({"type": "message_delta", "delta": {"stop_reason": "refusal"}, "usage": {"output_tokens": 1}})
    assert classify("anthropic", 200, refusal, True) is F.REFUSAL
    failed = _sse({"type": "response.failed", "response": {"error": {"code": "rate_limit_exceeded", "message": "slow down"}}})
    assert classify("openai", 200, failed, True) is F.RATE_LIMITED


def test_whose_failure_it_is():
    assert {f for f in F if FAILURE_OWNER[f] is FailureOwner.AGENT} == {F.CONTEXT_LENGTH, F.REFUSAL}
    assert not_the_agents(F.RATE_LIMITED) and not_the_agents(F.AUTHENTICATION) and not not_the_agents(F.CONTEXT_LENGTH)


def _gateway(run_dir: Path, fake: FakeModelAPI, **limits) -> ModelGateway:
    return ModelGateway(run_dir, ToolPolicy(("shell",)), keys={"openai": KEY, "anthropic": KEY, "gemini": KEY},
                        upstreams={"openai": fake.url + "/v1", "anthropic": fake.url, "gemini": fake.url},
                        prices={"version": "test-2026-12", "models": {
                            "gpt-fake": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_input_per_mtok": 0.5},
                            "claude-fake": {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cached_input_per_mtok": 0.3}}},
                        limits=GatewayLimits(retry_base_s=0.01, **limits))


CHAT = ("/openai/v1/chat/completions", {"model": "gpt-fake", "messages": [{"role": "user", "content": "hi"}]})
MESSAGES = ("/anthropic/v1/messages", {"model": "claude-fake", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})


async def _calls(gw: ModelGateway, calls: list[tuple[str, dict]]) -> list[httpx.Response]:
    out = []
    async with serve_gateway(gw) as url, httpx.AsyncClient(timeout=30) as c:
        for path, body in calls:
            out.append(await c.post(url + path, headers={"authorization": f"Bearer {gw.token}", "x-api-key": gw.token}, json=body))
    return out


def _fake(**kw) -> FakeModelAPI:
    return FakeModelAPI(**kw).start()


def test_transient_failures_are_retried_with_backoff_and_not_shown_to_the_harness(tmp_path):
    fake = _fake(faults=[(429, _ant("rate_limit_error", "slow"), {"retry-after": "0.05"}), (529, _ant("overloaded_error", "Overloaded"), {})])
    try:
        gw = _gateway(tmp_path, fake)
        (r,) = asyncio.run(_calls(gw, [MESSAGES]))
    finally:
        fake.stop()
    assert r.status_code == 200 and len(fake.requests) == 3
    assert not gw.provider_failed.is_set() and gw.failures == []
    s = summarize(tmp_path)
    assert s is not None and not s["problems"], s["problems"]
    assert s["retries"] == 2 and s["provider_failure"] is None and s["last_failure"] is None
    attempts = [json.loads(x) for x in (tmp_path / "agent" / "gateway" / "records.jsonl").read_text().splitlines()]
    assert [(a["failure"], a["wait_s"]) for a in attempts if a["type"] == "upstream_attempt"] == [("rate_limited", 0.05), ("overloaded", 0.02)]


@pytest.mark.parametrize(("fault", "want", "tries"), [
    ((503, _oai(None, "overloaded", "server_error"), {}), F.OVERLOADED, 3),  # retried twice, then it is infrastructure's
    ((401, _oai("invalid_api_key", "Incorrect API key"), {}), F.AUTHENTICATION, 1),  # never retried: a retry cannot change it
    ((429, _oai("insufficient_quota", "quota", "insufficient_quota"), {}), F.QUOTA_EXHAUSTED, 1),
    ((404, _oai("model_not_found", "no such model"), {}), F.UNKNOWN_MODEL, 1),
])
def test_a_failure_that_is_not_the_agents_ends_the_turn_as_the_providers(tmp_path, fault, want, tries):
    fake = _fake(faults=[fault] * 5)
    try:
        gw = _gateway(tmp_path, fake, retries=2)
        (r,) = asyncio.run(_calls(gw, [CHAT]))
    finally:
        fake.stop()
    assert r.status_code == fault[0] and r.json() == fault[1]  # the harness sees the provider's own answer
    assert len(fake.requests) == tries
    assert gw.provider_failed.is_set() and gw.provider_failure is not None and gw.provider_failure["failure"] == want.value
    s = summarize(tmp_path)
    assert s is not None and not s["problems"] and s["provider_failure"]["failure"] == want.value and s["retries"] == tries - 1
    assert gw.usage["requests"] == 0 and s["billing"]["total"] == {}  # nothing answered, nothing billed


def test_the_agents_own_failures_are_passed_on_and_say_so(tmp_path):
    fake = _fake(faults=[(400, _oai("context_length_exceeded", "maximum context length is 8 tokens"), {})])
    try:
        gw = _gateway(tmp_path, fake)
        rs = asyncio.run(_calls(gw, [CHAT, CHAT]))
    finally:
        fake.stop()
    assert [r.status_code for r in rs] == [400, 200] and len(fake.requests) == 2  # not retried; the harness went on
    assert not gw.provider_failed.is_set() and gw.failures[0]["failure"] == "context_length" and gw.failures[0]["owner"] == "agent"
    s = summarize(tmp_path)
    assert s is not None and not s["problems"] and s["last_failure"] is None and s["failures"][0]["failure"] == "context_length"


def test_retries_stop_at_the_runs_retry_budget(tmp_path):
    fake = _fake(faults=[(529, _ant("overloaded_error", "Overloaded"), {"retry-after": "0.2"})] * 10)
    try:
        gw = _gateway(tmp_path, fake, retries=10, retry_budget_s=0.5)
        (r,) = asyncio.run(_calls(gw, [MESSAGES]))
    finally:
        fake.stop()
    assert r.status_code == 529 and len(fake.requests) == 3 and gw.retry_waited_s == pytest.approx(0.4)  # a third wait is over 0.5 s
    assert gw.provider_failure is not None and gw.provider_failure["failure"] == "overloaded"


def test_cost_per_model_adds_up_to_the_upstreams_own_count(tmp_path):
    fake = _fake(varied_usage=True)
    try:
        gw = _gateway(tmp_path, fake)
        stream = (CHAT[0], {**CHAT[1], "stream": True, "stream_options": {"include_usage": True}})
        rs = asyncio.run(_calls(gw, [CHAT, stream, MESSAGES, (MESSAGES[0], {**MESSAGES[1], "stream": True}), CHAT]))
    finally:
        fake.stop()
    assert all(r.status_code == 200 for r in rs)
    s = summarize(tmp_path)
    assert s is not None and not s["problems"], s["problems"]
    b = s["billing"]
    assert b["price_table"]["version"] == "test-2026-12" and len(b["price_table"]["sha256"]) == 64
    total = b["total"]
    assert (total["input_tokens"], total["output_tokens"], total["cached_input_tokens"], total["requests"]) == (
        fake.served["input_tokens"], fake.served["output_tokens"], fake.served["cached_input_tokens"], fake.served["answers"])
    # Request n (1..5) reported 100+n input (n cached) and 20+n output; 1, 2 and 5 were gpt-fake's, 3 and 4 claude-fake's.
    def price(ns, p_in, p_out, p_cached):
        return sum(100 * p_in + n * p_cached + (20 + n) * p_out for n in ns) / 1e6
    assert b["by_model"]["gpt-fake"]["cost_usd"] == pytest.approx(price([1, 2, 5], 2.0, 8.0, 0.5), abs=1e-9)
    assert b["by_model"]["claude-fake"]["cost_usd"] == pytest.approx(price([3, 4], 3.0, 15.0, 0.3), abs=1e-9)
    assert total["cost_usd"] == pytest.approx(gw.usage["cost_usd"], abs=1e-9)
    assert gw.billing == b["by_model"]  # what the gateway counted live is what its record re-derives


def test_an_edited_usage_is_caught_from_the_responses_body(tmp_path):
    fake = _fake(varied_usage=True)
    try:
        asyncio.run(_calls(_gateway(tmp_path, fake), [CHAT]))
    finally:
        fake.stop()
    path = tmp_path / "agent" / "gateway" / "records.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    resp = next(r for r in recs if r["type"] == "response")
    resp["body"]["json"]["usage"]["completion_tokens"] = 1  # the provider reported less, say
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = summarize(tmp_path)
    assert s is not None and any("its body reports" in p for p in s["problems"])


def test_nothing_is_forwarded_or_billed_after_the_agents_turn_ended(tmp_path):
    fake = _fake()

    async def go(gw: ModelGateway) -> tuple[list[int], list[str]]:
        codes: list[int] = []
        errors: list[str] = []
        async with httpx.AsyncClient(timeout=10) as c:
            h = {"authorization": f"Bearer {gw.token}"}
            async with serve_gateway(gw) as url:
                codes.append((await c.post(url + CHAT[0], headers=h, json=CHAT[1])).status_code)
                gw.end_turn()  # the agent's turn ends (serve_gateway does this as its block ends)
                for _ in range(3):  # the agent keeps calling
                    codes.append((await c.post(url + CHAT[0], headers=h, json=CHAT[1])).status_code)
            for _ in range(3):  # and after the gateway closed
                try:
                    codes.append((await c.post(url + CHAT[0], headers=h, json=CHAT[1])).status_code)
                except httpx.HTTPError as e:
                    errors.append(type(e).__name__)
        return codes, errors

    try:
        gw = _gateway(tmp_path, fake)
        codes, errors = asyncio.run(go(gw))
    finally:
        fake.stop()
    assert codes == [200, 409, 409, 409] and len(errors) == 3
    assert len(fake.requests) == 1 and gw.usage["requests"] == 1  # one answer reached the upstream, one was billed
    s = summarize(tmp_path)
    assert s is not None and not s["problems"]
    assert [b["kind"] for b in s["blocked"]] == ["turn_ended"] * 3 and s["billing"]["total"]["requests"] == 1


# -- whole runs (real containers, the stand-in harness in bridge mode) --------------------
@pytest.mark.docker
@pytest.mark.parametrize(("faults", "status", "failure"), [
    ([], "scored", None),
    ([(401, _ant("authentication_error", "invalid x-api-key"), {})], "infrastructure_error", "authentication"),
    ([(529, _ant("overloaded_error", "Overloaded"), {})] * 3, "infrastructure_error", "overloaded"),
    ([(400, _ant("invalid_request_error", "prompt is too long: 9 tokens > 8 maximum"), {})], "agent_failed", "context_length"),
])
def test_a_runs_result_names_the_failure_and_its_cost_adds_up(docker_client, tmp_path, faults, status, failure):
    from ale.record.verify import verify_run_dir
    from ale.result import RunResult
    from ale.runs.lifecycle import execute_run
    from ale.sandbox.docker import DockerProvider
    from tests.test_gateway_runs import BRIDGE, _plan, _standin

    fake = _fake(faults=faults, varied_usage=True)
    try:
        cfg = _standin("model", {"ALE_TEST_MODEL_TOOLS": json.dumps([BRIDGE] * 3)}, fake,
                       budgets={"retries": 2, "retry_base_s": 0.01},
                       prices={"version": "t1", "models": {"claude-fake-1": {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}})
        plan = _plan(tmp_path, cfg)
        result: RunResult = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    finally:
        fake.stop()
    assert result.status.value == status, result.error
    assert (result.model_failure.value if result.model_failure else None) == failure
    assert result.headline is None if status == "infrastructure_error" else True  # excluded, never the agent's 0
    if failure in ("authentication",):
        assert not result.retryable
    total = result.extra["billing"]["total"]
    assert total.get("input_tokens", 0) == fake.served["input_tokens"] and total.get("output_tokens", 0) == fake.served["output_tokens"]
    assert total.get("requests", 0) == fake.served["answers"] == (3 if status == "scored" else 0)
    assert result.extra["billing"]["price_table"]["version"] == "t1"
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
