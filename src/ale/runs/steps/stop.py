"""STOP: the turn ended from the host, the probes (after), the sandbox released."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ale.agents.base import AgentEnd, AgentOutcome
from ale.defaults import DESKTOP_UID, PROBE_USER
from ale.isolation import rules
from ale.isolation.checks import Check
from ale.isolation.probes import probe_command
from ale.layout import Evidence
from ale.phases import CheckGroup
from ale.runs import vm_seal
from ale.runs.state import RunState, now
from ale.runs.steps.agent import stopped_reason
from ale.runs.steps.screen import record_cua
from ale.runs.steps.verify_before import verify_running
from ale.sandbox.base import SandboxError
from ale.sandbox.halt import STOP_BOUND_S


async def stop_and_verify_exited(state: RunState) -> None:
    await state.sandbox.stop()
    if vm_seal.is_vm(state):  # judged while it ran, after the turn (vm_seal); quit now, nothing left to ask
        return
    with state.record.cost("verify"):
        after = await asyncio.to_thread(state.sandbox.inspect)
        state.record.store.write_json(Evidence.INSPECT_AFTER, after)
        before = state.record.inspect_before or {}
        checks = rules.judge("after", policy=state.plan.policy, mounts=state.folder.mounts(), inspect=after,
                             mount_inodes=state.folder.mount_inodes(), captures=(before, after))
        state.record.add_checks(CheckGroup.INSPECT_AFTER, checks)


async def remove_sandbox(state: RunState) -> None:
    if state.live.sandbox is not None:
        await state.sandbox.remove()
        state.record.events.append("sandbox.removed", name=state.sandbox.name)


# The whole stop step's hard bound: the host-side stop (``STOP_BOUND_S``), then the
# after-run probes (their own 30 s), with room for the inspects between.
STOP_STEP_BOUND_S = STOP_BOUND_S + 45.0


async def stop_step(state: RunState) -> None:
    """End the turn from the host, then probe; a sandbox that stopped (the candidate
    filled its memory, its init gone), before or at any moment of this step, is
    judged from its stopped state. Bounded by ``STOP_STEP_BOUND_S``, recorded in
    ``evidence/stop.json``."""
    doc: dict[str, Any] = {"bound_s": STOP_STEP_BOUND_S, "started_at": now().isoformat()}
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(_end_turn_and_probe(state, doc), STOP_STEP_BOUND_S)
    except TimeoutError:
        doc["bound_exceeded"] = True
        raise SandboxError(f"the stop step did not end within its bound of {STOP_STEP_BOUND_S:.0f}s") from None
    finally:
        doc["duration_s"] = round(time.monotonic() - t0, 4)
        doc["within_bound"] = doc["duration_s"] <= STOP_STEP_BOUND_S
        state.record.store.write_json(Evidence.STOP, doc)


async def _judged_if_stopped(state: RunState) -> bool:
    inspect = await asyncio.to_thread(state.sandbox.inspect)
    if stopped_reason(inspect) is None:
        return False
    judge_stopped_sandbox(state, inspect)
    return True


# How long the stop step's first look at the engine may take before the host-side
# stop goes ahead anyway: a candidate can wedge the engine on its container (an exec's
# process stopped as it starts); the host-side stop kills that process and frees it.
FIRST_LOOK_S = 5.0


async def _end_turn_and_probe(state: RunState, doc: dict[str, Any]) -> None:
    try:
        if await asyncio.wait_for(_judged_if_stopped(state), FIRST_LOOK_S):
            doc["judged"] = "stopped before the stop step"
            return
    except TimeoutError:
        doc["engine_waited"] = f"the engine did not answer within {FIRST_LOOK_S:g}s: the host-side stop went ahead"
    await record_cua(state)  # before the stop ends the computer-server and its tunnel
    halt = await state.sandbox.halt(keep_uids=(DESKTOP_UID,), bound_s=STOP_BOUND_S)
    doc["halt"] = halt.to_dict()
    state.record.events.append("agent.processes_killed", remaining=len(halt.survivors), killed=halt.killed,
                               dying=halt.dying, method=halt.method, duration_s=halt.duration_s)
    if halt.sandbox_stopped or await _judged_if_stopped(state):
        if halt.sandbox_stopped and not await _judged_if_stopped(state):
            raise SandboxError("the host-side stop found no init, yet the engine reports the sandbox running")
        doc["judged"] = "stopped during the stop step"
        return
    # Only once no candidate process is left, as a uid the candidate never had: nothing
    # of the candidate's can signal, slow or write into the probes.
    v = state.variant
    doc["probes"] = {"user": PROBE_USER, "started_at": now().isoformat()}
    try:
        probe = await state.sandbox.exec(probe_command(state.plan.policy, input_dir=v.public_root,
                                                       workspace_dir=v.output_dir),
                                         user=PROBE_USER, timeout=30)
    except SandboxError:
        if await _judged_if_stopped(state):
            doc["judged"] = "stopped during the after-run probes"
            return
        raise
    doc["probes"]["ended_at"] = now().isoformat()
    if await _judged_if_stopped(state):
        doc["judged"] = "stopped during the after-run probes"
        return
    await verify_running(state, "after", probe, ran=True)


def judge_stopped_sandbox(state: RunState, inspect: dict[str, Any]) -> None:
    """The container stopped during the candidate's turn: nothing can run in it and
    its configuration can no longer change (the inspect after, diffed with the one
    before, still judges that). Its state is recorded, the turn is the agent's
    failure with that reason, and the workspace is graded as it was left."""
    st = inspect.get("State") or {}
    reason = stopped_reason(inspect) or ""
    record = {key: st.get(key)
              for key in ("Status", "Running", "Pid", "OOMKilled", "ExitCode", "StartedAt", "FinishedAt")}
    # observed_at: before the harness's own kill of the sandbox (its release follows),
    # so a FinishedAt before it is the sandbox's own end (ale verify compares the two).
    state.record.store.write_json(Evidence.SANDBOX_STOPPED, {"reason": reason, "state": record,
                                                              "observed_at": now().isoformat()})
    state.record.events.append("sandbox.stopped", reason=reason)
    dead = st.get("Running") is False and st.get("Pid") == 0 and st.get("Status") in ("exited", "dead")
    state.record.add_checks(CheckGroup.PROBES_AFTER, [Check(
        "sandbox.stopped_nothing_runs", dead, {"Running": False, "Pid": 0, "Status": "exited"}, record,
        "" if dead else "the sandbox is neither running nor stopped with no process")])
    outcome = state.live.agent_outcome
    if outcome is None or outcome.end is AgentEnd.FINISHED or "sandbox stopped" not in (outcome.detail or ""):
        state.live.agent_outcome = AgentOutcome(
            AgentEnd.FAILED, detail=f"the sandbox stopped during the agent's turn: {reason}",
            usage=outcome.usage if outcome is not None else {})


async def release_sandbox(state: RunState) -> None:
    """Stop the candidate's sandbox, inspect it (after), diff the captures, remove it."""
    if state.live.sandbox is None:
        return
    await stop_and_verify_exited(state)
    await remove_sandbox(state)
