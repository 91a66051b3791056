"""AGENT: the agent's turn, bounded by its wall time, the workspace's limits and its sandbox's life."""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from typing import Any

from ale import layout
from ale.agents.base import AgentContext, AgentEnd, AgentOutcome
from ale.agents.registry import agent_evidence
from ale.agents.trajectory import TrajectoryWriter
from ale.layout import Evidence
from ale.runs.state import RunState
from ale.runs.steps.gateway import record_model_gateway
from ale.runs.steps.screen import SCREEN_END_OF_TURN, record_screen
from ale.runs.watchdog import WorkspaceLimits, watch
from ale.sandbox.base import Sandbox, SandboxError
from ale.sandbox.tools import ToolBox
from ale.status import AgentLimit


async def run_agent(state: RunState) -> None:
    plan, v = state.plan, state.variant
    agent = state.prep.agent
    state.record.store.write_json(Evidence.AGENT, agent_evidence(plan.agent))
    # what the agent was asked, signed with the run
    prompt = state.folder.run_dir / layout.agent_path(layout.Agent.PROMPT)
    prompt.parent.mkdir(exist_ok=True)
    prompt.write_text(v.description, encoding="utf-8", errors="surrogateescape")
    network = {"network_mode": plan.policy.network_mode,
               "controller": "outside the sandbox; tools reach it only through docker exec"}
    if agent.native:  # a named harness in native mode (ale.agents.harness)
        network["controller"] = ("the harness runs inside the sandbox; its only way out is an "
                                 "exec-attached stream to the run's model gateway (agent/confinement.json)")
    state.record.store.write_json(Evidence.NETWORK, network)
    state.live.trajectory = TrajectoryWriter(state.folder.run_dir, plan.run_id, plan.agent.display)
    deadline = time.monotonic() + state.prep.wall_time_s
    tools = ToolBox(
        state.sandbox,
        workdir=v.output_dir,
        allowlist=plan.agent.allowlist,
        recorder=state.live.trajectory,
        default_timeout=plan.limits.command_timeout_s,
        deadline=deadline,
        computer=state.extension.computer,
    )
    ctx = AgentContext(
        prompt=v.description,
        tools=tools,
        workdir=v.output_dir,
        input_dir=v.input_dir,
        run_dir=state.folder.run_dir,
        wall_time_s=state.prep.wall_time_s,
        max_steps=plan.limits.max_steps,
        oracle=_oracle(state) if agent.takes_oracle else None,
    )
    limits = WorkspaceLimits.for_host(state.folder.workspace_host, plan.limits.workspace_max_bytes)
    state.record.events.append("workspace.watch", **limits.to_dict())
    watchdog = asyncio.ensure_future(watch(state.folder.workspace_host, limits))
    alive = asyncio.ensure_future(_sandbox_stopped(state.sandbox))
    turn = asyncio.ensure_future(asyncio.wait_for(agent.run(ctx), state.prep.wall_time_s))
    try:
        await asyncio.wait({turn, watchdog, alive}, return_when=asyncio.FIRST_COMPLETED)
        if not turn.done():  # a workspace limit, or the sandbox stopped: the agent's turn ends here
            turn.cancel()
            with contextlib.suppress(BaseException):
                await turn
            if watchdog.done():
                reason = watchdog.result()
                state.record.events.append("workspace.limit", reason=reason)
            else:
                reason = f"the sandbox stopped during the agent's turn ({alive.result()})"
                state.record.events.append("sandbox.stopped", reason=reason)
            state.live.agent_outcome = AgentOutcome(AgentEnd.FAILED, detail=f"the agent's turn was ended: {reason}")
        else:
            state.live.agent_outcome = turn.result()
    except TimeoutError:
        state.live.agent_outcome = AgentOutcome(AgentEnd.TIMEOUT,
                                                detail=f"wall time of {state.prep.wall_time_s:.0f}s reached",
                                                limit=AgentLimit.WALL_TIME)
    except asyncio.CancelledError:
        turn.cancel()
        raise
    except Exception as e:
        state.live.agent_outcome = AgentOutcome(AgentEnd.FAILED,
                                                detail=f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}")
    finally:
        watchdog.cancel()
        alive.cancel()
    outcome = state.live.agent_outcome
    assert outcome is not None
    state.record.events.append("agent.ended", end=outcome.end.value, detail=(outcome.detail or "")[:2000])


SANDBOX_POLL_S = 2.0  # how often the agent's turn checks that its sandbox still runs


def stopped_reason(inspect: dict[str, Any]) -> str | None:
    """Why the sandbox is no longer running (None while it runs): out of memory, or
    its init gone with an exit code."""
    st = inspect.get("State") or {}
    if st.get("Running") is True and st.get("Status") == "running":
        return None
    if st.get("HaltedByHarness") is True:  # a foreign disk's VM, paused by ale's own end of the turn (QMP stop)
        return None
    if st.get("OOMKilled"):
        return f"out of memory: the kernel killed its init (OOMKilled, exit code {st.get('ExitCode')})"
    return f"its init exited (status {st.get('Status')!r}, exit code {st.get('ExitCode')})"


async def _sandbox_stopped(sandbox: Sandbox) -> str:
    """Returns, with the reason, once the sandbox no longer runs (the candidate
    filled its memory, its init died); runs as long as the agent's turn otherwise."""
    while True:
        await asyncio.sleep(SANDBOX_POLL_S)
        try:
            inspect = await asyncio.to_thread(sandbox.inspect)
        except SandboxError:
            continue  # the engine's hiccup is not the candidate's; the after-run checks judge it
        reason = stopped_reason(inspect)
        if reason is not None:
            return reason


def _oracle(state: RunState) -> Any:
    """The task's solve(), run in the task process with the agent's session."""
    if not state.prep.task.has("solve"):
        return None
    index = state.variant.index

    async def solve(session: Any) -> Any:
        return await state.prep.process.call("solve", index, session)

    return solve


async def agent_step(state: RunState) -> None:
    state.live.agent_started = True
    try:
        await run_agent(state)
    except Exception:
        await record_screen(state, SCREEN_END_OF_TURN)
        raise
    await record_screen(state, SCREEN_END_OF_TURN)  # as the agent's turn left it, before anything of it is killed
    record_model_gateway(state)
