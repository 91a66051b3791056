"""Named harness agents: ``claude-code``, ``codex``, ``gemini-cli``.

Each is a harness at a pinned version (``ale.sandbox.harness_image.HARNESSES``)
with a model and a ``mode``:

- ``native`` (default): the harness runs **inside** the sealed sandbox, as the
  candidate user, with its own tools (shell, edit, read, search, sub-agents). Its
  installation is a read-only image layer over the run's image (built on the trusted
  side, content-cached; ``ale.runs.extensions.NativeHarnessExtension`` puts it under
  the sandbox). Its ``HOME`` and settings are on the sandbox's size-capped ``/tmp``.
  Its only way out is the channel to the run's model gateway
  (``ale.sandbox.channel``: a relay on ``127.0.0.1:8417`` inside the sandbox, carried
  over a ``docker exec`` stream; no mount, port or network is added). The gateway is
  the seal: only model calls are forwarded, the model is pinned, server-side tools
  refused, budgets enforced.
- ``bridge``: the ``command`` agent's design, unchanged (outside the sandbox,
  confined with bubblewrap, the four MCP tools), with the configuration
  docs/agents.md gives for the harness; the gateway gets the same endpoint, model
  and budget limits.

Configuration keys: ``mode``, ``version`` (must be the pinned one, if given),
``model``, ``budgets`` (``max_requests``, ``max_input_tokens``, ``max_output_tokens``,
``max_cost_usd``, ``max_concurrency``, ``max_body_bytes``), ``prices``, ``args``
(extra arguments before the prompt), ``env`` (extra constants), the gateway's
upstream variables (``ALE_GATEWAY_*_UPSTREAM``); bridge only: ``install`` (the
installation folder; default ``$ALE_HARNESS_PREFIX/<claude|codex|gemini>``),
``confine``; native only: ``channel_port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ale import layout
from ale.agents.base import Agent, AgentContext, AgentEnd, AgentOutcome, provider_outcome
from ale.agents.command import CommandAgent
from ale.agents.errors import AgentConfigError
from ale.agents.gateway.limits import GatewayLimits
from ale.agents.gateway.server import (
    UPSTREAM_VARS,
    ModelGateway,
    harness_env,
    resolve_upstreams,
    serve_gateway,
)
from ale.agents.gateway.tools import HarnessProfile, ToolPolicy
from ale.agents.harness_transcript import copy_out
from ale.agents.secrets import build_agent_env
from ale.sandbox.harness_image import HARNESSES, HarnessPackage
from ale.sandbox.policy import GIB, MIB, IsolationPolicy, LimitNeeds, LimitRefused, raise_to_needs
from ale.sandbox.usage import UsageMonitor, limit_reached
from ale.status import AgentLimit

MODES = ("native", "bridge")
NATIVE_HOME = "/tmp/ale-harness-home"  # on the sandbox's size-capped /tmp tmpfs
_KNOWN_KEYS = {"mode", "version", "model", "budgets", "prices", "args", "env", "install", "confine", "channel_port",
               *UPSTREAM_VARS.values()}
BRIDGE_TOOLS = ("shell", "read_file", "write_file", "list_dir")
# Background traffic a harness would try (and fail) inside the seal: off.
_QUIET = {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
          "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
PREFIX_DIRS = {"claude-code": "claude", "codex": "codex", "gemini-cli": "gemini"}
# What a native harness needs of the sandbox's limits: about twice the peaks measured
# with its heaviest features (sub-agents, parallel shell calls, search; docs/agents.md
# "Limits"), which the default policy (256 pids, 8 GiB, /tmp 1 GiB) gives. A run whose
# policy gives less has it raised where the policy leaves the limit to its default,
# and refused at preflight where the operator or the task card states it.
SANDBOX_NEEDS = LimitNeeds(pids=128, memory_bytes=1 * GIB, tmp_bytes=256 * MIB)
# Gemini CLI 0.61's own
GEMINI_SUBAGENTS = ("codebase_investigator", "cli_help", "generalist", "confucius", "browser_agent")
CODEX_OFF = ["--disable", "shell_tool", "--disable", "unified_exec", "--disable", "view_image",
             "--disable", "image_generation", "--disable", "goals", "--disable", "apps", "--disable", "plugins"]


def harness_prefix() -> Path:
    return Path(os.environ.get("ALE_HARNESS_PREFIX", "/opt/ale-harnesses"))


class HarnessAgent(Agent):
    """One named harness (subclasses set ``name`` and ``default_model``)."""

    name = ""
    default_model = ""

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = dict(config or {})
        unknown = set(self.config) - _KNOWN_KEYS
        if unknown:
            raise AgentConfigError(
                f"{self.name} agent: unknown config keys {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
        self.harness: HarnessPackage = HARNESSES[self.name]
        self.mode = str(self.config.get("mode", "native"))
        if self.mode not in MODES:
            raise AgentConfigError(f"{self.name} agent: mode {self.mode!r} unknown; use 'native' or 'bridge'")
        version = self.config.get("version")
        if version is not None and str(version) != self.harness.version:
            raise AgentConfigError(f"{self.name} agent: version {version!r} is not the pinned {self.harness.version} "
                                   "(ale runs the versions it has checked; see docs/agents.md)")
        self.model = str(self.config.get("model") or self.default_model)
        self.prices = dict(self.config.get("prices") or {})
        self.args = [str(a) for a in self.config.get("args") or []]
        self.env = {str(k): str(v) for k, v in dict(self.config.get("env") or {}).items()}
        build_agent_env(passthrough=[], constants=self.env)  # a grader or cloud variable is refused
        self.limits = GatewayLimits.from_config(self.config.get("budgets"), models=(self.model,), model_calls_only=True)
        self.channel_port = int(self.config.get("channel_port", 8417))
        self.bridge: CommandAgent | None = None
        # fit_policy's record: needs, what the policy gave, what was raised
        self.sandbox_limits: dict[str, Any] | None = None
        if self.mode == "bridge":
            self.bridge = CommandAgent(self._bridge_config())
            self.bridge.limits = self.limits

    # -- what both modes share -------------------------------------------------
    @property
    def native(self) -> bool:
        return self.mode == "native"

    def evidence(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "harness": self.name, "package": self.harness.package, "version": self.harness.version, "model": self.model,
            "mode": self.mode, "gateway_limits": self.limits.to_dict(),
        }
        if self.bridge is not None:
            doc["bridge"] = self.bridge.evidence()
        else:
            doc["sandbox_needs"] = SANDBOX_NEEDS.to_dict()
            doc.update({"install_dir": self.harness.install_dir, "home": NATIVE_HOME,
                        "channel": {"kind": "exec-stream", "listen_inside": f"127.0.0.1:{self.channel_port}"},
                        "argv_template": self._native_argv("{prompt}", "{input_dir}"),
                        "env_names": sorted(self._native_env("", "x"))})
        return doc

    @property
    def sandbox_needs(self) -> LimitNeeds | None:
        """What the harness needs of the sandbox's limits (None in bridge mode: it runs outside)."""
        return SANDBOX_NEEDS if self.native else None

    def fit_policy(self, policy: IsolationPolicy) -> IsolationPolicy:
        """The run's policy with the limits this harness needs (``raise_to_needs``:
        raised only where the policy leaves them to their default, memory within the
        host's), recorded in ``sandbox_limits``; AgentConfigError when the policy or the
        host forbids it."""
        needs = self.sandbox_needs
        if needs is None:
            return policy
        try:
            fitted, raised = raise_to_needs(policy, needs, who=f"{self.name} ({self.mode} mode)")
        except LimitRefused as e:
            raise AgentConfigError(str(e)) from e
        self.sandbox_limits = {"needs": needs.to_dict(), "raised": raised,
                               "given": {"pids_limit": fitted.pids_limit, "memory_bytes": fitted.memory_bytes,
                                         "tmpfs": [t.path + ":" + t.options for t in fitted.tmpfs]}}
        return fitted

    def preflight(self, *, private: list[Path]) -> None:
        if self.bridge is not None:
            self.bridge.preflight(private=private)

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        if self.bridge is not None:
            self._bridge_files(ctx)
            return await self.bridge.run(ctx)
        return await self._run_native(ctx)

    # -- bridge ----------------------------------------------------------------
    def _install(self) -> Path:
        folder = Path(self.config.get("install") or harness_prefix() / PREFIX_DIRS[self.name])
        pkg = folder / "node_modules" / self.harness.package / "package.json"
        try:
            found = json.loads(pkg.read_text()).get("version")
        except (OSError, ValueError) as e:
            raise AgentConfigError(f"{self.name} agent (bridge): {self.harness.spec} is not installed under {folder} "
                                   f"(scripts/setup.sh installs it; or set install): {e}") from e
        if found != self.harness.version:
            raise AgentConfigError(f"{self.name} agent (bridge): {folder} holds {self.harness.package} {found}, "
                                   f"not the pinned {self.harness.version}")
        return folder

    def _bridge_config(self) -> dict[str, Any]:
        folder = self._install()
        bin_ = str(folder / "node_modules" / ".bin" / PREFIX_DIRS[self.name])
        cfg: dict[str, Any] = {"confine": self.config.get("confine", {"install": [str(folder)]}), "prices": self.prices,
                               **{k: self.config[k] for k in UPSTREAM_VARS.values() if k in self.config}}
        if self.name == "claude-code":
            cfg["command"] = [bin_, "-p", "--mcp-config", "{mcp_config}", "--strict-mcp-config", "--tools", "",
                              "--allowedTools", ",".join(f"mcp__ale__{t}" for t in BRIDGE_TOOLS),
                              "--disallowedTools",
                              "Bash,Edit,Write,Read,MultiEdit,NotebookEdit,Glob,Grep,LS,WebFetch,WebSearch,Task",
                              "--output-format", "stream-json", "--verbose", "--model", self.model, *self.args,
                              "--", "{prompt}"]
            cfg["env"] = {**_QUIET, **self._model_env(), **self.env}
        elif self.name == "codex":
            provider = ('model_providers.gw={name="gw", base_url="{gateway_url}/openai/v1", wire_api="responses", '
                        'env_key="CODEX_API_KEY", supports_websockets=false}')
            cfg["command"] = [bin_, "exec", "--skip-git-repo-check", "--ephemeral", "--ignore-user-config",
                              "--sandbox", "read-only",
                              "-c", provider, "-c", 'model_provider="gw"', "-m", self.model,
                              "-c", 'mcp_servers.ale.url="{mcp_url}"',
                              "-c", 'mcp_servers.ale.bearer_token_env_var="ALE_MCP_TOKEN"',
                              "-c", 'mcp_servers.ale.default_tools_approval_mode="approve"',
                              "-c", 'web_search="disabled"',
                              *CODEX_OFF, *self.args, "--", "{prompt}"]
            cfg["harness_profile"] = "codex-0.171"
            cfg["env"] = dict(self.env)
        else:
            cfg["command"] = [bin_, "--prompt={prompt}", "--yolo", "--skip-trust", "--allowed-mcp-server-names", "ale",
                              "--model", self.model, *self.args]
            cfg["env"] = dict(self.env)
        return cfg

    def _bridge_files(self, ctx: AgentContext) -> None:
        """Gemini CLI reads its MCP server and tool list from user settings in its HOME."""
        if self.name != "gemini-cli":
            return
        settings = {"mcpServers": {"ale": {"httpUrl": "${ALE_MCP_URL}",
                                           "headers": {"Authorization": "Bearer ${ALE_MCP_TOKEN}"},
                                           "trust": True, "timeout": 600000}},
                    "security": {"auth": {"selectedType": "gemini-api-key"}},
                    "privacy": {"usageStatisticsEnabled": False}, "general": {"disableAutoUpdate": True},
                    "tools": {"core": [f"mcp_ale_{t}" for t in ctx.tools.allowlist]}}
        home = Path(ctx.run_dir) / layout.AGENT_DIR / "home" / ".gemini"
        home.mkdir(parents=True, exist_ok=True)
        (home / "settings.json").write_text(json.dumps(settings, indent=2))

    # -- native ----------------------------------------------------------------
    def _model_env(self) -> dict[str, str]:
        """Every model the harness would pick by itself is the run's model."""
        if self.name == "claude-code":
            return {k: self.model for k in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL",
                                            "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                                            "ANTHROPIC_DEFAULT_OPUS_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")}
        if self.name == "gemini-cli":
            return {"GEMINI_MODEL": self.model}
        return {}

    def _native_argv(self, prompt: str, input_dir: str | None = None) -> list[str]:
        exe = self.harness.executable
        if self.name == "claude-code":
            return [exe, "-p", "--output-format", "stream-json", "--verbose", "--model", self.model,
                    "--permission-mode", "bypassPermissions", "--disallowedTools", "WebSearch,WebFetch",
                    *self.args, "--", prompt]
        if self.name == "codex":
            provider = ('model_providers.gw={name="gw", base_url="' + f"http://127.0.0.1:{self.channel_port}/openai/v1"
                        + '", wire_api="responses", env_key="CODEX_API_KEY", supports_websockets=false}')
            # Not --ephemeral: its session file is the transcript ale copies out (harness_transcript.py).
            return [self.harness.node, exe, "exec", "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox",
                    "-c", provider, "-c", 'model_provider="gw"', "-m", self.model, "-c", 'web_search="disabled"',
                    "--disable", "image_generation", "--disable", "apps", "--disable", "plugins", *self.args,
                    "--", prompt]
        # Gemini CLI's file tools reach only its workspace folders: the public package is one of them.
        include = ["--include-directories", input_dir] if input_dir else []
        return [self.harness.node, exe, f"--prompt={prompt}", "--yolo", "--skip-trust", "--model", self.model, *include,
                *self.args]

    def _native_env(self, url: str, token: str) -> dict[str, str]:
        return {**harness_env(url, token), **_QUIET, **self._model_env(), "HOME": f"{NATIVE_HOME}/{self.name}",
                "TMPDIR": "/tmp", "NO_UPDATE_NOTIFIER": "1", **self.env}

    def _native_files(self) -> dict[str, str]:
        """Settings written into the harness's HOME before it starts (path under HOME: content)."""
        if self.name == "gemini-cli":
            return {".gemini/settings.json": json.dumps({
                "security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": False},
                "general": {"disableAutoUpdate": True}, "tools": {"exclude": ["google_web_search", "web_fetch"]},
                # Its sub-agents name their own models (gemini-2.5-pro, flash): the run's model, or the
                # gateway refuses them.
                "agents": {"overrides": {a: {"modelConfig": {"model": self.model}} for a in GEMINI_SUBAGENTS}},
                # Not a heap of half the *host's* memory (its relaunch's --max-old-space-size, 12 GB on a 24 GB
                # host), above the sandbox's limit: node's own default, sized by the cgroup's memory limit.
                "advanced": {"autoConfigureMemory": False}})}
        return {}

    async def _run_native(self, ctx: AgentContext) -> AgentOutcome:
        from ale.sandbox.channel import ChannelError, ExecChannel

        sandbox = ctx.tools.sandbox
        agent_dir = Path(ctx.run_dir) / layout.AGENT_DIR
        agent_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        policy = ToolPolicy(tuple(ctx.tools.allowlist), HarnessProfile(), client_tools=True)
        gw = ModelGateway(Path(ctx.run_dir), policy, upstreams=resolve_upstreams(self.config), prices=self.prices,
                          limits=self.limits)
        usage: dict[str, Any] = {}
        record: dict[str, Any] = {"kind": "sandbox-native", "mode": "native", "harness": self.harness.spec,
                                  "user": getattr(getattr(sandbox, "policy", None), "user", None),
                                  "home": f"{NATIVE_HOME}/{self.name}"}
        if self.sandbox_limits is not None:
            record["sandbox_limits"] = self.sandbox_limits
        try:
            async with serve_gateway(gw) as gw_url:
                port = int(gw_url.rsplit(":", 1)[1])
                channel = ExecChannel(sandbox, gateway=("127.0.0.1", port), port=self.channel_port)
                monitor = await _usage_monitor(sandbox)
                try:
                    async with channel.serve(), monitor.watching():
                        outcome = await self._drive(ctx, sandbox, gw, agent_dir, started)
                        # candidate-written
                        await copy_out(sandbox, Path(ctx.run_dir), self.name, f"{NATIVE_HOME}/{self.name}")
                finally:
                    record["channel"] = await channel.record()
                    record["resources"] = monitor.record()
                outcome = _name_limits(outcome, record["resources"])
                usage.update(outcome.usage)
        except ChannelError as e:
            return AgentOutcome(AgentEnd.FAILED, detail=f"native mode: {e}", usage=usage)
        finally:
            (agent_dir / layout.Agent.CONFINEMENT).write_text(json.dumps(record, indent=2))
        usage.update(gw.usage)
        usage["gateway_unauthorized"] = gw.unauthorized
        usage["gateway_blocked"] = len(gw.blocked)
        outcome.usage = usage
        return outcome

    async def _drive(self, ctx: AgentContext, sandbox: Any, gw: ModelGateway, agent_dir: Path,
                     started: float) -> AgentOutcome:
        url = f"http://127.0.0.1:{self.channel_port}"
        env = self._native_env(url, gw.token)
        argv = self._native_argv(ctx.prompt, ctx.input_dir)
        files = self._native_files()
        setup = 'mkdir -p "$HOME" && chmod 700 "$HOME"'
        for i, rel in enumerate(files):
            setup += f' && mkdir -p "$HOME/$(dirname {rel})" && printf %s "$ALE_FILE_{i}" > "$HOME/{rel}"'
            env[f"ALE_FILE_{i}"] = files[rel]
        (agent_dir / layout.Agent.COMMAND).write_text(json.dumps(
            {"argv": [*argv[:-1], "{prompt}"] if argv[-1] == ctx.prompt else argv, "cwd": ctx.workdir,
             "env_names": sorted(env), "where": "inside the sandbox, as the candidate user"}, indent=2))
        remaining = max(1.0, ctx.wall_time_s - (time.monotonic() - started) - 5)
        run = asyncio.ensure_future(sandbox.exec(["sh", "-c", setup + ' && exec "$@"', "harness", *argv],
                                                 workdir=ctx.workdir, env=env, timeout=remaining,
                                                 output_limit=16 * 1024 * 1024))
        refused = asyncio.ensure_future(gw.refused.wait())
        budget = asyncio.ensure_future(gw.budget_reached.wait())
        failed = asyncio.ensure_future(gw.provider_failed.wait())
        try:
            done, _ = await asyncio.wait({run, refused, budget, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            refused.cancel()
            budget.cancel()
            failed.cancel()
        base = {"seconds": round(time.monotonic() - started, 3)}
        if run not in done:
            run.cancel()
            with contextlib.suppress(BaseException):
                await sandbox.kill_user_processes()  # the harness and whatever it started; the lifecycle sweeps again
            if budget in done:
                return AgentOutcome(AgentEnd.TIMEOUT, detail=f"{gw.budget_reason}; harness stopped", usage=base,
                                    limit=gw.budget_kind)
            if failed in done:
                return provider_outcome(gw, base)
            r = gw.refusals[0] if gw.refusals else {}
            return AgentOutcome(AgentEnd.FAILED,
                                detail=f"the model gateway refused request {r.get('seq')}: it offered the model "
                                f"{', '.join(r.get('forbidden', []))}, which reach outside the seal; harness stopped",
                                usage=base)
        res = run.result()
        (agent_dir / layout.Agent.STDOUT).write_bytes(res.stdout)
        (agent_dir / layout.Agent.STDERR).write_bytes(res.stderr)
        base["exit_code"] = res.exit_code
        if res.timed_out:
            return AgentOutcome(AgentEnd.TIMEOUT,
                                detail=f"wall time of {ctx.wall_time_s:.0f}s reached; harness stopped",
                                usage=base, limit=AgentLimit.WALL_TIME)
        if res.exit_code != 0 and gw.provider_failure is not None:
            return provider_outcome(gw, base)
        if res.exit_code != 0:
            tail = (res.stderr[-2000:].decode(errors="replace").strip()
                    or res.stdout[-2000:].decode(errors="replace").strip())
            return AgentOutcome(AgentEnd.FAILED,
                                detail=f"harness exited with code {res.exit_code}"
                                + (f"; output ends:\n{tail}" if tail else ""),
                                usage=base)
        return AgentOutcome(AgentEnd.FINISHED, detail="harness exited with code 0", usage=base)


async def _usage_monitor(sandbox: Any) -> UsageMonitor:
    """The sandbox's pids, memory and /tmp, watched from the host (``ale.sandbox.usage``)."""
    try:
        inspect = await asyncio.to_thread(sandbox.inspect)
    except Exception as e:  # any provider's failure: the record says why nothing was measured
        return UsageMonitor(None, reason=f"the sandbox's inspect failed: {e}")
    pid = (inspect.get("State") or {}).get("Pid")
    tmpfs = tuple(t.path for t in getattr(getattr(sandbox, "policy", None), "tmpfs", ())) or ("/tmp",)
    return UsageMonitor(pid if isinstance(pid, int) else None, tmpfs)


def _name_limits(outcome: AgentOutcome, resources: dict[str, Any]) -> AgentOutcome:
    """The sandbox limits the turn ran into, first in its detail and in its usage
    (``sandbox_limits_hit``, in result.json): a harness that exits 0 after its shell
    calls were refused (Codex reports EAGAIN to the model and goes on) scores what it
    wrote, and the record says why it could not do more."""
    hit = limit_reached(resources)
    if hit:
        outcome.detail = "; ".join(hit) + (f". {outcome.detail}" if outcome.detail else "")
        outcome.usage["sandbox_limits_hit"] = hit
    return outcome


class ClaudeCodeAgent(HarnessAgent):
    name = "claude-code"
    default_model = "claude-sonnet-4-5"


class CodexAgent(HarnessAgent):
    name = "codex"
    default_model = "gpt-5-codex"


class GeminiCliAgent(HarnessAgent):
    name = "gemini-cli"
    default_model = "gemini-2.5-pro"
