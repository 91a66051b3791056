"""The MCP bridge: one run's ToolBox, exposed as an MCP server to any harness.

Exactly the allowlisted tools are listed; every call, listed or not, goes
through ``ToolBox.call`` so it is recorded and the allowlist is enforced there
(a call to an unlisted tool is refused and recorded, never executed).

Transports:

- streamable HTTP: ``async with serve_http(toolbox) as (url, token)``. The
  server binds 127.0.0.1 on a free port; every request must carry
  ``Authorization: Bearer <token>`` (a fresh random token per bridge), or it
  gets 401 before it reaches MCP.
- stdio: ``await serve_stdio(toolbox)`` serves on the process's stdin/stdout
  (``ale agents mcp-stdio`` wraps it for harnesses that only launch servers).

``mcp_config(url, token)`` is the JSON external harnesses read (Claude Code's
``--mcp-config`` shape; ``fmt="gemini"`` gives a Gemini CLI settings file).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from ale.agents.computer import COMPUTER_SPEC, png_base64
from ale.agents.loopback import loopback_socket, serve_asgi
from ale.sandbox.tools import ALL_TOOLS, ToolBox, ToolOutcome

SERVER_NAME = "ale"

# One definition of each tool, shared by the MCP bridge and the llm agent.
TOOL_SPECS: dict[str, dict[str, Any]] = {
    "shell": {
        "description": (
            "Run a shell command (sh -c) inside the task's sandbox, as the candidate user, in the "
            "workspace folder. Returns the exit code, stdout and stderr (each capped; long output is "
            "cut with a marker). The sandbox has no network."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command line to run."},
                "timeout": {"type": "number", "description": "Seconds before the command is killed (optional)."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    "read_file": {
        "description": "Read a file inside the sandbox and return its text (size-capped).",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Absolute path, or relative to the workspace."}},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    "write_file": {
        "description": (
            "Write text to a file inside the sandbox as the candidate user (parent folders are "
            "created). Only places the candidate may write to (the workspace, /tmp) succeed."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Absolute path, or relative to the workspace."},
                "content": {"type": "string", "description": "The full new content of the file."},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    },
    "list_dir": {
        "description": "List the entries of a folder inside the sandbox (one name per line).",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Folder path; default: the workspace."}},
            "required": [],
            "additionalProperties": False,
        },
    },
}
TOOL_SPECS["computer"] = COMPUTER_SPEC  # the desktop (offered only when the sandbox has one)
FILE_TOOLS = tuple(name for name in ALL_TOOLS if name != "computer")
assert set(TOOL_SPECS) == set(ALL_TOOLS)


def allowed_specs(allowlist: tuple[str, ...] | list[str]) -> dict[str, dict[str, Any]]:
    """The tool definitions an agent may see, in the canonical order."""
    return {name: TOOL_SPECS[name] for name in ALL_TOOLS if name in allowlist}


class ToolBridge:
    """Runs tool calls from an external client through one ToolBox.

    ``max_steps`` (optional) caps the calls executed; the call past the cap is
    refused and recorded, and ``limit_reached`` is set so the owner can stop
    the client. ``failures`` keeps provider errors (sandbox gone, ...) that the
    client only saw as an error result.
    """

    def __init__(self, toolbox: ToolBox, *, max_steps: int | None = None, name: str = SERVER_NAME):
        self.toolbox = toolbox
        self.max_steps = max_steps
        self.name = name
        self.limit_reached = asyncio.Event()
        self.failures: list[str] = []
        self.executed = 0
        self.rejected_requests = 0  # HTTP requests turned away for a missing or wrong token

    # -- the calls -----------------------------------------------------------
    async def call(self, tool: str, args: dict[str, Any]) -> ToolOutcome:
        if self.max_steps is not None and self.executed >= self.max_steps:
            self.limit_reached.set()
            return record_refusal(self.toolbox, tool, args,
                                  f"step limit of {self.max_steps} reached; no further tool calls run")
        self.executed += 1
        try:
            return await self.toolbox.call(tool, args)
        except Exception as e:  # provider failure: the client sees an error, the owner sees it in failures
            self.failures.append(f"{tool}: {type(e).__name__}: {e}")
            return ToolOutcome(ok=False, error=f"internal error running {tool}: {type(e).__name__}")

    # -- MCP -----------------------------------------------------------------
    def mcp_server(self) -> Server[Any]:
        specs = allowed_specs(self.toolbox.offered)

        async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(
                tools=[types.Tool(name=n, description=s["description"], input_schema=s["input_schema"])
                       for n, s in specs.items()]
            )

        async def call_tool(ctx: ServerRequestContext[Any],
                            params: types.CallToolRequestParams) -> types.CallToolResult:
            outcome = await self.call(params.name, dict(params.arguments or {}))
            # A command's non-zero exit is a result the model reads, not a tool error.
            content: list[Any] = [types.TextContent(text=outcome.for_model())]
            if outcome.image is not None:  # a screenshot: MCP image content
                content.append(types.ImageContent(data=png_base64(outcome.image), mime_type="image/png"))
            return types.CallToolResult(content=content, is_error=bool(outcome.error))

        return Server(
            self.name,
            version="1",
            instructions="Tools that act inside the task's sealed sandbox. They are your only way to reach it.",
            on_list_tools=list_tools,
            on_call_tool=call_tool,
        )


def record_refusal(toolbox: ToolBox, tool: str, args: dict[str, Any], reason: str) -> ToolOutcome:
    """Record a call that is refused before it reaches the ToolBox (a limit, unusable
    arguments), through the ToolBox's own recorder so step numbering stays one sequence."""
    return toolbox.refuse(tool, args, reason)


# -- streamable HTTP -------------------------------------------------------------


class _BearerGate:
    """ASGI wrapper: HTTP requests without the run's bearer token get 401."""

    def __init__(self, app: Any, token: str, bridge: ToolBridge):
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.bridge = bridge

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = b""
            for k, v in scope.get("headers", []):
                if k.lower() == b"authorization":
                    got = v
                    break
            if not hmac.compare_digest(got, self.expected):
                self.bridge.rejected_requests += 1
                body = b'{"error": "unauthorized: a valid bearer token is required"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="ale"'),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def serve_http(
    target: ToolBox | ToolBridge, *, max_steps: int | None = None, path: str = "/mcp"
) -> AsyncIterator[tuple[str, str]]:
    """Serve the bridge over streamable HTTP on 127.0.0.1; yields ``(url, token)``.

    The server lives as long as the block; on exit it stops accepting
    connections and ends open sessions.
    """
    bridge = target if isinstance(target, ToolBridge) else ToolBridge(target, max_steps=max_steps)
    token = secrets.token_urlsafe(32)
    app = bridge.mcp_server().streamable_http_app(streamable_http_path=path, host="127.0.0.1")
    async with serve_asgi(_BearerGate(app, token, bridge), [loopback_socket(64)], what="MCP bridge",
                          lifespan="on") as port:
        yield f"http://127.0.0.1:{port}{path}", token


def mcp_config(
    url: str, token: str, *, name: str = SERVER_NAME, fmt: str = "claude",
    tools: tuple[str, ...] = FILE_TOOLS,
) -> dict[str, Any]:
    """The MCP client configuration external harnesses read.

    ``claude``: ``{"mcpServers": {name: {"type": "http", "url", "headers"}}}``
    (Claude Code's ``--mcp-config``; also what most harnesses accept).
    ``gemini``: a Gemini CLI settings file with the server (``httpUrl``) and
    ``tools.core`` naming only the bridge's tools (``mcp_<server>_<tool>``), so the
    CLI's own shell, file and web tools are not offered. An ``exclude`` list of
    built-ins would not do: Gemini CLI 0.61 matches it against MCP tools'
    unprefixed names too (excluding ``read_file`` hides the bridge's), and new
    built-ins get through it.
    """
    headers = {"Authorization": f"Bearer {token}"}
    if fmt == "claude":
        return {"mcpServers": {name: {"type": "http", "url": url, "headers": headers}}}
    if fmt == "gemini":
        return {
            "mcpServers": {name: {"httpUrl": url, "headers": headers, "trust": True, "timeout": 600000}},
            "tools": {"core": [f"mcp_{name}_{t}" for t in tools]},
        }
    raise ValueError(f"unknown mcp_config format {fmt!r}; known: claude, gemini")


# -- stdio -----------------------------------------------------------------------


async def serve_stdio(target: ToolBox | ToolBridge, *, max_steps: int | None = None, stdin: Any = None,
                      stdout: Any = None) -> None:
    """Serve the bridge over stdio until the client closes the stream."""
    from mcp.server.stdio import stdio_server

    bridge = target if isinstance(target, ToolBridge) else ToolBridge(target, max_steps=max_steps)
    server = bridge.mcp_server()
    async with stdio_server(stdin, stdout) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
