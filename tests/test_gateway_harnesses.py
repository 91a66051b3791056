"""The real harness CLIs from npm, offline, confined, against a fake model API
behind the run's model gateway.

Harnesses are found under ``ALE_HARNESS_PREFIX`` (default ``/opt/ale-harnesses``;
``scripts/setup.sh`` installs them there with npm, at the versions docs/agents.md
names); a harness that is not installed is skipped locally and fails in CI
(``ALE_CI=1``, tests/conftest.py ``requires``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from ale.agents.base import AgentEnd
from ale.agents.command import CommandAgent
from ale.agents.gateway.record import summarize
from ale.agents.gateway.tools import BUILTIN_PROFILES
from ale.agents.trajectory import load_trajectory
from tests.fake_model_api import FakeModelAPI
from tests.test_agents_support import box, make_ctx  # noqa: F401 - box is a fixture

pytestmark = [pytest.mark.docker, pytest.mark.requires(shutil.which("bwrap") is not None, "needs bubblewrap")]

PREFIX = Path(os.environ.get("ALE_HARNESS_PREFIX", "/opt/ale-harnesses"))
CLAUDE = PREFIX / "claude" / "node_modules" / ".bin" / "claude"
CODEX = PREFIX / "codex" / "node_modules" / ".bin" / "codex"
BRIDGE_TOOLS = "mcp__ale__shell,mcp__ale__read_file,mcp__ale__write_file,mcp__ale__list_dir"


@pytest.fixture
def fake_api():
    api = FakeModelAPI().start()
    try:
        yield api
    finally:
        api.stop()


def _upstreams(api: FakeModelAPI) -> dict[str, str]:
    return {"ALE_GATEWAY_ANTHROPIC_UPSTREAM": api.url, "ALE_GATEWAY_OPENAI_UPSTREAM": api.url + "/v1",
            "ALE_GATEWAY_GEMINI_UPSTREAM": api.url}


def _claude(api: FakeModelAPI, *, builtins_off: bool = True) -> dict:
    tools = ["--tools", ""] if builtins_off else []
    return {
        "command": [str(CLAUDE), "-p", "--mcp-config", "{mcp_config}", "--strict-mcp-config", *tools,
                    "--allowedTools", BRIDGE_TOOLS, "--output-format", "stream-json", "--verbose", "--model", "claude-fake-1",
                    "--", "{prompt}"],
        "env": {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
        "confine": {"install": [str(PREFIX / "claude")]},
        "prices": {"claude-fake-1": {"input_per_mtok": 3.0, "output_per_mtok": 15.0}},
        **_upstreams(api),
    }


def _model_side_in_trajectory(run_dir: Path, shell_name: str) -> None:
    """trajectory.json holds the model turns (validated by the strict schema), the
    model's call joined to the bridge step it produced."""
    traj = load_trajectory(run_dir / "trajectory.json")
    assert traj.model_turns and traj.model_turns[-1].text == "done"
    call = next(c for t in traj.model_turns for c in t.tool_calls)
    assert call.name == shell_name and call.step == 1
    step = traj.steps[call.step - 1]
    assert step.tool == "shell" and step.stdout == "42\n"
    args = call.arguments if isinstance(call.arguments, dict) else json.loads(call.arguments)
    assert args == step.args


needs_claude = pytest.mark.requires(CLAUDE.exists(), f"Claude Code is not installed under {PREFIX} (scripts/setup.sh, npm)")


@needs_claude
def test_claude_code_through_the_gateway_passes_and_its_tools_are_recorded(box, tmp_path, fake_api, monkeypatch):  # noqa: F811
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-operator-secret-0123456789")
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent(_claude(fake_api)).run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FINISHED, (out.detail, (tmp_path / "agent" / "stderr.log").read_text()[-3000:])
    assert (box.workspace / "answer.txt").read_text() == "42\n"
    summary = summarize(tmp_path)
    assert summary is not None and not summary["problems"] and not summary["refusals"]
    offered = [r["tools"] for r in summary["requests"] if r["tools"]]
    assert offered and all(set(t) == set(BRIDGE_TOOLS.split(",")) for t in offered), offered
    # The fake model saw the operator's key, never the run's token; the harness never saw the key.
    model_calls = [r for r in fake_api.requests if r["path"] == "/v1/messages"]
    assert model_calls and all(r["headers"].get("x-api-key") == "sk-ant-operator-secret-0123456789" for r in model_calls)
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert b"sk-ant-operator-secret" not in f.read_bytes(), f
    assert out.usage["input_tokens"] > 0 and out.usage["cost_usd"] > 0
    # The model side of the trajectory, joined with the bridge's step.
    turns = json.loads((tmp_path / "agent" / "gateway" / "turns.json").read_text())["turns"]
    calls = [c for t in turns for c in t["tool_calls"]]
    assert calls and calls[0]["name"] == "mcp__ale__shell" and calls[0]["step"] == 1 and turns[-1]["text"] == "done"
    _model_side_in_trajectory(tmp_path, "mcp__ale__shell")
    conf = json.loads((tmp_path / "agent" / "confinement.json").read_text())
    assert conf["kind"] == "bubblewrap" and conf["network"]["interfaces"] == ["lo"]


@needs_claude
def test_claude_code_with_its_builtin_shell_is_refused_by_the_gateway(box, tmp_path, fake_api):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent(_claude(fake_api, builtins_off=False)).run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FAILED and "Bash" in (out.detail or ""), out.detail
    summary = summarize(tmp_path)
    assert summary is not None and summary["refusals"] and "Bash" in summary["refusals"][0]["forbidden"]
    assert summary["refusals"][0]["before_any_answer"] is True
    assert not [r for r in fake_api.requests if r["path"] == "/v1/messages" and "Bash" in json.dumps(r["body"].get("tools"))]
    assert not (box.workspace / "answer.txt").exists()


CODEX_OFF = ["--disable", "shell_tool", "--disable", "unified_exec", "--disable", "view_image", "--disable", "image_generation",
             "--disable", "goals"]


def _codex(api: FakeModelAPI, *, builtins_off: bool = True, model: str = "gpt-fake-1") -> dict:
    provider = ('model_providers.gw={name="gw", base_url="{gateway_url}/openai/v1", wire_api="responses", '
                'env_key="CODEX_API_KEY", supports_websockets=false}')
    return {
        "command": [str(CODEX), "exec", "--skip-git-repo-check", "--ephemeral", "--ignore-user-config", "--sandbox", "read-only",
                    "-c", provider, "-c", 'model_provider="gw"', "-m", model,
                    "-c", 'mcp_servers.ale.url="{mcp_url}"', "-c", 'mcp_servers.ale.bearer_token_env_var="ALE_MCP_TOKEN"',
                    "-c", 'mcp_servers.ale.default_tools_approval_mode="approve"', "-c", 'web_search="disabled"',
                    *(CODEX_OFF if builtins_off else []), "--disable", "apps", "--disable", "plugins",
                    "--", "{prompt}"],
        "harness_profile": "codex-0.171",
        "confine": {"install": [str(PREFIX / "codex")]},
        "prices": {model: {"input_per_mtok": 1.25, "output_per_mtok": 10.0}},
        **_upstreams(api),
    }


needs_codex = pytest.mark.requires(CODEX.exists(), f"Codex CLI is not installed under {PREFIX} (scripts/setup.sh, npm)")


@needs_codex
def test_codex_bridge_with_a_model_it_knows_offers_tool_search_and_passes(box, tmp_path, fake_api):  # noqa: F811
    """With a model Codex knows it also offers `tool_search` (executed by Codex itself) and
    `apply_patch` (its own editor, refused by its read-only sandbox on the host): the codex
    profile allows both, so the bridge run is not refused."""
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent(_codex(fake_api, model="gpt-5.5")).run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FINISHED, (out.detail, (tmp_path / "agent" / "stderr.log").read_text()[-3000:])
    summary = summarize(tmp_path)
    assert summary is not None and not summary["problems"] and not summary["refusals"], summary
    offered = [set(r["tools"]) for r in summary["requests"] if r["tools"]]
    assert any("tool_search" in t for t in offered), offered


@needs_codex
def test_codex_bridge_apply_patch_writes_nothing_on_the_host(box, tmp_path):  # noqa: F811
    """The profile's reason for allowing apply_patch in bridge mode holds: Codex's own editor,
    under `--sandbox read-only` in bubblewrap, writes nothing, neither in the sandbox's
    workspace (seen from the host) nor in the host's /tmp."""
    host_tmp = Path("/tmp") / f"ale-bridge-patch-{os.getpid()}.txt"
    patch = (f"*** Begin Patch\n*** Add File: {host_tmp}\n+x\n"
             f"*** Add File: {box.workspace / 'patched.txt'}\n+x\n*** End Patch")
    api = FakeModelAPI(script={"steps": [[("apply_patch", {"input": patch})]]}).start()
    try:
        ctx, writer = make_ctx(box, tmp_path)
        out = asyncio.run(CommandAgent(_codex(api, model="gpt-5.5")).run(ctx))
        writer.close(usage=out.usage, end=out.end.value)
    finally:
        api.stop()
    assert out.end == AgentEnd.FINISHED, out.detail
    outputs = [i for r in api.requests if r["body"] for i in r["body"].get("input") or []
               if isinstance(i, dict) and i.get("type") in ("custom_tool_call_output", "function_call_output")]
    assert outputs and "rejected" in str(outputs[0].get("output")), outputs  # made, and refused by Codex's sandbox
    assert not host_tmp.exists() and not (box.workspace / "patched.txt").exists()
    summary = summarize(tmp_path)
    assert summary is not None and not summary["refusals"], summary


@needs_codex
def test_codex_through_the_gateway_passes_and_its_tools_are_recorded(box, tmp_path, fake_api, monkeypatch):  # noqa: F811
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-operator-secret-0123456789")
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent(_codex(fake_api)).run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FINISHED, (out.detail, (tmp_path / "agent" / "stderr.log").read_text()[-3000:])
    assert (box.workspace / "answer.txt").read_text() == "42\n"
    summary = summarize(tmp_path)
    assert summary is not None and not summary["problems"] and not summary["refusals"]
    offered = [set(r["tools"]) for r in summary["requests"] if r["tools"]]
    profile = set(BUILTIN_PROFILES["codex-0.171"]["allow"])
    # Exactly the bridge's four tools (namespace mcp__ale) and the profile's tools, each with its reason.
    # (tool_search and apply_patch only with a model Codex knows: this one it does not.)
    four = {"shell", "read_file", "write_file", "list_dir"}
    assert offered and all(four | (profile - {"tool_search", "apply_patch"}) <= t <= four | profile for t in offered), offered
    model_calls = [r for r in fake_api.requests if r["path"] == "/v1/responses"]
    assert model_calls and all(r["headers"].get("authorization") == "Bearer sk-proj-operator-secret-0123456789" for r in model_calls)
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert b"sk-proj-operator-secret" not in f.read_bytes(), f
    assert out.usage["input_tokens"] > 0 and out.usage["cost_usd"] > 0
    turns = json.loads((tmp_path / "agent" / "gateway" / "turns.json").read_text())["turns"]
    calls = [c for t in turns for c in t["tool_calls"]]
    assert calls and calls[0]["name"] == "shell" and calls[0]["step"] == 1 and turns[-1]["text"] == "done"
    _model_side_in_trajectory(tmp_path, "shell")
    conf = json.loads((tmp_path / "agent" / "confinement.json").read_text())
    assert conf["kind"] == "bubblewrap" and conf["network"]["interfaces"] == ["lo"]


@needs_codex
def test_codex_with_its_shell_on_is_refused_by_the_gateway(box, tmp_path, fake_api):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent(_codex(fake_api, builtins_off=False)).run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FAILED and "exec_command" in (out.detail or ""), out.detail
    summary = summarize(tmp_path)
    assert summary is not None and summary["refusals"] and "exec_command" in summary["refusals"][0]["forbidden"]
    assert summary["refusals"][0]["before_any_answer"] is True
    assert not [r for r in fake_api.requests if r["path"] == "/v1/responses" and "exec_command" in json.dumps(r["body"].get("tools"))]
    assert not (box.workspace / "answer.txt").exists()


GEMINI = PREFIX / "gemini" / "node_modules" / ".bin" / "gemini"
GEMINI_BRIDGE = ["mcp_ale_shell", "mcp_ale_read_file", "mcp_ale_write_file", "mcp_ale_list_dir"]


def _gemini(api: FakeModelAPI, run_dir: Path, *, builtins_off: bool = True) -> dict:
    # User settings in the harness's own HOME (RUN/agent/home): the system settings file
    # would be skipped under /tmp, which is world-writable (docs/agents.md).
    settings = {"mcpServers": {"ale": {"httpUrl": "${ALE_MCP_URL}", "headers": {"Authorization": "Bearer ${ALE_MCP_TOKEN}"},
                                       "trust": True, "timeout": 600000}},
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "privacy": {"usageStatisticsEnabled": False}, "general": {"disableAutoUpdate": True}}
    if builtins_off:
        settings["tools"] = {"core": GEMINI_BRIDGE}
    home = run_dir / "agent" / "home" / ".gemini"
    home.mkdir(parents=True)
    (home / "settings.json").write_text(json.dumps(settings))
    return {
        "command": [str(GEMINI), "--prompt={prompt}", "--yolo", "--skip-trust", "--allowed-mcp-server-names", "ale",
                    "--model", "gemini-fake-1"],
        "confine": {"install": [str(PREFIX / "gemini")]},
        "prices": {"gemini-fake-1": {"input_per_mtok": 1.25, "output_per_mtok": 10.0}},
        **_upstreams(api),
    }


needs_gemini = pytest.mark.requires(GEMINI.exists(), f"Gemini CLI is not installed under {PREFIX} (scripts/setup.sh, npm)")


@needs_gemini
def test_gemini_cli_through_the_gateway_passes_and_its_tools_are_recorded(box, tmp_path, fake_api, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-operator-secret-0123456789")
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent(_gemini(fake_api, tmp_path)).run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FINISHED, (out.detail, (tmp_path / "agent" / "stderr.log").read_text()[-3000:])
    assert (box.workspace / "answer.txt").read_text() == "42\n"
    summary = summarize(tmp_path)
    assert summary is not None and not summary["problems"] and not summary["refusals"]
    offered = [r["tools"] for r in summary["requests"] if r["tools"]]
    assert offered and all(set(t) == set(GEMINI_BRIDGE) for t in offered), offered
    model_calls = [r for r in fake_api.requests if ":streamGenerateContent" in r["path"] or ":generateContent" in r["path"]]
    assert model_calls and all(r["headers"].get("x-goog-api-key") == "AIza-operator-secret-0123456789" for r in model_calls)
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert b"AIza-operator-secret" not in f.read_bytes(), f
    assert out.usage["input_tokens"] > 0 and out.usage["cost_usd"] > 0
    _model_side_in_trajectory(tmp_path, "mcp_ale_shell")
    conf = json.loads((tmp_path / "agent" / "confinement.json").read_text())
    assert conf["kind"] == "bubblewrap" and conf["network"]["interfaces"] == ["lo"]


@needs_gemini
def test_gemini_cli_with_its_builtin_shell_is_refused_by_the_gateway(box, tmp_path, fake_api):  # noqa: F811
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(CommandAgent(_gemini(fake_api, tmp_path, builtins_off=False)).run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FAILED and "run_shell_command" in (out.detail or ""), out.detail
    summary = summarize(tmp_path)
    assert summary is not None and summary["refusals"] and "run_shell_command" in summary["refusals"][0]["forbidden"]
    assert summary["refusals"][0]["before_any_answer"] is True
    assert not [r for r in fake_api.requests if "run_shell_command" in json.dumps((r["body"] or {}).get("tools"))]
    assert not (box.workspace / "answer.txt").exists()
