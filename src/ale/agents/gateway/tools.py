"""What a model request offers the model, and whether the run allows it.

``offered_tools(api, body)`` extracts every tool declaration of one request, in
the shapes the harnesses send:

- OpenAI Chat Completions: ``tools[].function.name`` (and the legacy
  ``functions[]``); ``web_search_options`` is the server-side web search.
- OpenAI Responses: ``tools[]`` of type ``function``/``custom`` by name, and
  ``tool_search`` with ``execution: "client"`` (the harness searches its own
  deferred tools) as ``tool_search``; every other type (``web_search``, ``file_search``, ``code_interpreter``,
  ``computer_use_preview``, ``image_generation``, ``local_shell``, ``mcp`` hosted
  connectors, ...) is a server-side tool; ``namespace`` entries are opened.
- Anthropic Messages: ``tools[]`` without a ``type`` (or ``custom``) by name;
  typed tools (``web_search_*``, ``web_fetch_*``, ``code_execution_*``,
  ``bash_*``, ``computer_*``, ``text_editor_*``, ...) are server-side;
  ``mcp_servers[]`` are hosted connectors.
- Gemini ``generateContent``: ``tools[].functionDeclarations[].name``; every other
  key of a Tool (``googleSearch``, ``codeExecution``, ``urlContext``,
  ``computerUse``, ``fileSearch``, ...) is server-side.

A client-side (function) tool is named as the harness names it; a server-side
tool is ``server:<type>`` and a hosted connector ``mcp:<label>``, so they can
never collide with a function's name. Anything the extractor cannot read (a tool
entry that is not an object, an unknown shape) is reported as
``unreadable:<where>`` and is never allowed: the check fails closed.

``ToolPolicy`` is the run's allowlist mapped to the names each harness gives the
bridge's tools, plus a harness profile: harness-internal tools, each with the
reason it reaches nothing outside. The default profile allows the bridge's tools
alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale.agents.errors import AgentConfigError

# The API families the gateway speaks (path prefixes of the gateway's URL).
OPENAI, ANTHROPIC, GEMINI = "openai", "anthropic", "gemini"
APIS = (OPENAI, ANTHROPIC, GEMINI)

# Tool names that are never allowed, whatever the policy: server-side tools, hosted
# connectors, declarations the extractor cannot read.
NEVER_ALLOWED = ("server:", "mcp:", "unreadable:")

# How each harness names the bridge's (MCP server "ale") tools.
BRIDGE_NAME_FORMS = ("{t}", "mcp__ale__{t}", "mcp_ale_{t}", "ale__{t}")


def is_model_call(api: str, path: str) -> bool:
    """Requests that carry a conversation (and so tool declarations) to a model."""
    if api == OPENAI:
        return path.endswith("/chat/completions") or path.endswith("/responses") or path.endswith("/completions")
    if api == ANTHROPIC:
        return path.endswith("/messages") or path.endswith("/messages/count_tokens")
    if api == GEMINI:
        tail = path.rsplit(":", 1)[-1] if ":" in path else ""
        return tail in ("generateContent", "streamGenerateContent", "countTokens")
    return False


def offered_tools(api: str, path: str, body: Any) -> list[str]:
    """Every tool the request offers, sorted, each once (see the module doc)."""
    out: set[str] = set()
    if not isinstance(body, dict):
        return ["unreadable:body"] if body is not None else []
    if api == OPENAI:
        if path.endswith("/responses"):
            _responses_tools(body.get("tools"), out, "tools")
        else:
            _chat_tools(body, out)
    elif api == ANTHROPIC:
        _anthropic_tools(body, out)
    elif api == GEMINI:
        _gemini_tools(body, out)
    return sorted(out)


def _name(entry: dict[str, Any], out: set[str], where: str) -> None:
    name = entry.get("name")
    out.add(name if isinstance(name, str) and name else f"unreadable:{where}")


def _chat_tools(body: dict[str, Any], out: set[str]) -> None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        out.add("unreadable:tools")
        tools = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict):
            out.add(f"unreadable:tools[{i}]")
        elif t.get("type", "function") == "function" and isinstance(t.get("function"), dict):
            _name(t["function"], out, f"tools[{i}].function")
        elif t.get("type") == "custom" and isinstance(t.get("custom"), dict):
            _name(t["custom"], out, f"tools[{i}].custom")
        else:
            out.add(f"server:{t.get('type')}")
    for i, f in enumerate(body.get("functions") or []):
        if isinstance(f, dict):
            _name(f, out, f"functions[{i}]")
        else:
            out.add(f"unreadable:functions[{i}]")
    if body.get("web_search_options") is not None:
        out.add("server:web_search")


def _responses_tools(tools: Any, out: set[str], where: str) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        out.add(f"unreadable:{where}")
        return
    for i, t in enumerate(tools):
        here = f"{where}[{i}]"
        if not isinstance(t, dict):
            out.add(f"unreadable:{here}")
            continue
        kind = t.get("type")
        if kind in ("function", "custom"):
            _name(t, out, here)
        elif kind == "tool_search" and t.get("execution") == "client":
            # Executed by the harness itself (Codex searches its own deferred tools and answers the
            # model's tool_search_call with a tool_search_output): a client tool, reaching nothing.
            out.add("tool_search")
        elif kind == "namespace":  # a group of function tools under one name
            _responses_tools(t.get("tools"), out, f"{here}.tools")
        elif kind == "mcp":
            out.add(f"mcp:{t.get('server_label') or t.get('server_url') or '?'}")
        else:
            out.add(f"server:{kind}")


def _anthropic_tools(body: dict[str, Any], out: set[str]) -> None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        out.add("unreadable:tools")
        tools = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict):
            out.add(f"unreadable:tools[{i}]")
        elif t.get("type") in (None, "custom"):
            _name(t, out, f"tools[{i}]")
        else:
            out.add(f"server:{t.get('type')}")
    for s in body.get("mcp_servers") or []:
        out.add(f"mcp:{s.get('name') or s.get('url') or '?'}" if isinstance(s, dict) else "unreadable:mcp_servers")


def _gemini_tools(body: dict[str, Any], out: set[str]) -> None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        out.add("unreadable:tools")
        tools = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict):
            out.add(f"unreadable:tools[{i}]")
            continue
        for key, value in t.items():
            if key in ("functionDeclarations", "function_declarations"):
                for j, f in enumerate(value or []):
                    if isinstance(f, dict):
                        _name(f, out, f"tools[{i}].{key}[{j}]")
                    else:
                        out.add(f"unreadable:tools[{i}].{key}[{j}]")
            else:
                out.add(f"server:{key}")


@dataclass(frozen=True)
class HarnessProfile:
    """Harness-internal tools a run allows, each with why it reaches nothing outside."""

    name: str = "bridge-only"
    allow: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "allow": dict(sorted(self.allow.items()))}

    @classmethod
    def load(cls, value: Any) -> HarnessProfile:
        """From config: None (the default), a dict ``{"name", "allow": {tool: reason}}``
        or the path of a JSON file holding one, or a built-in profile's name
        (``BUILTIN_PROFILES``)."""
        if value is None:
            return cls()
        if isinstance(value, str) and value in BUILTIN_PROFILES:
            value = BUILTIN_PROFILES[value]
        if isinstance(value, str):
            try:
                value = json.loads(Path(value).read_text())
            except (OSError, ValueError) as e:
                raise AgentConfigError(f"harness_profile: cannot read {value!r}: {e}") from e
        if not isinstance(value, dict) or not isinstance(value.get("allow", {}), dict):
            raise AgentConfigError("harness_profile must be {\"name\": ..., \"allow\": {tool: reason}} or a "
                                   "JSON file of one")
        allow = {str(k): str(v) for k, v in value.get("allow", {}).items()}
        empty = sorted(k for k, v in allow.items() if not v.strip())
        if empty:
            raise AgentConfigError(f"harness_profile: every allowed tool needs its reason; none given for {empty}")
        bad = sorted(k for k in allow if k.startswith(("server:", "mcp:", "unreadable:")))
        if bad:
            raise AgentConfigError("harness_profile: server-side tools and hosted connectors reach outside and are "
                                   f"never allowed: {bad}")
        return cls(name=str(value.get("name") or "custom"), allow=allow)


@dataclass(frozen=True)
class ToolPolicy:
    """``client_tools``: a native harness's own tools (every client-side tool it
    declares) run inside the sealed sandbox and are allowed; server-side tools,
    hosted connectors and anything unreadable never are."""

    allowlist: tuple[str, ...]
    profile: HarnessProfile = field(default_factory=HarnessProfile)
    client_tools: bool = False

    @property
    def allowed(self) -> frozenset[str]:
        names = {form.format(t=t) for t in self.allowlist for form in BRIDGE_NAME_FORMS}
        return frozenset(names | set(self.profile.allow))

    def forbidden(self, offered: Iterable[str]) -> list[str]:
        if self.client_tools:
            return sorted(t for t in offered if t.startswith(NEVER_ALLOWED))
        allowed = self.allowed
        return sorted(t for t in offered if t not in allowed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "allowlist": list(self.allowlist),
            "bridge_name_forms": list(BRIDGE_NAME_FORMS),
            "profile": self.profile.to_dict(),
            "allowed": sorted(self.allowed),
            **({"client_tools": True} if self.client_tools else {}),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ToolPolicy:
        prof = doc.get("profile") or {}
        return cls(tuple(doc.get("allowlist") or ()),
                   HarnessProfile(str(prof.get("name", "")), dict(prof.get("allow") or {})),
                   client_tools=doc.get("client_tools") is True)


# Built-in harness profiles (``"harness_profile": "<name>"``): what each harness
# version still offers the model once configured as docs/agents.md shows, each
# tool with why it reaches nothing outside the run.
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    # Codex CLI 0.171 in ``codex exec`` with --ignore-user-config, --sandbox read-only,
    # shell_tool, unified_exec, view_image, image_generation, goals, apps and plugins
    # disabled and web_search="disabled" (recorded against the fake Responses API).
    "codex-0.171": {"name": "codex-0.171", "allow": {
        "request_user_input": "asks the user a question; `codex exec` has no user, so it returns without input; "
                              "no file or network access",
        "spawn_agent": "starts a sub-agent: another conversation inside Codex whose model requests go through the "
                       "same gateway (each checked) and whose tools are the parent's",
        "send_input": "sends a message to a sub-agent of this session (in-process)",
        "resume_agent": "resumes a sub-agent of this session (in-process)",
        "wait_agent": "waits for a sub-agent of this session (in-process)",
        "close_agent": "closes a sub-agent of this session (in-process)",
        "list_mcp_resources": "lists resources of the configured MCP servers; with --ignore-user-config and apps and "
                              "plugins off the only one is the run's bridge",
        "list_mcp_resource_templates": "lists resource templates of the configured MCP servers (only the run's bridge, "
                                       "as above)",
        "read_mcp_resource": "reads a resource of the configured MCP servers (only the run's bridge, as above)",
        "apply_patch": "Codex's own file editor (offered with any model Codex knows; it cannot be switched off in "
                       "0.171): in bridge mode Codex runs on the host under `--sandbox read-only` "
                       "inside bubblewrap, so its writes are refused there, and it never reaches the sandbox "
                       "(the MCP tools do)",
        "tool_search": "searches Codex's own deferred tool list (offered with any model Codex knows; Codex answers the "
                       "model's tool_search_call itself with a tool_search_output): no file or network access",
    }},
}
