"""A fake model API on 127.0.0.1 for the gateway tests: Anthropic Messages, OpenAI
Chat Completions and Responses, Gemini generateContent, each with streaming.

The model is scripted: while the request offers a tool named like the bridge's
``shell`` (``mcp__ale__shell``, ``mcp_ale_shell``, ``shell``) and the conversation
holds no tool result yet, it calls that tool with ``COMMAND`` (or ``command=``); otherwise it answers
``done``. Every request (path, headers, JSON body) is kept in ``requests``.

A native harness's own tools: ``native_command`` has the harness's shell run one
command; ``script`` (``HEAVY``) makes it use its heaviest features, turn by turn:
each step is the tool calls of one answer (called in parallel), the step taken is
the number of answers with tool calls the conversation holds; a conversation whose
user messages hold ``SUBAGENT_MARK`` is a sub-agent's and follows
``script["subagent"]``.

Failures of the provider's: ``faults`` is a queue of ``(status, body, headers)``
answers; each model request takes the next one instead of an answer while any is
left. ``varied_usage`` makes each answer report different token counts (request n:
``100 + n`` input, of which ``n`` cached, ``20 + n`` output); ``served`` sums what
the answers reported, the upstream's own count.

A long run (Chat Completions; Anthropic Messages unstreamed): ``turns=N`` makes the model call the shell once per
answer until the conversation holds N tool results, the command of answer n being
``turn_command(n)``, then answer ``done``; ``latency_s`` delays every model answer
(a model's own time, for the resume bench).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

from aiohttp import web

COMMAND = "echo 42 > /workspace/answer.txt && cat /workspace/answer.txt"
SHELL_NAMES = ("mcp__ale__shell", "mcp_ale_shell", "shell")


def _tool_names(body: dict[str, Any]) -> list[str]:
    out = []
    for t in body.get("tools") or []:
        if t.get("type") == "namespace":  # Responses: a group of functions, called by namespace and name
            out += [f"{t.get('name')}__{f.get('name')}" for f in t.get("tools") or [] if isinstance(f, dict)]
        elif isinstance(t.get("function"), dict):
            out.append(t["function"].get("name"))
        elif "functionDeclarations" in t:
            out += [f.get("name") for f in t["functionDeclarations"]]
        else:
            out.append(t.get("name"))
    return [n for n in out if n]


def _has_tool_result(body: dict[str, Any]) -> bool:
    text = json.dumps(body.get("messages") or body.get("input") or body.get("contents") or [])
    return any(m in text for m in ('"tool_result"', '"role": "tool"', '"function_call_output"', '"functionResponse"'))


def _decide(body: dict[str, Any], names: tuple[str, ...] = SHELL_NAMES) -> str | None:
    """The shell tool's name to call, or None to answer with text."""
    if _has_tool_result(body):
        return None
    return next((n for n in _tool_names(body) if n in names), None)


# A native harness's own shell and the arguments it takes (FakeModelAPI(native_command=...)).
NATIVE_SHELLS = {
    "Bash": lambda c: {"command": c},  # Claude Code
    "exec_command": lambda c: {"cmd": c},  # Codex (unified exec)
    "shell": lambda c: {"command": ["bash", "-lc", c]},  # Codex (classic shell)
    "run_shell_command": lambda c: {"command": c},  # Gemini CLI
}


# Marks the prompt a sub-agent is given: its requests follow the script's "subagent" steps.
SUBAGENT_MARK = "ALE-SUBAGENT-7f3a"
Step = list[tuple[str, dict[str, Any]]]


def heavy_script(answer: str) -> dict[str, dict[str, list[Step]]]:
    """Per harness: parallel shell calls, search, sub-agents, then ``answer`` in the shell, then text."""
    slow = [f"sleep 3; wc -w /input/document.txt; echo {i}" for i in range(3)]
    sub = f"{SUBAGENT_MARK}: run `wc -l /input/document.txt` with the Bash tool and report the number."
    return {
        "claude-code": {  # 2.1.197 offers no Grep or Glob tool: search is rg through Bash
            "steps": [[("Agent", {"description": "count lines", "prompt": sub, "subagent_type": "general-purpose"}),
                       ("Agent", {"description": "count lines again", "prompt": sub, "subagent_type": "general-purpose"}),
                       *[("Bash", {"command": c}) for c in slow],
                       ("Bash", {"command": "rg -c the /input || grep -rc the /input"}),
                       ("Read", {"file_path": "/input/document.txt"})],
                      [("Bash", {"command": answer})]],
            "subagent": [[("Bash", {"command": "sleep 2; wc -l /input/document.txt"}),
                          ("Read", {"file_path": "/input/document.txt"})]],
        },
        "codex": {
            "steps": [[*[("multi_agent_v1__spawn_agent", {"message": sub}) for _ in range(2)],
                       *[("exec_command", {"cmd": c}) for c in slow],
                       ("exec_command", {"cmd": "rg -c the /input || grep -rc the /input"})],
                      [("exec_command", {"cmd": answer})]],
            "subagent": [[("exec_command", {"cmd": "sleep 2; wc -l /input/document.txt"})]],
        },
        "gemini-cli": {
            "steps": [[*[("invoke_agent", {"agent_name": "codebase_investigator", "prompt": sub}) for _ in range(2)],
                       *[("run_shell_command", {"command": c}) for c in slow],
                       ("glob", {"pattern": "**/*", "dir_path": "/workspace"}),
                       ("grep_search", {"pattern": "the", "dir_path": "/workspace"}),
                       ("read_file", {"file_path": "/input/document.txt"})],
                      [("run_shell_command", {"command": answer})]],
            "subagent": [[("glob", {"pattern": "**/*", "dir_path": "/workspace"}),
                          ("grep_search", {"pattern": "a", "dir_path": "/workspace"}),
                          ("read_file", {"file_path": "/input/document.txt"})],
                         [("complete_task", {"report": {"SummaryOfFindings": "done", "ExplorationTrace": [], "RelevantLocations": []},
                                             "result": "done"})]],
        },
    }


def _user_text(body: dict[str, Any]) -> str:
    """The text the user's messages hold (Anthropic, Responses, Gemini), tool results left out."""
    out = []
    for m in body.get("messages") or body.get("input") or body.get("contents") or []:
        if not (isinstance(m, dict) and m.get("role") == "user"):
            continue
        content = m.get("content") if "content" in m else m.get("parts")
        for block in content if isinstance(content, list) else [content]:
            if isinstance(block, str):
                out.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                out.append(block["text"])
    return "\n".join(out)


def _answers_with_calls(body: dict[str, Any]) -> int:
    """How many of the model's answers in the conversation called tools: the highest
    step in the call ids this API sent (``toolu_s<step>_<n>``; harnesses merge
    consecutive answers), else the answers counted."""
    convo = json.dumps(body.get("messages") or body.get("input") or body.get("contents") or [])
    steps = [int(n) for n in re.findall(r'"(?:toolu|call|fc)_s(\d+)_\d+"', convo)]
    if steps:
        return max(steps) + 1
    if isinstance(body.get("contents"), list):  # Gemini
        return sum(1 for c in body["contents"] if c.get("role") == "model" and any("functionCall" in p for p in c.get("parts") or []))
    if isinstance(body.get("input"), list):  # Responses: consecutive function_call items are one answer
        n, prev = 0, False
        for item in body["input"]:
            call = isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call")
            n += call and not prev
            prev = call
        return n
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant" and isinstance(m.get("content"), list)
               and any(b.get("type") == "tool_use" for b in m["content"] if isinstance(b, dict)))


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    out = b""
    for name, data in events:
        if name:
            out += f"event: {name}\n".encode()
        out += b"data: " + json.dumps(data).encode() + b"\n\n"
    return out


class FakeModelAPI:
    def __init__(self, *, chunk_delay_s: float = 0.0, native_command: str | None = None,
                 script: dict[str, list[Step]] | None = None, command: str = COMMAND,
                 faults: list[tuple[int, Any, dict[str, str]]] | None = None, varied_usage: bool = False,
                 turns: int | None = None, turn_command: Any = None, latency_s: float = 0.0):
        self.turns = turns
        self.turn_command = turn_command or (lambda n: f"echo turn {n} >> /workspace/turns.txt && wc -l < /workspace/turns.txt")
        self.latency_s = latency_s
        self.requests: list[dict[str, Any]] = []
        self.faults = list(faults or [])
        self.varied_usage = varied_usage
        self.served = {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0, "answers": 0}
        self.command = command  # what the bridge's shell tool is called with
        self.script = script
        # A native harness's own shell (Claude Code's ``Bash``) is called with this command (Anthropic API).
        self.native_command = native_command
        self.chunk_delay_s = chunk_delay_s
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self.anthropic)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post(r"/v1beta/models/{model}:{method}", self.gemini)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    def _calls(self, body: dict[str, Any]) -> Step:
        """The tool calls of this answer ([]: answer with text)."""
        if self.turns is not None and body.get("messages") and not body.get("stream"):  # Anthropic, a long run
            text = json.dumps(body["messages"])
            n = text.count('"tool_result"')
            shell = next((t for t in _tool_names(body) if t in SHELL_NAMES), None)
            return [(shell, {"command": str(self.turn_command(n))})] if shell and n < self.turns else []
        if self.script is not None:
            offered = set(_tool_names(body))
            steps = self.script["subagent" if SUBAGENT_MARK in _user_text(body) else "steps"] if offered else []
            n = _answers_with_calls(body)
            return [(t, a) for t, a in steps[n] if t in offered] if n < len(steps) else []
        tool, args = self._call(body)
        return [(tool, args)] if tool else []

    def _call(self, body: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """The tool to call and its arguments: a native shell when ``native_command`` is set."""
        if self.native_command:
            tool = _decide(body, tuple(NATIVE_SHELLS))
            if tool:
                return tool, NATIVE_SHELLS[tool](self.native_command)
        tool = _decide(body)
        return tool, {"command": self.command}

    def _fault(self) -> web.Response | None:
        if not self.faults:
            return None
        status, body, headers = self.faults.pop(0)
        return web.json_response(body, status=status, headers=headers)

    def _usage(self) -> tuple[int, int, int]:
        """(input, output, cached) of this answer, counted in ``served``."""
        n = len(self.requests)
        u = (100 + n, 20 + n, n) if self.varied_usage else (100, 20, 0)
        self.served["input_tokens"] += u[0]
        self.served["output_tokens"] += u[1]
        self.served["cached_input_tokens"] += u[2]
        self.served["answers"] += 1
        return u

    async def _keep(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        self.requests.append({"path": request.path, "headers": {k.lower(): v for k, v in request.headers.items()}, "body": body, "query": dict(request.query)})
        return body

    async def other(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests.append({"path": request.path, "headers": {k.lower(): v for k, v in request.headers.items()}, "body": None, "query": dict(request.query)})
        return web.json_response({"ok": True})

    async def _stream(self, request: web.Request, payload: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        await resp.prepare(request)
        for block in payload.split(b"\n\n"):
            if block:
                await resp.write(block + b"\n\n")
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
        await resp.write_eof()
        return resp

    async def count_tokens(self, request: web.Request) -> web.Response:
        await self._keep(request)
        return web.json_response({"input_tokens": 10})

    async def anthropic(self, request: web.Request) -> web.StreamResponse:
        body = await self._keep(request)
        if (fault := self._fault()) is not None:
            return fault
        calls, model = self._calls(body), body.get("model", "claude-fake")
        n_in, n_out, n_cached = self._usage()
        usage_in = {"input_tokens": n_in - n_cached, "output_tokens": 1, **({"cache_read_input_tokens": n_cached} if n_cached else {})}
        step = _answers_with_calls(body)
        ids = [f"toolu_s{step}_{i:02d}" if self.script is not None else "toolu_01" for i in range(len(calls))]
        if self.turns is not None:
            ids = [f"toolu_t{json.dumps(body.get('messages')).count('tool_result')}_{i}" for i in range(len(calls))]
        blocks: list[tuple[dict[str, Any], dict[str, Any] | None]]
        if calls:
            content = [{"type": "tool_use", "id": i, "name": t, "input": a} for i, (t, a) in zip(ids, calls, strict=True)]
            blocks = [({**c, "input": {}}, {"type": "input_json_delta", "partial_json": json.dumps(c["input"])}) for c in content]
            stop = "tool_use"
        else:
            blocks = [({"type": "text", "text": ""}, {"type": "text_delta", "text": "done"})]
            content, stop = [{"type": "text", "text": "done"}], "end_turn"
        if not body.get("stream"):
            return web.json_response({"id": "msg_01", "type": "message", "role": "assistant", "model": model, "content": content,
                                      "stop_reason": stop, "stop_sequence": None,
                                      "usage": {**usage_in, "output_tokens": n_out}})
        events: list[tuple[str | None, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant", "model": model,
                                "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_in}})]
        for n, (block, delta) in enumerate(blocks):
            events += [("content_block_start", {"type": "content_block_start", "index": n, "content_block": block}),
                       ("content_block_delta", {"type": "content_block_delta", "index": n, "delta": delta}),
                       ("content_block_stop", {"type": "content_block_stop", "index": n})]
        events += [("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": n_out}}),
                   ("message_stop", {"type": "message_stop"})]
        return await self._stream(request, _sse(events))

    def model_calls(self, path: str = "/v1/chat/completions") -> int:
        """The model requests this upstream was sent (on one API's path)."""
        return sum(1 for r in self.requests if r["path"] == path)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._keep(request)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if (fault := self._fault()) is not None:
            return fault
        tool, model = _decide(body), body.get("model", "gpt-fake")
        command, call_id = self.command, "call_1"
        if self.turns is not None:
            n = sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "tool")
            tool = "shell" if n < self.turns and "shell" in _tool_names(body) else None
            command, call_id = str(self.turn_command(n)), f"call_{n}"
        n_in, n_out, n_cached = self._usage()
        msg: dict[str, Any] = {"role": "assistant", "content": None if tool else "done"}
        if tool:
            msg["tool_calls"] = [{"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps({"command": command})}}]
        usage: dict[str, Any] = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        if n_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": n_cached}
        if not body.get("stream"):
            return web.json_response({"id": "c1", "object": "chat.completion", "created": 0, "model": model, "usage": usage,
                                      "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if tool else "stop"}]})
        delta = dict(msg)
        if tool:
            delta["tool_calls"] = [{"index": 0, **msg["tool_calls"][0]}]
        chunks = [(None, {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": model,
                          "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
                  (None, {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": model,
                          "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if tool else "stop"}]}),
                  (None, {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [], "usage": usage})]
        return await self._stream(request, _sse(chunks) + b"data: [DONE]\n\n")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._keep(request)
        if (fault := self._fault()) is not None:
            return fault
        model, calls = body.get("model", "gpt-fake"), self._calls(body)
        step = _answers_with_calls(body)
        items: list[dict[str, Any]] = []
        namespaces = {f"{t.get('name')}__{f.get('name')}": (t.get("name"), f.get("name")) for t in body.get("tools") or []
                      if t.get("type") == "namespace" for f in t.get("tools") or []}
        custom = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "custom"}
        for i, (tool, args) in enumerate(calls):
            suffix = f"s{step}_{i}" if self.script is not None else "1"
            item: dict[str, Any] = {"type": "function_call", "id": f"fc_{suffix}", "call_id": f"call_{suffix}", "status": "completed",
                                    "arguments": json.dumps(args)}
            if tool in namespaces:
                item["namespace"], item["name"] = namespaces[tool]
            else:
                item["name"] = tool
            if tool in custom:  # a free-form tool (Codex's apply_patch): called with its raw input
                item = {"type": "custom_tool_call", "id": f"ctc_{suffix}", "call_id": f"call_{suffix}", "status": "completed",
                        "name": tool, "input": args.get("input", "")}
            items.append(item)
        if not items:
            items = [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": "done", "annotations": []}]}]
        resp = {"id": "resp_1", "object": "response", "model": model, "status": "completed", "output": items,
                "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}}
        if not body.get("stream"):
            return web.json_response(resp)
        events: list[tuple[str | None, dict[str, Any]]] = [
            ("response.created", {"type": "response.created", "response": {**resp, "status": "in_progress", "output": []}})]
        for n, item in enumerate(items):
            events += [("response.output_item.added", {"type": "response.output_item.added", "output_index": n, "item": item}),
                       ("response.output_item.done", {"type": "response.output_item.done", "output_index": n, "item": item})]
        events.append(("response.completed", {"type": "response.completed", "response": resp}))
        return await self._stream(request, _sse(events))

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        body = await self._keep(request)
        if (fault := self._fault()) is not None:
            return fault
        step = _answers_with_calls(body)
        parts: list[dict[str, Any]] = [{"functionCall": {"name": t, "args": a, **({"id": f"call_s{step}_{i}"} if self.script else {})}}
                                       for i, (t, a) in enumerate(self._calls(body))] or [{"text": "done"}]
        doc = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
               "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 20, "totalTokenCount": 120}, "modelVersion": request.match_info["model"]}
        if request.match_info["method"] != "streamGenerateContent":
            return web.json_response(doc)
        return await self._stream(request, _sse([(None, doc)]))

    # -- running it in a thread, for tests that drive harnesses synchronously --
    def start(self) -> FakeModelAPI:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            runner = web.AppRunner(self.app(), access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            self._runner = runner
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
