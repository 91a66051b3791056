"""The `llm` agent: a tool-calling loop over an OpenAI-compatible Chat Completions API.

Configuration (``AgentSpec.config``), each falling back to the environment:

- ``base_url`` (``ALE_LLM_BASE_URL``, then ``OPENAI_BASE_URL``)
- ``model`` (``ALE_LLM_MODEL``, then ``OPENAI_MODEL``)
- ``api_key`` (``ALE_LLM_API_KEY``, then ``OPENAI_API_KEY``), or ``api_key_env``
  naming the variable to read it from. Redacted in the run's evidence.
- limits: ``max_steps`` (tool calls, default 50; the run's step limit applies
  too), ``max_tokens_total`` (prompt + completion over the whole run),
  ``wall_time_s`` (the run's wall time applies too). Reaching any of them ends
  the agent with TIMEOUT.
- ``max_output_tokens`` (per completion), ``temperature``, ``system_prompt``,
  ``max_tool_result_chars`` (tool output shown to the model, default 64000),
  ``request_timeout_s`` (default 300).

The model sees the allowlisted tools only, as JSON-schema functions. Every call
goes through the ToolBox (recorded as a trajectory step); each API response is
also appended to ``agent/llm-transcript.jsonl``. Token usage is returned in
``AgentOutcome.usage``.

Every request goes through the run's model gateway (``gateway``, default true):
the SDK is pointed at it with the run's token, the gateway forwards to
``base_url`` (or ``ALE_GATEWAY_OPENAI_UPSTREAM``) with the key, records the
exchange and enforces the allowlist on the tools offered. ``prices`` is the
price table for the run's cost (see ``ale.agents.gateway.usage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale import layout
from ale.agents.base import Agent, AgentContext, AgentEnd, AgentOutcome, provider_outcome
from ale.agents.computer import image_message  # desktop
from ale.agents.errors import AgentConfigError
from ale.agents.gateway.server import DEFAULT_UPSTREAMS, ModelGateway, serve_gateway
from ale.agents.gateway.tools import OPENAI, ToolPolicy
from ale.agents.mcp_bridge import allowed_specs, record_refusal
from ale.agents.secrets import is_forbidden_env
from ale.status import AgentLimit

_KNOWN_KEYS = {
    "base_url", "model", "api_key", "api_key_env", "max_steps", "max_tokens_total", "wall_time_s",
    "max_output_tokens", "temperature", "system_prompt", "max_tool_result_chars", "request_timeout_s",
    "gateway", "prices", "ALE_GATEWAY_OPENAI_UPSTREAM",
}
DEFAULT_MAX_STEPS = 50
DEFAULT_SYSTEM_PROMPT = (
    "You are an autonomous agent working on a task inside a sandboxed Linux machine without network. "
    "You act only through the provided tools. The task's input files are in {input_dir} (read-only); "
    "write your deliverables under {workdir}. When the task is complete, reply with a short summary "
    "and no tool call."
)


def _first_env(*names: str) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


class LLMAgent(Agent):
    name = "llm"

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = dict(config or {})
        unknown = set(self.config) - _KNOWN_KEYS
        if unknown:
            raise AgentConfigError(f"llm agent: unknown config keys {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
        key_env = self.config.get("api_key_env")
        if key_env and is_forbidden_env(str(key_env)):
            raise AgentConfigError(
                f"llm agent: api_key_env {key_env!r} names a grader or cloud credential; agents never get those")
        self.max_steps = int(self.config.get("max_steps", DEFAULT_MAX_STEPS))
        self.max_tokens_total = self.config.get("max_tokens_total")
        self.wall_time_s = self.config.get("wall_time_s")
        self.max_tool_result_chars = int(self.config.get("max_tool_result_chars", 64_000))

    # -- settings ----------------------------------------------------------
    def settings(self) -> tuple[str | None, str, str]:
        """(base_url, model, api_key) from config, then ALE_LLM_*, then OPENAI_*."""
        c = self.config
        base_url = c.get("base_url") or _first_env("ALE_LLM_BASE_URL", "OPENAI_BASE_URL")
        model = c.get("model") or _first_env("ALE_LLM_MODEL", "OPENAI_MODEL")
        if c.get("api_key"):
            key = str(c["api_key"])
        elif c.get("api_key_env"):
            key = os.environ.get(str(c["api_key_env"]), "")
            if not key:
                raise AgentConfigError(f"llm agent: api_key_env names {c['api_key_env']!r}, which is not set")
        else:
            key = _first_env("ALE_LLM_API_KEY", "OPENAI_API_KEY") or ""
        if not model:
            raise AgentConfigError("llm agent: no model; set config 'model' or ALE_LLM_MODEL (or OPENAI_MODEL)")
        if not key:
            if not base_url:
                raise AgentConfigError(
                    "llm agent: no API key; set config 'api_key'/'api_key_env' or ALE_LLM_API_KEY (or OPENAI_API_KEY)")
            key = "unused"  # local OpenAI-compatible servers often need none; the SDK insists on one
        return base_url, str(model), key

    def evidence(self) -> dict[str, Any]:
        base_url = self.config.get("base_url") or _first_env("ALE_LLM_BASE_URL", "OPENAI_BASE_URL")
        model = self.config.get("model") or _first_env("ALE_LLM_MODEL", "OPENAI_MODEL")
        return {"base_url": base_url, "model": model, "max_steps": self.max_steps,
                "max_tokens_total": self.max_tokens_total, "wall_time_s": self.wall_time_s}

    # -- the loop ----------------------------------------------------------
    async def run(self, ctx: AgentContext) -> AgentOutcome:
        from openai import AsyncOpenAI

        base_url, model, key = self.settings()
        walls = [float(x) for x in (self.wall_time_s, ctx.wall_time_s) if x]
        wall = min(walls) if walls else None
        if wall is not None and ctx.wall_time_s and wall >= ctx.wall_time_s and wall > 5:
            wall -= 0.5  # end just before the run's own clock, so usage is still reported
        state = _LoopState(
            model=model,
            max_steps=min(n for n in (self.max_steps, ctx.max_steps) if n is not None),
            transcript=Path(ctx.run_dir) / layout.AGENT_DIR / layout.Agent.LLM_TRANSCRIPT,
        )
        state.transcript.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as stack:
            if self.config.get("gateway", True):
                upstream = (self.config.get("ALE_GATEWAY_OPENAI_UPSTREAM") or base_url
                            or os.environ.get("ALE_GATEWAY_OPENAI_UPSTREAM") or DEFAULT_UPSTREAMS[OPENAI])
                gw = ModelGateway(Path(ctx.run_dir), ToolPolicy(tuple(ctx.tools.allowlist)), upstreams={
                    **DEFAULT_UPSTREAMS, OPENAI: str(upstream).rstrip("/")}, keys={OPENAI: key},
                    prices=dict(self.config.get("prices") or {}))
                gw_url = await stack.enter_async_context(serve_gateway(gw))
                base_url, key = f"{gw_url}/openai/v1", gw.token
                state.gateway = gw
            client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=2,
                                 timeout=float(self.config.get("request_timeout_s", 300)))
            try:
                async with asyncio.timeout_at(None if wall is None else loop.time() + wall):
                    return await self._loop(ctx, client, state)
            except TimeoutError:
                return state.outcome(AgentEnd.TIMEOUT, f"wall time of {wall:.1f}s reached", AgentLimit.WALL_TIME)
            finally:
                await client.close()
        raise AssertionError("unreachable")

    async def _loop(self, ctx: AgentContext, client: Any, state: _LoopState) -> AgentOutcome:
        from openai import APIError

        specs = allowed_specs(ctx.tools.offered)  # desktop: computer only where there is one
        tools = [
            {"type": "function",
             "function": {"name": n, "description": s["description"], "parameters": s["input_schema"]}}
            for n, s in specs.items()
        ]
        system = str(self.config.get("system_prompt") or DEFAULT_SYSTEM_PROMPT)
        system = system.replace("{input_dir}", ctx.input_dir).replace("{workdir}", ctx.workdir)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                          {"role": "user", "content": ctx.prompt}]
        usage = state.usage
        while True:
            if self._tokens_spent(usage):
                return state.outcome(AgentEnd.TIMEOUT,
                                     f"token limit of {self.max_tokens_total} reached ({usage['total_tokens']} used)",
                                     AgentLimit.TOTAL_TOKENS)
            kwargs: dict[str, Any] = {"model": state.model, "messages": messages}
            if tools:
                kwargs["tools"] = tools
            if self.config.get("max_output_tokens"):
                kwargs["max_tokens"] = int(self.config["max_output_tokens"])
            if self.config.get("temperature") is not None:
                kwargs["temperature"] = float(self.config["temperature"])
            try:
                resp = await client.chat.completions.create(**kwargs)
            except APIError as e:
                return state.outcome(AgentEnd.FAILED, f"model API error: {type(e).__name__}: {e}")
            usage["requests"] += 1
            if resp.usage is not None:
                usage["prompt_tokens"] += resp.usage.prompt_tokens or 0
                usage["completion_tokens"] += resp.usage.completion_tokens or 0
                usage["total_tokens"] += resp.usage.total_tokens or 0
            _append_jsonl(state.transcript, {"request": usage["requests"], "response": resp.model_dump(mode="json")})
            if not resp.choices:
                return state.outcome(AgentEnd.FAILED, "the model returned no choices")
            msg = resp.choices[0].message
            calls = list(msg.tool_calls or [])
            assistant: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
            if calls:
                assistant["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.function.name, "arguments": c.function.arguments or "{}"}}
                    for c in calls
                ]
            messages.append(assistant)
            if not calls:
                return state.outcome(AgentEnd.FINISHED,
                                     (msg.content or "").strip()[:2000] or "the model stopped calling tools")
            images: list[dict[str, Any]] = []  # desktop
            for c in calls:
                if usage["tool_calls"] >= state.max_steps:
                    return state.outcome(AgentEnd.TIMEOUT, f"step limit of {state.max_steps} tool calls reached",
                                         AgentLimit.TOOL_CALLS)
                if self._tokens_spent(usage):
                    return state.outcome(
                        AgentEnd.TIMEOUT,
                        f"token limit of {self.max_tokens_total} reached ({usage['total_tokens']} used)",
                        AgentLimit.TOTAL_TOKENS)
                usage["tool_calls"] += 1
                messages.append({"role": "tool", "tool_call_id": c.id,
                                 "content": await self._call_tool(ctx, c.function.name, c.function.arguments)})
                if self._image is not None:  # desktop: screenshots follow the turn's tool messages
                    images.append(image_message(self._image))
            messages.extend(images)

    def _tokens_spent(self, usage: dict[str, Any]) -> bool:
        return self.max_tokens_total is not None and usage["total_tokens"] >= int(self.max_tokens_total)

    _image: bytes | None = None  # desktop: the last tool call's screenshot

    async def _call_tool(self, ctx: AgentContext, name: str, raw_args: str | None) -> str:
        try:
            args = json.loads(raw_args or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as e:
            out = record_refusal(ctx.tools, name, {"_raw_arguments": raw_args}, f"unusable arguments for {name}: {e}")
        else:
            out = await ctx.tools.call(name, args)
        self._image = out.image  # desktop: the screenshot, sent after the tool message
        text = out.for_model()
        if len(text) > self.max_tool_result_chars:
            text = text[: self.max_tool_result_chars] + f"\n[... cut at {self.max_tool_result_chars} characters ...]"
        return text


@dataclass
class _LoopState:
    model: str
    max_steps: int
    transcript: Path
    usage: dict[str, Any] = field(default_factory=dict)
    gateway: Any = None

    def __post_init__(self) -> None:
        self.usage = {"model": self.model, "requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                      "tool_calls": 0}

    def outcome(self, end: AgentEnd, detail: str, limit: AgentLimit | None = None) -> AgentOutcome:
        usage = dict(self.usage)
        if self.gateway is not None:  # the gateway's count, the same for every agent
            usage.update({k: v for k, v in self.gateway.usage.items() if k != "requests"})
            if end is AgentEnd.FAILED and self.gateway.provider_failure is not None:
                return provider_outcome(self.gateway, usage)
        return AgentOutcome(end, detail=detail, usage=usage, limit=limit)


def _append_jsonl(path: Path, obj: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")
