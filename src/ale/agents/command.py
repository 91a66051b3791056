"""The `command` agent: an external harness (Claude Code, Codex CLI, Gemini CLI, ...)
launched on the controller side, reaching the sandbox only through the MCP bridge.

Configuration (``AgentSpec.config``):

- ``command`` (required): argv list, or one string split like a shell would
  (no shell runs it). Placeholders, substituted inside each argument:
  ``{prompt}``, ``{prompt_file}``, ``{workdir}``, ``{input_dir}``,
  ``{mcp_config}`` (path of the MCP client config written to the run's
  ``agent/`` folder), ``{mcp_url}``, ``{agent_dir}``.
- ``env_pass``: names copied from the controller's environment besides
  ``PATH``, ``HOME``, ``LANG`` (e.g. ``ANTHROPIC_API_KEY``).
- ``env``: constants to set (placeholders allowed), e.g.
  ``{"GEMINI_CLI_SYSTEM_SETTINGS_PATH": "{mcp_config}"}``.
- ``mcp_config_format``: ``claude`` (default) or ``gemini``.
- ``cwd``: where the harness starts (default: an empty ``agent/cwd`` folder, so
  it sees no repository around it).
- ``max_steps``: tool calls allowed (the run's step limit applies too).
- ``kill_grace_s``: seconds between SIGTERM and SIGKILL at the end (default 2).
- ``gateway`` (default true): every model request goes through the run's model
  gateway (``ale.agents.gateway``). The harness gets ``OPENAI_BASE_URL``,
  ``ANTHROPIC_BASE_URL``, ``GOOGLE_GEMINI_BASE_URL`` pointing at it and the run's
  token as ``OPENAI_API_KEY``, ``CODEX_API_KEY``, ``ANTHROPIC_API_KEY``,
  ``GEMINI_API_KEY`` (the operator's keys stay in the gateway; naming them in
  ``env_pass`` passes the token instead). Placeholder ``{gateway_url}``.
  ``ALE_GATEWAY_OPENAI_UPSTREAM`` / ``_ANTHROPIC_`` / ``_GEMINI_`` (config keys or
  the controller's environment) say where it forwards; ``harness_profile`` names
  harness-internal tools allowed besides the bridge's, each with its reason;
  ``prices`` is the price table for the run's cost (flat, or ``{"version", "models"}``);
  ``budgets`` the gateway's budgets and provider retries (``GatewayLimits.from_config``).
- ``confine`` (default: true with the gateway): run the harness in bubblewrap
  (``ale.agents.gateway.confine``): ``true``, ``false`` or ``{"install": [folders of
  the harness's installation], "python": "/usr/bin/python3", "infer": true}``. The
  installation is read from the command line too (``infer_install``: the program's
  prefix, its interpreter's, the files its arguments name) unless ``infer`` is false.
  The confinement is recorded in ``agent/confinement.json``.

The harness also gets ``ALE_MCP_URL``, ``ALE_MCP_TOKEN`` and ``ALE_MCP_CONFIG``.
Grader keys and cloud credentials are never passed (see ``secrets.py``). Its
stdout and stderr are kept as ``agent/stdout.log`` and ``agent/stderr.log``.
It runs in its own process group, and that whole group is killed when the
agent's turn ends, however it ends (exit, step limit, wall time, cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from ale import layout
from ale.agents.base import Agent, AgentContext, AgentEnd, AgentOutcome, provider_outcome
from ale.agents.errors import AgentConfigError
from ale.agents.gateway.confine import (
    UnixRelay,
    bwrap_argv,
    bwrap_path,
    check_install,
    infer_install,
)
from ale.agents.gateway.limits import GatewayLimits
from ale.agents.gateway.server import (
    KEY_VARS,
    UPSTREAM_VARS,
    ModelGateway,
    harness_env,
    resolve_upstreams,
    serve_gateway,
)
from ale.agents.gateway.tools import HarnessProfile, ToolPolicy
from ale.agents.mcp_bridge import ToolBridge, mcp_config, serve_http
from ale.agents.secrets import BASE_ENV, REDACTED, build_agent_env
from ale.status import AgentLimit

_GATEWAY_KEYS = {"gateway", "harness_profile", "prices", "budgets", "confine", *UPSTREAM_VARS.values()}
_KNOWN_KEYS = {"command", "env_pass", "env", "mcp_config_format", "cwd", "max_steps", "kill_grace_s", *_GATEWAY_KEYS}
_OPERATOR_KEYS = frozenset(n for names in KEY_VARS.values() for n in names)


def _substitute(template: str, values: dict[str, str]) -> str:
    """Replace ``{name}`` placeholders; literal braces elsewhere are kept."""
    out = template
    for name, value in values.items():
        out = out.replace("{" + name + "}", value)
    return out


class CommandAgent(Agent):
    name = "command"

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = dict(config or {})
        unknown = set(self.config) - _KNOWN_KEYS
        if unknown:
            raise AgentConfigError(
                f"command agent: unknown config keys {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
        cmd = self.config.get("command")
        if isinstance(cmd, str):
            try:
                cmd = shlex.split(cmd)
            except ValueError as e:
                raise AgentConfigError(
                    f"command agent: config 'command' cannot be split ({e}): {self.config['command']!r}") from e
        if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
            raise AgentConfigError(
                "command agent: config 'command' must be a non-empty list of strings (or one string)")
        self.argv_template: list[str] = cmd
        self.env_pass = list(self.config.get("env_pass", []))
        self.env_constants = {str(k): str(v) for k, v in dict(self.config.get("env", {})).items()}
        self.mcp_format = str(self.config.get("mcp_config_format", "claude"))
        if self.mcp_format not in ("claude", "gemini"):
            raise AgentConfigError(
                f"command agent: mcp_config_format {self.mcp_format!r} unknown; use 'claude' or 'gemini'")
        self.max_steps = self.config.get("max_steps")
        self.kill_grace_s = float(self.config.get("kill_grace_s", 2.0))
        self.gateway = bool(self.config.get("gateway", True))
        self.profile = HarnessProfile.load(self.config.get("harness_profile"))
        self.prices = dict(self.config.get("prices") or {})
        if self.config.get("budgets") is not None:  # the gateway's budgets and retries (a named harness sets its own)
            self.limits = GatewayLimits.from_config(self.config["budgets"], models=(), model_calls_only=False,
                                                    max_body_bytes=None)
        if self.gateway:  # the operator's keys stay in the gateway: the harness gets the run's token
            self.env_pass = [n for n in self.env_pass if n not in _OPERATOR_KEYS]
        # Validate the environment now, so a forbidden name fails before any run starts.
        build_agent_env(passthrough=self.env_pass, constants=self.env_constants)
        # Confined by default (with the gateway): the harness sees its installation,
        # its folders and the two loopback services, nothing else of the host.
        confine = self.config.get("confine", self.gateway)
        if confine and not self.gateway:
            raise AgentConfigError("command agent: confine needs the gateway (the harness reaches nothing else)")
        if confine is True:
            confine = {}
        if confine is not False and not isinstance(confine, dict):
            raise AgentConfigError(
                "command agent: confine must be true, false or {\"install\": [...], \"python\": ..., \"infer\": true}")
        self.confine: dict[str, Any] | None = confine if isinstance(confine, dict) else None
        if self.confine is not None:
            try:
                bwrap_path()
            except AgentConfigError as e:
                if "confine" in self.config:
                    raise
                raise AgentConfigError(
                    f"{e}; or set confine: false to run the harness unconfined (recorded in the evidence)") from e
            if "{" not in cmd[0]:
                # A harness not found fails before any run starts; the folders are
                # kept for every run's preflight (same command line, same PATH).
                self._template_install = self._install(cmd)[0]
                check_install(self._template_install, private=[])

    _template_install: list[str] | None = None
    gateway_url = ""  # the run's gateway, while the harness runs with one
    limits: GatewayLimits | None = None  # endpoints, model, budgets (the named harness agents set them)

    def preflight(self, *, private: list[Path]) -> None:
        """Before a run: a confined harness's installation folders must not hold the
        runs folder or the task folder (raises AgentConfigError, naming the folder)."""
        if self._template_install is not None:
            check_install(self._template_install, private=private)

    def _install(self, argv: list[str], path_env: str | None = None) -> tuple[list[str], list[Path]]:
        """The folders bound read-only for a confined harness: those named in
        ``confine.install`` and, unless ``confine.infer`` is false, those its command
        line shows (``infer_install``), with the files its arguments name."""
        assert self.confine is not None
        named = [str(p) for p in self.confine.get("install", [])]
        if not self.confine.get("infer", True):
            return named, []
        folders, files = infer_install(argv, path_env=path_env)
        return [*named, *(f for f in folders if f not in named)], [Path(f) for f in files]

    def evidence(self) -> dict[str, Any]:
        """What the harness is given, for the run's evidence (names, never values)."""
        return {
            "argv_template": self.argv_template,
            "env_names": sorted({*BASE_ENV, *self.env_pass, *self.env_constants,
                                 "ALE_MCP_URL", "ALE_MCP_TOKEN", "ALE_MCP_CONFIG",
                                 *(harness_env("", "") if self.gateway else {})}),
            "mcp_config_format": self.mcp_format,
            "process_group_killed_at_end": True,
            "gateway": self.gateway,
            "harness_profile": self.profile.to_dict(),
            "confined": self.confine is not None,
        }

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        agent_dir = Path(ctx.run_dir) / layout.AGENT_DIR
        agent_dir.mkdir(parents=True, exist_ok=True)
        cwd = Path(self.config["cwd"]) if self.config.get("cwd") else agent_dir / "cwd"
        cwd.mkdir(parents=True, exist_ok=True)
        prompt_file = agent_dir / layout.Agent.PROMPT
        prompt_file.write_text(ctx.prompt)
        limits = [n for n in (self.max_steps, ctx.max_steps) if n is not None]
        bridge = ToolBridge(ctx.tools, max_steps=min(limits) if limits else None)
        config_path = agent_dir / (
            layout.Agent.MCP_SETTINGS if self.mcp_format == "gemini" else layout.Agent.MCP_CONFIG)
        async with contextlib.AsyncExitStack() as stack:
            sock_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ale-gw-")))  # short: unix paths
            gw: ModelGateway | None = None
            if self.gateway:
                gw = ModelGateway(
                    Path(ctx.run_dir), ToolPolicy(tuple(ctx.tools.allowlist), self.profile),
                    upstreams=resolve_upstreams(self.config), prices=self.prices, limits=self.limits,
                )
                self.gateway_url = await stack.enter_async_context(
                    serve_gateway(gw, unix_path=sock_dir / "gateway.sock" if self.confine is not None else None))
            url, token = await stack.enter_async_context(serve_http(bridge))
            sockets: dict[int, Path] = {}
            if self.confine is not None and gw is not None:
                sockets[int(self.gateway_url.rsplit(":", 1)[1])] = sock_dir / "gateway.sock"
                bport = int(url.split(":")[2].split("/")[0])
                sockets[bport] = await stack.enter_async_context(UnixRelay(sock_dir / "bridge.sock", bport).serve())
            config_path.write_text(
                json.dumps(mcp_config(url, token, fmt=self.mcp_format, tools=ctx.tools.allowlist), indent=2))
            os.chmod(config_path, 0o600)
            try:
                return await self._run_harness(ctx, bridge, agent_dir, cwd, url, token, config_path, prompt_file,
                                               gw, sockets)
            finally:
                # The token dies with the bridge; the file keeps the shape, not the secret.
                with contextlib.suppress(OSError):
                    doc = mcp_config(url, REDACTED, fmt=self.mcp_format, tools=ctx.tools.allowlist)
                    config_path.write_text(json.dumps(doc, indent=2))

    async def _run_harness(
        self,
        ctx: AgentContext,
        bridge: ToolBridge,
        agent_dir: Path,
        cwd: Path,
        url: str,
        token: str,
        config_path: Path,
        prompt_file: Path,
        gw: ModelGateway | None = None,
        sockets: dict[int, Path] | None = None,
    ) -> AgentOutcome:
        values = {
            "prompt": ctx.prompt,
            "prompt_file": str(prompt_file),
            "workdir": ctx.workdir,
            "input_dir": ctx.input_dir,
            "mcp_config": str(config_path),
            "mcp_url": url,
            "agent_dir": str(agent_dir),
            "gateway_url": self.gateway_url,
        }
        argv = [_substitute(a, values) for a in self.argv_template]
        env = build_agent_env(
            passthrough=self.env_pass,
            constants={k: _substitute(v, values) for k, v in self.env_constants.items()},
        )
        env.update({"ALE_MCP_URL": url, "ALE_MCP_TOKEN": token, "ALE_MCP_CONFIG": str(config_path)})
        if gw is not None:
            env.update(harness_env(values["gateway_url"], gw.token))
        if self.confine is not None:
            home = agent_dir / "home"
            home.mkdir(exist_ok=True)
            env["HOME"] = str(home)
            install, named_files = self._install(argv, env.get("PATH"))
            check_install(install, private=[Path(ctx.run_dir)])  # preflight checked the runs and task folders
            argv, record = bwrap_argv(
                argv, cwd=cwd, home=home, install=install, files=[prompt_file, config_path, *named_files],
                sockets=sockets or {}, python=str(self.confine.get("python", "/usr/bin/python3")),
            )
            record["install_named"] = [str(p) for p in self.confine.get("install", [])]
            (agent_dir / layout.Agent.CONFINEMENT).write_text(json.dumps(record, indent=2))
        (agent_dir / layout.Agent.COMMAND).write_text(
            json.dumps({"argv": argv, "cwd": str(cwd), "env_names": sorted(env)}, indent=2)
        )
        started = time.monotonic()
        with open(agent_dir / layout.Agent.STDOUT, "wb") as out, open(agent_dir / layout.Agent.STDERR, "wb") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=str(cwd),
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own process group, killed as a whole at the end
                )
            except OSError as e:
                return AgentOutcome(AgentEnd.FAILED, detail=f"cannot start the harness {argv[0]!r}: {e}")
            try:
                return await self._supervise(ctx, bridge, proc, started, agent_dir, gw)
            finally:
                await _kill_group(proc, self.kill_grace_s)

    async def _supervise(
        self, ctx: AgentContext, bridge: ToolBridge, proc: asyncio.subprocess.Process, started: float, agent_dir: Path,
        gw: ModelGateway | None = None,
    ) -> AgentOutcome:
        exited = asyncio.ensure_future(proc.wait())
        limited = asyncio.ensure_future(bridge.limit_reached.wait())
        refused = asyncio.ensure_future(gw.refused.wait() if gw is not None else asyncio.Event().wait())
        budget = asyncio.ensure_future(gw.budget_reached.wait() if gw is not None else asyncio.Event().wait())
        failed = asyncio.ensure_future(gw.provider_failed.wait() if gw is not None else asyncio.Event().wait())
        try:
            done, _ = await asyncio.wait({exited, limited, refused, budget, failed}, timeout=ctx.wall_time_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            limited.cancel()
            refused.cancel()
            budget.cancel()
            failed.cancel()
            if not exited.done():
                exited.cancel()
        usage: dict[str, Any] = {"tool_calls": bridge.executed, "rejected_http_requests": bridge.rejected_requests,
                                 "seconds": round(time.monotonic() - started, 3)}
        if gw is not None:
            usage.update(gw.usage)
            usage["gateway_unauthorized"] = gw.unauthorized
        if refused in done:
            r = gw.refusals[0] if gw is not None and gw.refusals else {}
            return AgentOutcome(AgentEnd.FAILED,
                                detail=f"the model gateway refused request {r.get('seq')}: it offered the model "
                                f"{', '.join(r.get('forbidden', []))}, outside the allowlist; harness stopped",
                                usage=usage)
        if budget in done and gw is not None:
            return AgentOutcome(AgentEnd.TIMEOUT, detail=f"{gw.budget_reason}; harness stopped", usage=usage,
                                limit=gw.budget_kind)
        if gw is not None and gw.provider_failure is not None and (failed in done or proc.returncode != 0):
            return provider_outcome(gw, usage)
        if exited in done:
            rc = proc.returncode
            usage["exit_code"] = -1 if rc is None else rc
            if bridge.failures:
                return AgentOutcome(AgentEnd.FAILED,
                                    detail="tool calls failed in the provider: " + "; ".join(bridge.failures[:5]),
                                    usage=usage)
            if rc != 0:
                tail = _tail(agent_dir / layout.Agent.STDERR)
                return AgentOutcome(AgentEnd.FAILED,
                                    detail=f"harness exited with code {rc}"
                                    + (f"; stderr ends:\n{tail}" if tail else ""),
                                    usage=usage)
            return AgentOutcome(AgentEnd.FINISHED, detail="harness exited with code 0", usage=usage)
        if limited in done:
            return AgentOutcome(AgentEnd.TIMEOUT,
                                detail=f"step limit of {bridge.max_steps} tool calls reached; harness stopped",
                                usage=usage, limit=AgentLimit.TOOL_CALLS)
        return AgentOutcome(AgentEnd.TIMEOUT, detail=f"wall time of {ctx.wall_time_s:.0f}s reached; harness stopped",
                            usage=usage, limit=AgentLimit.WALL_TIME)


async def _kill_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the harness's process group, then SIGKILL whatever is left of it."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        await asyncio.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _tail(path: Path, n: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", errors="replace").strip()
