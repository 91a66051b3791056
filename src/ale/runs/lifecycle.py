"""One run: the phase table of ``ale.phases``, executed.

``execute_run`` drives ``kind_steps(RunKind.RUN, shape)`` (the phase table): each phase's step function
(``STEPS``) does its one job and records its times; a phase that finds the seal
broken adds violations, and a gating phase ends the run there
(``invalid_evaluation_environment``, no score). ``classify_failure`` is the one
place a step's exception becomes a status. Containers are removed on every path
out, cancellation (Ctrl-C) included.

The run's state (``ale.runs.state``) is three things: what is fixed at its start (``Prepared``, the
``RunFolder`` whose properties are its paths), the record being written
(``RunRecord``), and the live handles (``LiveHandles``). A desktop task's run is
the same table in its ``live_grading`` shape, with the desktop's hooks
(``DesktopExtension``) called at the points the table names.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import ale
from ale import layout, lossless
from ale.agents.base import AgentContext, AgentEnd, AgentOutcome
from ale.agents.errors import AgentConfigError
from ale.agents.gateway.record import channel_checks
from ale.agents.gateway.record import evidence_record as gateway_evidence
from ale.agents.gateway.resume import prepare_resume, resumed_result
from ale.agents.registry import agent_evidence, make_agent
from ale.agents.trajectory import TrajectoryWriter
from ale.data.base import DataError
from ale.data.hashing import restore_runnable
from ale.data.vm_disks import fetch_vm_disk
from ale.defaults import CANDIDATE_HOME, DEFAULT_TOOLS_IMAGE, DESKTOP_UID, PROBE_USER
from ale.grading.deliverables import extract_deliverables
from ale.grading.grader import Grader, GradingEnvironmentError, GradingError, GradingInputs
from ale.isolation.checks import Check
from ale.isolation.probes import (
    judge_probes,
    probe_command,
    run_probes,
    workspace_empty_checks,
    workspace_listing,
)
from ale.isolation.rules import judge
from ale.layout import Evidence
from ale.phases import WHEN_START, CheckGroup, KindStep, Phase, RunKind, kind_steps
from ale.plan import RunPlan
from ale.record import evidence as ev
from ale.record.signing import load_or_create_signing_key
from ale.result import RunResult
from ale.runs import software, start_writes, vm_seal
from ale.runs.extensions import make_extension
from ale.runs.staging_step import public_tree, stage_input
from ale.runs.state import LiveHandles, Prepared, RunFolder, RunRecord, RunState, now
from ale.runs.watchdog import WorkspaceLimits, watch
from ale.sandbox.base import (
    LABEL_EXPERIMENT,
    LABEL_ROLE,
    LABEL_RUN,
    ExecResult,
    ImageMissing,
    Sandbox,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
)
from ale.sandbox.desktop import (
    DEFAULT_DESKTOP_IMAGE,
    desktop_spec,
)
from ale.sandbox.halt import STOP_BOUND_S
from ale.sandbox.host_kernel import core_pattern_warning
from ale.sandbox.providers import make_provider
from ale.sandbox.qemu.image import is_default_guest
from ale.sandbox.scratch import mount_workspace_tmpfs, release_scratch
from ale.sandbox.session import ContainerSession, Route, RoutedSession
from ale.sandbox.tools import TASK_OUTPUT_LIMIT, TASK_READ_LIMIT, ToolBox
from ale.status import (
    FAILURE_OWNER,
    AgentLimit,
    FailureOwner,
    InvalidAttribution,
    ModelFailure,
    RunStatus,
    not_the_agents,
)
from ale.tasks.card import TaskCard, load_card
from ale.tasks.environment import EnvironmentBuildError, TaskEnvironment, resolve_environment
from ale.tasks.errors import TaskError
from ale.tasks.jail import task_network
from ale.tasks.loader import select_variant
from ale.tasks.process import (
    TaskCallFailed,
    TaskProcess,
    TaskProcessError,
    judge_env,
)

DEFAULT_WALL_TIME_S = 1800.0


class PreflightError(ValueError):
    """The run cannot begin: a malformed task, a bad variant, no engine, no image.
    Raised before anything is created. Only an unreachable engine is worth a retry."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class SealBroken(Exception):
    """Verification found violations: the agent must not (or no longer) run."""


# -- preflight -----------------------------------------------------------------
def mapped_snapshots(plan: RunPlan, card: TaskCard) -> tuple[str, ...]:
    """The snapshots this plan maps to a disk: the card's, when the plan names one."""
    return (card.snapshot,) if plan.vm_image and card.snapshot else ()


def check_card(plan: RunPlan) -> TaskCard:
    """The task's card, and whether it can run as planned. Raises ``PreflightError``."""
    try:
        card = load_card(plan.task_dir)
        reason = card.unsupported_reason(plan.provider, vm_images=mapped_snapshots(plan, card))
    except TaskError as e:
        raise PreflightError(str(e)) from e
    if reason is not None:
        raise PreflightError(f"{plan.task_dir}: {reason}")
    return card


async def task_environment(plan: RunPlan) -> TaskEnvironment:
    """The environment the task's process runs in (its declared dependencies). Raises ``PreflightError``."""
    try:
        return await asyncio.to_thread(resolve_environment, plan.task_dir)
    except (TaskError, EnvironmentBuildError) as e:
        raise PreflightError(str(e)) from e


async def prepare(
    plan: RunPlan, provider: SandboxProvider | None = None, *, environment: TaskEnvironment | None = None,
    process: TaskProcess | None = None,
) -> Prepared:
    """The one preflight of every kind: start the task process (``load()``; ``process``:
    one lent by a warm pool, whose card its pool checked), pick the variant, check the
    agent, the engine and the image. Raises ``PreflightError``; nothing is left running then."""
    if process is None:
        card = check_card(plan)
        if environment is None:
            environment = await task_environment(plan)
        process = TaskProcess(plan.task_dir, environment=environment, card=card,
                              network=task_network(judge_env(names=plan.judge_env)))
    try:
        return await _preflight(plan, provider, process)
    except BaseException:
        await asyncio.shield(process.close())
        raise


async def _preflight(plan: RunPlan, provider: SandboxProvider | None, process: TaskProcess) -> Prepared:
    try:
        task = await process.start()
        variant = select_variant(task.variants, plan.variant)
        os_type = ((variant.computer or {}).get("setup_config") or {}).get("os_type")
        reason = task.card.unsupported_reason(plan.provider, variant_os=os_type if isinstance(os_type, str) else None,
                                              vm_images=mapped_snapshots(plan, task.card))
        if reason is not None:
            raise TaskError(f"{plan.task_dir}: variant {plan.variant} {reason}")
    except TaskError as e:
        raise PreflightError(str(e)) from e
    except (TaskProcessError, TaskCallFailed) as e:
        raise PreflightError(f"{plan.task_dir}: load() failed in the task process: {e}") from e
    try:
        agent = make_agent(plan.agent)
        # An agent that checks its set-up against the run's private folders (the
        # command agent: a confined harness's installation must not enclose them).
        agent.preflight(private=[Path(plan.runs_dir), Path(plan.task_dir)])
        # An agent that needs more of the sandbox's limits (a native harness) raises
        # them within the policy's bounds, or refuses here (evidence/policy.json: what ran).
        plan = plan.model_copy(update={"policy": agent.fit_policy(plan.policy)})
    except AgentConfigError as e:
        raise PreflightError(str(e)) from e
    data_spec = plan.data_source or task.card.data_source
    wall = plan.limits.wall_time_s or task.card.timeout_s or DEFAULT_WALL_TIME_S
    # a task asking for a desktop runs in the desktop image
    desktop = desktop_spec(task.card.raw, variant.computer)
    if desktop is not None and plan.provider == "qemu":
        raise PreflightError(f"{plan.task_dir}: variant {plan.variant} asks for a desktop, and the qemu provider's guest "
                             "has no display yet: run it with --provider docker")
    image = DEFAULT_DESKTOP_IMAGE if desktop is not None and plan.image == DEFAULT_TOOLS_IMAGE else plan.image
    if plan.provider == "qemu" and plan.vm_image:  # the operator's disk for this task's vm.snapshot, verified
        try:
            image = str((await asyncio.to_thread(fetch_vm_disk, plan.vm_image)).path) if "://" in plan.vm_image \
                else plan.vm_image.removeprefix("local:")
        except DataError as e:
            raise PreflightError(f"{plan.task_dir}: the disk mapped to vm.snapshot {task.card.snapshot!r}: {e}",
                                 retryable=True) from e
    try:
        provider = provider or make_provider(plan.provider)
        image_record = await asyncio.to_thread(provider.image_inspect, image)
    except ImageMissing as e:
        raise PreflightError(str(e)) from e
    except SandboxError as e:
        raise PreflightError(str(e), retryable=True) from e
    return Prepared(plan, task, variant, data_spec, float(wall), provider, agent, process, desktop, image, image_record)


# -- phases --------------------------------------------------------------------
def new_state(prep: Prepared, folder: RunFolder, record_dir: Path, *, kind: RunKind = RunKind.RUN,
              durable: bool = True) -> RunState:
    """The state of one run-like thing of ``kind``: ``folder`` its paths, its record
    (events, evidence) written in ``record_dir`` (fsynced when ``durable``)."""
    record = RunRecord(events=ev.EventLog(record_dir / layout.EVENTS, durable=durable),
                       store=ev.EvidenceStore(record_dir, durable=durable))
    return RunState(prep, folder, record, LiveHandles(), make_extension(prep), kind)


def make_dirs(state: RunState) -> None:
    """The one directory set-up: the scratch (private), the public package, the
    workspace, the private reference folders. A run's workspace is made the
    candidate's (or a capped tmpfs); a grading probe's and a regrade's are the harness's."""
    state.folder.scratch.mkdir(parents=True, mode=0o700)
    os.chmod(state.folder.scratch, 0o700)
    state.folder.public_host.mkdir(mode=0o755)
    if state.folder.input_host != state.folder.public_host:
        state.folder.input_host.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    state.folder.workspace_host.mkdir(mode=0o755)
    if state.kind is RunKind.RUN:
        policy, cap = state.plan.policy, state.plan.limits.workspace_max_bytes
        if cap is not None and os.geteuid() == 0:  # a hard cap; otherwise the watchdog's
            mount_workspace_tmpfs(state.folder.workspace_host, max_bytes=cap, uid=policy.uid, gid=policy.gid)
        else:
            try:
                os.chown(state.folder.workspace_host, policy.uid, policy.gid)
            except PermissionError:
                os.chmod(state.folder.workspace_host, 0o777)
    state.folder.private.mkdir(mode=0o700)
    state.folder.setup_reference_host.mkdir(mode=0o700)


def _public_package_checks(state: RunState) -> list[Check]:
    """The public package holds no reference: nothing where the task expects its
    reference and, for an ALE task folder, no ``reference``/``reference.7z`` in it."""
    found = []
    if state.variant.task_dir:
        found = [n for n in ("reference", "reference.7z") if os.path.lexists(state.folder.public_host / n)]
    rel = state.variant.public_relpath(state.variant.reference_dir)
    if rel not in (None, ".") and os.path.lexists(state.folder.public_host / rel):
        found.append(rel)
    found = sorted(set(found))
    return [Check("public.no_reference", not found, "no reference in the public package", found or None,
                  f"the public package holds {found}" if found else "")]


async def provision(state: RunState) -> None:
    plan = state.plan
    labels = {LABEL_RUN: plan.run_id, LABEL_ROLE: "candidate"}
    if plan.experiment:
        labels[LABEL_EXPERIMENT] = plan.experiment
    mounts = state.folder.mounts()
    state.record.store.write_json(
        Evidence.MOUNTS,
        [
            {"source": m.source, "inode": os.stat(m.source).st_ino, "target": m.target, "read_only": m.read_only}
            for m in mounts
        ],
    )
    state.record.workspace_at_creation = workspace_listing(state.folder.workspace_host)
    state.live.provisioning = True
    state.live.sandbox = await state.prep.provider.create(
        SandboxSpec(
            name=f"ale-{plan.run_id}"[:120],
            image=state.live.image or state.prep.image or plan.image,
            policy=plan.policy,
            mounts=tuple(mounts),
            labels=labels,
            workdir=state.variant.output_dir,
            environment={"HOME": CANDIDATE_HOME},
        )
    )
    state.record.events.append("sandbox.created", name=state.sandbox.name, id=state.sandbox.id)


async def verify_created(state: RunState) -> None:
    with state.record.cost("verify"):
        await _verify_created(state)


async def _verify_created(state: RunState) -> None:
    inspect = await asyncio.to_thread(state.sandbox.inspect)
    state.record.inspect_before = inspect
    if vm_seal.is_vm(state):  # a VM: nothing runs yet to ask; QEMU's own description is judged once it booted
        booted = state.prep.image_record or {}
        if state.live.image and booted.get("Id") != inspect.get("Image"):  # a guest made for the task's software
            booted = await asyncio.to_thread(state.prep.provider.image_inspect, state.live.image)
            state.live.image_record = booted
        state.record.store.write_json(Evidence.IMAGE, booted)
        return
    state.record.store.write_json(Evidence.INSPECT_BEFORE, inspect)
    image = state.prep.image_record
    if image is None or image.get("Id") != inspect.get("Image"):  # the container's image, as the engine says now
        image = await asyncio.to_thread(state.prep.provider.image_inspect, inspect.get("Image", state.plan.image))
    state.record.store.write_json(Evidence.IMAGE, image)
    checks = judge("before", policy=state.plan.policy, mounts=state.folder.mounts(), inspect=inspect, image_inspect=image,
                   mount_inodes=state.folder.mount_inodes())
    state.record.add_checks(CheckGroup.INSPECT_BEFORE, checks)


async def run_task_setup(state: RunState) -> None:
    """The task's start(cfg, session): input and reference writes land on the host."""
    if not state.prep.task.has("start"):
        return
    v = state.variant
    tools = ToolBox(state.sandbox, workdir=v.output_dir, default_timeout=state.plan.limits.command_timeout_s,
                    output_limit=TASK_OUTPUT_LIMIT, read_limit=TASK_READ_LIMIT,
                    computer=state.extension.computer)  # start() launches a desktop task's windows
    container = ContainerSession(tools, default_timeout=state.plan.limits.command_timeout_s)

    async def factory() -> ContainerSession:
        return container

    session = RoutedSession(
        [Route(v.input_dir, state.folder.input_host, writable=True), Route(v.reference_dir, state.folder.setup_reference_host, writable=True)],
        factory, gui=container if state.extension.computer is not None else None,
    )
    # What start() changes in the public package is kept in the run folder (start_writes).
    state.record.public_before_start = await asyncio.to_thread(start_writes.listing, state.folder.public_host)
    await state.prep.process.call("start", v.index, session, timeout=state.plan.limits.grading_timeout_s)


def start_sandbox_id(state: RunState) -> str:
    """The name of the grading sandbox start() runs in when there is no candidate's."""
    return f"{state.plan.run_id}-{'regrade-start' if state.kind is RunKind.REGRADE else 'start'}"


async def start_in_grading_sandbox(state: RunState) -> None:
    """The task's start() with no candidate sandbox (a regrade, a grading-only probe):
    its input and reference writes land on the host as in a run; its commands run in
    a grading sandbox (no network, the public package read-only), never a candidate's,
    bounded as a regrade's grading or as a probe's run's commands."""
    v, folder, plan = state.variant, state.folder, state.plan
    sandbox_id = state.live.start_sandbox = start_sandbox_id(state)
    limits = plan.limits
    command_timeout = limits.grading_timeout_s if state.kind is RunKind.REGRADE else limits.command_timeout_s
    empty = folder.scratch / "start-output"
    empty.mkdir(mode=0o755)
    sandbox = Grader(
        state.prep.provider, image=state.live.image or plan.image, policy=plan.policy, run_id=sandbox_id,
        experiment=plan.experiment, command_timeout=command_timeout,
        inputs=GradingInputs(
            input_host=folder.input_host.resolve(), deliverables_host=empty.resolve(),
            reference_host=folder.setup_reference_host.resolve(), input_dir=v.input_dir, output_dir=v.output_dir,
            reference_dir=v.reference_dir, task_dir=v.task_dir, scratch_host=folder.scratch / "start-sandbox"),
    )
    session = RoutedSession(
        [Route(v.input_dir, folder.input_host, writable=True), Route(v.reference_dir, folder.setup_reference_host, writable=True)],
        sandbox._container_session,
    )
    try:
        await state.prep.process.call("start", v.index, session, timeout=plan.limits.grading_timeout_s)
    finally:
        await sandbox.close()


async def verify_running(state: RunState, phase: Literal["before", "after"], probe: ExecResult | None = None, *,
                         ran: bool = False) -> None:
    """Probes inside the running sandbox (the harness's own exec; the same code
    ``verify-container`` and the real-container tests use). ``ran``: they already
    ran, in the end-of-turn kill's exec, and ``probe`` is their result."""
    with state.record.cost("verify"):
        v, policy = state.variant, state.plan.policy
        if vm_seal.is_vm(state):
            vm_seal.tell_probes(state, probe_command(policy, input_dir=v.public_root, workspace_dir=v.output_dir))
        if ran:
            raw, checks = judge_probes(probe, policy, input_dir=v.public_root, workspace_dir=v.output_dir, phase=phase)
        else:
            raw, checks = await run_probes(state.sandbox, policy, input_dir=v.public_root, workspace_dir=v.output_dir, phase=phase)
        if vm_seal.is_vm(state):  # the container's rules do not judge a VM: QEMU's view and the guest's probes do
            await vm_seal.judge_running(state, phase, raw)
            return
        state.record.store.write_text(Evidence.probes(phase), raw)
        state.record.add_checks(CheckGroup.PROBES_BEFORE if phase == "before" else CheckGroup.PROBES_AFTER, checks)


async def seal_input_and_workspace(state: RunState) -> None:
    """After start(): hash the input (off the event loop: a large per-run copy takes
    seconds, and other runs share the loop), prove the workspace is still empty."""
    with state.record.cost("evidence"):
        tree = await asyncio.to_thread(public_tree, state)
        _seal_input_and_workspace(state, tree)
        before = state.record.public_before_start
        if before is not None:  # start() ran: keep what it added or changed, for a regrade
            kept = await asyncio.to_thread(start_writes.keep_public, state.folder.run_dir, state.folder.public_host,
                                           before, tree)
            state.record.store.write_json(Evidence.START_WRITES, kept)


def _seal_input_and_workspace(state: RunState, tree: dict) -> None:
    state.record.input_after_start = tree
    state.record.store.write_json(Evidence.INPUT_AFTER_START, state.record.input_after_start)
    created = state.record.workspace_at_creation or {}
    listing = workspace_listing(state.folder.workspace_host)
    state.record.store.write_json(Evidence.WORKSPACE_EMPTY, {"at_creation": created, "at_agent_start": listing})
    state.record.add_checks(CheckGroup.AGENT_START, workspace_empty_checks(listing, expected_inode=created.get("inode")) + _public_package_checks(state))


async def commit_reference(state: RunState) -> None:
    src_commit = None
    if state.live.source is not None:
        src_commit = await asyncio.to_thread(state.live.source.commit_reference, state.variant.data_key)
    state.record.commitment = src_commit
    setup_tree = await asyncio.to_thread(ev.hash_tree, state.folder.setup_reference_host)
    state.record.reference_commit = {
        "source": None if src_commit is None else {"kind": src_commit.kind, "sha256": src_commit.sha256, "files": src_commit.files},
        "setup_written": setup_tree,
        "committed_at": now().isoformat(),
    }
    state.record.store.write_json(Evidence.REFERENCE_COMMIT, state.record.reference_commit)
    state.record.events.append("reference.committed", sha256=None if src_commit is None else src_commit.sha256, setup_digest=setup_tree["digest"])


async def hash_input(state: RunState) -> None:
    """A grading probe's input after start(), hashed as it lies (no workspace to prove empty)."""
    state.record.input_after_start = ev.hash_tree(state.folder.public_host)
    state.record.store.write_json(Evidence.INPUT_AFTER_START, state.record.input_after_start)


async def run_agent(state: RunState) -> None:
    plan, v = state.plan, state.variant
    agent = state.prep.agent
    state.record.store.write_json(Evidence.AGENT, agent_evidence(plan.agent))
    prompt = state.folder.run_dir / layout.agent_path(layout.Agent.PROMPT)  # what the agent was asked, signed with the run
    prompt.parent.mkdir(exist_ok=True)
    prompt.write_text(v.description, encoding="utf-8", errors="surrogateescape")
    network = {"network_mode": plan.policy.network_mode, "controller": "outside the sandbox; tools reach it only through docker exec"}
    if agent.native:  # a named harness in native mode (ale.agents.harness)
        network["controller"] = ("the harness runs inside the sandbox; its only way out is an exec-attached stream to the "
                                 "run's model gateway (agent/confinement.json)")
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
        state.live.agent_outcome = AgentOutcome(AgentEnd.TIMEOUT, detail=f"wall time of {state.prep.wall_time_s:.0f}s reached",
                                                limit=AgentLimit.WALL_TIME)
    except asyncio.CancelledError:
        turn.cancel()
        raise
    except Exception as e:
        state.live.agent_outcome = AgentOutcome(AgentEnd.FAILED, detail=f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}")
    finally:
        watchdog.cancel()
        alive.cancel()
    outcome = state.live.agent_outcome
    assert outcome is not None
    state.record.events.append("agent.ended", end=outcome.end.value, detail=(outcome.detail or "")[:2000])


def name_model_failure(state: RunState, gw: dict[str, Any]) -> None:
    """An agent's turn that failed where the gateway's record shows the model's provider
    failing (past its retries, or the last answer the harness got) is infrastructure's,
    never the agent's; one that failed on the agent's own context length or a refusal
    says so (``ale.status.ModelFailure``)."""
    outcome = state.live.agent_outcome
    last = gw.get("last_failure")
    final: Any
    if outcome is not None and outcome.end is AgentEnd.TIMEOUT and outcome.limit is AgentLimit.WALL_TIME and \
            isinstance(last, dict) and not_the_agents(last["failure"]):
        final = last  # the time ran out while the provider kept failing
    elif outcome is None or outcome.end is not AgentEnd.FAILED:
        return
    else:
        final = gw.get("provider_failure") or last
    if not isinstance(final, dict):
        return
    failure = ModelFailure(final["failure"])
    if not_the_agents(failure):
        state.live.agent_outcome = AgentOutcome(
            AgentEnd.PROVIDER_FAILED, usage=outcome.usage, model_failure=failure,
            detail=f"the model's provider failed: {failure.value} (HTTP {final.get('status')}) on request {final.get('request')} "
                   f"after {final.get('retries', 0)} retries; the agent's turn ended: {(outcome.detail or '')[:500]}")
    else:
        outcome.model_failure = failure
        outcome.detail = f"the model's answer was {failure.value} (the agent's): {outcome.detail or ''}"


SANDBOX_POLL_S = 2.0  # how often the agent's turn checks that its sandbox still runs


def _stopped_reason(inspect: dict[str, Any]) -> str | None:
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
        reason = _stopped_reason(inspect)
        if reason is not None:
            return reason


def record_model_gateway(state: RunState) -> None:
    """The model gateway's record (agents that reach a model through it): its summary
    and the harness's confinement as evidence, its chain head in the event log. A
    request that offered the model a forbidden tool makes the run invalid, charged to
    the controller's configuration when no model answer came before it."""
    doc = gateway_evidence(state.folder.run_dir)
    if doc is None:
        return
    gw = doc["gateway"]
    state.live.gateway = gw
    name_model_failure(state, gw)
    state.record.store.write_json(Evidence.CONTROLLER, doc)
    state.record.events.append("gateway.recorded", head=gw.get("head"), records=gw.get("records"),
                        tools_offered=gw.get("tools_offered", []), refusals=gw.get("refusals", []))
    problems, refusals = gw.get("problems", []), gw.get("refusals", [])
    state.record.add_checks(CheckGroup.AGENT, [
        Check("gateway.record", not problems, "an intact gateway record", problems or None, "; ".join(problems)),
        Check("gateway.tools_allowed", not refusals, "only the run's allowlisted tools offered to the model",
              [{"request": r["seq"], "forbidden": r["forbidden"]} for r in refusals] or None,
              "; ".join(f"request {r['seq']} offered the model {', '.join(r['forbidden'])}, outside the run's allowlist; refused"
                        for r in refusals)),
        *channel_checks(doc.get("confinement")),  # a native harness's channel (none otherwise)
    ])
    if gw.get("refusals") and gw["refusals"][0].get("before_any_answer"):
        state.record.invalid_attribution = InvalidAttribution.CONTROLLER_CONFIGURATION


def _oracle(state: RunState) -> Any:
    """The task's solve(), run in the task process with the agent's session."""
    if not state.prep.task.has("solve"):
        return None
    index = state.variant.index

    async def solve(session: Any) -> Any:
        return await state.prep.process.call("solve", index, session)

    return solve


async def stop_and_verify_exited(state: RunState) -> None:
    await state.sandbox.stop()
    if vm_seal.is_vm(state):  # judged while it ran, after the turn (vm_seal); quit now, nothing left to ask
        return
    with state.record.cost("verify"):
        after = await asyncio.to_thread(state.sandbox.inspect)
        state.record.store.write_json(Evidence.INSPECT_AFTER, after)
        before = state.record.inspect_before or {}
        checks = judge("after", policy=state.plan.policy, mounts=state.folder.mounts(), inspect=after,
                       mount_inodes=state.folder.mount_inodes(), captures=(before, after))
        state.record.add_checks(CheckGroup.INSPECT_AFTER, checks)


async def collect_deliverables(state: RunState) -> None:
    """Copy the workspace out, off the event loop (the walk may take up to its time
    limit, and other runs share the loop)."""
    lim = state.plan.limits
    manifest = await asyncio.to_thread(
        extract_deliverables,
        state.folder.workspace_host, state.folder.run_dir / layout.DELIVERABLES_DIR, max_files=lim.deliverable_max_files,
        max_bytes=lim.deliverable_max_bytes, owner=(state.plan.policy.uid, state.plan.policy.gid) if os.geteuid() == 0 else None,
        mount_point=state.variant.output_dir,
        # One path budget for every copy: the grader's working copies and the output
        # folder in the grading sandbox are longer bases than the run folder may be.
        also_under=[*state.folder.copy_bases(lim.grading_attempts), state.variant.output_dir],
    )
    ev.write_json_new(state.folder.run_dir / layout.DELIVERABLES, json.loads(manifest.model_dump_json()))
    state.record.events.append("deliverables.collected", files=len(manifest.files), skipped=len(manifest.skipped), digest=manifest.digest)
    limited = [e for e in manifest.skipped if e.limit is not None]
    if limited:
        state.record.warnings.append(
            f"deliverables: {len(limited)} entr{'y' if len(limited) == 1 else 'ies'} of the workspace not copied at a limit "
            f"({limited[0].reason}: {limited[0].path}); the grader saw the rest ({layout.DELIVERABLES})")


async def remove_sandbox(state: RunState) -> None:
    if state.live.sandbox is not None:
        await state.sandbox.remove()
        state.record.events.append("sandbox.removed", name=state.sandbox.name)


async def check_input_unchanged(state: RunState) -> None:
    with state.record.cost("evidence"):
        after = await asyncio.to_thread(public_tree, state)
    state.record.store.write_json(Evidence.INPUT_AFTER_RUN, after)
    start = state.record.input_after_start or {}
    same = after["digest"] == start.get("digest")
    state.record.add_checks(CheckGroup.AFTER_RUN, [Check(
        "input.unchanged", same, start.get("digest"), after["digest"],
        "" if same else "the staged input changed during the run")])


async def stage_reference(state: RunState) -> None:
    """Trusted side, candidate container gone: source reference + start()'s writes."""
    dest = state.folder.reference_host
    if state.live.source is not None:
        await asyncio.to_thread(state.live.source.stage_reference, state.variant.data_key, dest, state.record.commitment)
    else:
        dest.mkdir(mode=0o700)
    setup_tree = await asyncio.to_thread(ev.hash_tree, state.folder.setup_reference_host)
    committed = state.record.reference_commit or {}
    if setup_tree["digest"] != (committed.get("setup_written") or {}).get("digest"):
        raise GradingError("reference written by start() changed after it was committed")
    for rel in setup_tree["files"]:
        target = dest / rel
        if target.exists():
            raise GradingError(f"start() wrote {rel} into the reference, which the data source also holds")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(state.folder.setup_reference_host / rel, target)
    # The grading container reads it as the candidate uid: readable, on the trusted side
    # only; what is meant to run (execute bits, #!, ELF) stays runnable on its read-only mount.
    restore_runnable(dest)
    staged_tree = await asyncio.to_thread(ev.hash_tree, dest)  # off the loop: a reference may be large
    # start()'s reference writes, kept in the run folder (the candidate's turn is over) for a regrade
    kept = await asyncio.to_thread(start_writes.keep_reference, state.folder.run_dir, state.folder.setup_reference_host,
                                   setup_tree) if state.record.public_before_start is not None else None
    state.record.store.write_json(
        Evidence.REFERENCE_CHECK,
        {
            "source_sha256": None if state.record.commitment is None else state.record.commitment.sha256,
            "setup_written_digest": setup_tree["digest"],
            **({"kept": kept} if kept is not None else {}),
            "staged_tree": staged_tree,
            "unpacked_at": now().isoformat(),
        },
    )
    state.record.events.append("reference.staged")


async def grade(state: RunState, process: TaskProcess, *, attempt: int = 1) -> list[float]:
    plan, v = state.plan, state.variant
    state.live.grader = Grader(
        state.prep.provider,
        image=state.live.image or plan.image,
        policy=plan.policy,
        run_id=plan.run_id,
        experiment=plan.experiment,
        inputs=GradingInputs(
            input_host=state.folder.input_host.resolve(),
            deliverables_host=state.folder.deliverables.resolve(),
            reference_host=state.folder.reference_host.resolve(),
            input_dir=v.input_dir,
            output_dir=v.output_dir,
            reference_dir=v.reference_dir,
            software_host=None if state.folder.software_host is None else state.folder.software_host.resolve(),
            software_dir=f"{v.public_root}/software" if state.folder.software_host is not None else None,
            task_dir=v.task_dir,
            scratch_host=state.folder.grading_scratch_for(attempt),
        ),
        command_timeout=plan.limits.grading_timeout_s,  # ALE graders run commands for up to about an hour
        gui=state.extension.grading_gui(state),
    )
    try:
        timeout, env = plan.limits.grading_timeout_s, judge_env(names=plan.judge_env)

        async def evaluate(session: Any) -> Any:
            return await process.call("evaluate", v.index, session, timeout=timeout, env=env)

        return await state.live.grader.grade(evaluate)
    finally:
        await state.live.grader.close()
        _warn_copy_problems(state, state.live.grader.copy_problems, attempt)


def _warn_copy_problems(state: RunState, problems: list[str], attempt: int) -> None:
    """The grader's working copy left entries out (the harness's copy failed, never
    the candidate's work): graded without them, recorded and warned about."""
    if not problems:
        return
    state.record.events.append("grading.copy_incomplete", attempt=attempt, problems=problems[:50], count=len(problems))
    state.record.warnings.append(
        f"grading: the grader's working copy left out {len(problems)} entr{'y' if len(problems) == 1 else 'ies'} of the "
        f"deliverables (the harness's copy, not the candidate's: graded without them), first: {problems[0]}")


# -- the run -------------------------------------------------------------------
def classify_failure(e: Exception, state: RunState) -> tuple[RunStatus, str, dict[str, Any]]:
    """What a phase's exception means for the run: its status, error, extra record.

    Before the agent starts, provider and data failures are the infrastructure's
    (retryable). Once it has started, nothing may become a retryable
    infrastructure error but an engine that stopped answering: a failure to finish
    the run's checks makes the run invalid (charged to the candidate), a data
    source failing while the reference is staged is a grading failure.
    """
    if isinstance(e, SealBroken):
        return RunStatus.INVALID_EVALUATION_ENVIRONMENT, "the sandbox was not proven sealed; see violations", {}
    if isinstance(e, GradingError):
        # Charged to the candidate only when it repeated on its deliverables; a single
        # failure of the grading environment is the harness's (retried).
        state.record.invalid_attribution = (
            InvalidAttribution.AFTER_AGENT_START if e.charged else InvalidAttribution.GRADING_ENVIRONMENT)
        return RunStatus.GRADING_FAILED, str(e), ({"grading_traceback": e.traceback} if e.traceback else {})
    if isinstance(e, software.SoftwareError):  # before the sandbox: the task's software could not be provided
        return RunStatus.INFRASTRUCTURE_ERROR, str(e), ({} if e.retryable else {"retryable": False})
    if isinstance(e, TaskCallFailed):  # start() raised: the task could not be set up
        return RunStatus.INFRASTRUCTURE_ERROR, f"start() raised {e}", {"traceback": e.traceback[-8000:], "retryable": False}
    if isinstance(e, DataError):
        if state.live.agent_started:  # the reference could not be staged: the harness's
            state.record.invalid_attribution = InvalidAttribution.GRADING_ENVIRONMENT
            return RunStatus.GRADING_FAILED, f"{type(e).__name__}: {e}", ({} if e.retryable else {"retryable": False})
        # A reference failing its digest, password or limits is grading_failed;
        # an unreachable input is infrastructure_error (retryable), a missing one
        # too, recorded once (another attempt finds the same).
        return RunStatus(e.status), f"{type(e).__name__}: {e}", ({} if e.retryable else {"retryable": False})
    detail = f"{type(e).__name__}: {e}"
    if state.live.agent_started and not _engine_down(state):
        state.record.add_checks(CheckGroup.AFTER_AGENT, [Check(
            "run.checks_completed", False, "the run's checks completed", detail, "the run's checks could not be completed")])
        return RunStatus.INVALID_EVALUATION_ENVIRONMENT, f"the seal could not be proven after the agent started: {detail}", {
            "traceback": traceback.format_exc()[-8000:]}
    return RunStatus.INFRASTRUCTURE_ERROR, detail, {"traceback": traceback.format_exc()[-8000:]}


def _engine_down(state: RunState) -> bool:
    try:
        state.prep.provider.ping()
    except SandboxError:
        return True
    return False


def status_after_agent(outcome: AgentOutcome | None) -> RunStatus:
    if outcome is None:
        return RunStatus.AGENT_FAILED
    return {AgentEnd.FINISHED: RunStatus.SCORED, AgentEnd.FAILED: RunStatus.AGENT_FAILED, AgentEnd.TIMEOUT: RunStatus.TIMEOUT,
            AgentEnd.PROVIDER_FAILED: RunStatus.INFRASTRUCTURE_ERROR}[outcome.end]


# -- the table, executed ---------------------------------------------------------
async def provide_software(state: RunState) -> None:
    """The task's software before the seal: its environment image, found or built
    on the trusted side from its needs (the staged input's runtime_env included)."""
    base = state.prep.image or state.plan.image
    if vm_seal.is_vm(state) and not (state.plan.provision_software and is_default_guest(base)):
        # An operator's own guest or disk runs as given: its software is what it holds.
        state.live.image = base
        raw = state.prep.task.card.raw.get("software")
        declared = [str(x) for x in ([raw] if isinstance(raw, str) else raw if isinstance(raw, list) else [])]
        state.record.store.write_json(Evidence.ENVIRONMENT, {
            "image": base, "kind": "as given", "base": base, "declared": declared,
            "note": "an operator's own VM guest or disk runs as given" if state.plan.provision_software
            else "provision_software is off"})
        if declared:
            state.record.warnings.append(f"software: the VM guest {base} runs as given; its declared software "
                                         f"({', '.join(declared[:8])}) is whatever that guest holds")
        return
    if not state.plan.provision_software:
        state.live.image = base
        state.record.store.write_json(Evidence.ENVIRONMENT, {"image": base, "kind": "as given", "base": base,
                                                              "note": "provision_software is off"})
        return
    if vm_seal.is_vm(state):  # the environment image, made a VM guest of its own
        image, doc = await software.provide_for_vm(state.plan.task_dir, input_dir=state.folder.input_host,
                                                   overlay_path=state.plan.software_overlay, guest=base)
    else:
        image, doc = await software.provide(state.plan.task_dir, input_dir=state.folder.input_host,
                                            overlay_path=state.plan.software_overlay, base_image=base,
                                            image_id=lambda ref: _image_id(state, ref))
    state.live.image = None if doc.get("kind") == "base" else image  # nothing to add: the images as planned
    state.record.store.write_json(Evidence.ENVIRONMENT, doc)
    state.record.environment = {"image": image, "kind": doc.get("kind"), "missing": len(doc.get("missing", []))}
    state.record.events.append("software.provided", image=image, kind=doc.get("kind"),
                               missing=[m.get("name") for m in doc.get("missing", [])])
    if doc.get("missing"):
        names = ", ".join(str(m.get("name")) for m in doc["missing"][:8])
        state.record.warnings.append(f"software: {len(doc['missing'])} declared need(s) not provided ({names}); "
                                     f"see {layout.evidence_path(Evidence.ENVIRONMENT)}")


def _image_id(state: RunState, ref: str) -> str | None:
    try:
        return state.prep.provider.image_inspect(ref).get("Id")
    except SandboxError:
        return None


async def _provision_step(state: RunState) -> None:
    await provide_software(state)
    layer = getattr(state.extension, "layer_image", None)  # a native harness's image layer (ale.runs.extensions)
    if layer is not None:
        await layer(state)
    await provision(state)
    await verify_created(state)
    await state.sandbox.start()
    boot = getattr(state.sandbox, "boot", None)  # a VM: booted or restored, and how long it took
    state.record.events.append("sandbox.started", **({"boot": boot} if boot else {}))
    await state.extension.sandbox_started(state)
    if state.extension.computer is None and hasattr(state.sandbox, "protocol"):
        await _cua_computer(state)


async def _cua_computer(state: RunState) -> None:
    """A cua sandbox whose computer-server has a screen: the agent's and start()'s
    ``computer`` tool drives it through the protocol, at the screen's size."""
    from ale.sandbox.computer import Computer
    from ale.sandbox.cua.desktop import CuaDesktop

    screen = await CuaDesktop.of(state.sandbox)
    if screen is not None:
        state.extension.computer = Computer(screen)
        state.record.events.append("cua.screen", width=screen.width, height=screen.height)


async def record_cua(state: RunState) -> None:
    """A cua-compatible image's sandbox (``ale.sandbox.cua.sandbox``): its computer-server,
    the tunnel to it and the control server's rights beside the candidate's (written
    once, at the end of the agent's turn)."""
    record = getattr(state.sandbox, "record", None)
    if record is not None:
        state.record.store.write_json(Evidence.CUA, await record())


# A desktop run's screen, recorded at these moments (evidence/screens.json, the PNGs beside).
SCREEN_AFTER_START, SCREEN_END_OF_TURN = "after_start", "end_of_turn"
SCREENSHOT_BOUND_S = 30.0


async def record_screen(state: RunState, moment: str) -> None:
    """The whole screen of a desktop run (the desktop's or a cua sandbox's), as its own
    evidence file; a screen that cannot be captured is recorded with why, and never
    fails the run. A run without a desktop records nothing."""
    computer = state.extension.computer
    if computer is None or state.live.sandbox is None:
        return
    from ale.sandbox.computer import png_size

    entry: dict[str, Any] = {"at": now().isoformat()}
    t0 = time.monotonic()
    try:
        _, png = await asyncio.wait_for(computer.desktop.request("screenshot", timeout=SCREENSHOT_BOUND_S),
                                        SCREENSHOT_BOUND_S + 5)
        width, height = png_size(png)
        name = Evidence.screen(moment)
        ev.write_new(state.record.store.path(name), png, durable=state.record.store.durable)
        entry.update(file=layout.evidence_path(name), sha256=ev.sha256_bytes(png), bytes=len(png), width=width, height=height)
    except Exception as e:  # the desktop may be gone (the candidate's doing, or the sandbox stopped)
        entry["error"] = f"{type(e).__name__}: {e}"[:2000]
    entry["seconds"] = round(time.monotonic() - t0, 4)
    state.record.screens[moment] = entry
    state.record.events.append("screen.recorded", moment=moment, **{k: entry[k] for k in ("sha256", "error") if k in entry})


async def _task_start_step(state: RunState) -> None:
    await run_task_setup(state)
    await record_screen(state, SCREEN_AFTER_START)


async def _verify_before_step(state: RunState) -> None:
    await verify_running(state, "before")
    await seal_input_and_workspace(state)
    await commit_reference(state)


async def _agent_step(state: RunState) -> None:
    state.live.agent_started = True
    try:
        await run_agent(state)
    except Exception:
        await record_screen(state, SCREEN_END_OF_TURN)
        raise
    await record_screen(state, SCREEN_END_OF_TURN)  # as the agent's turn left it, before anything of it is killed
    record_model_gateway(state)


# The whole stop step's hard bound: the host-side stop (``STOP_BOUND_S``), then the
# after-run probes (their own 30 s), with room for the inspects between.
STOP_STEP_BOUND_S = STOP_BOUND_S + 45.0


async def _stop_step(state: RunState) -> None:
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
    if _stopped_reason(inspect) is None:
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
        probe = await state.sandbox.exec(probe_command(state.plan.policy, input_dir=v.public_root, workspace_dir=v.output_dir),
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
    reason = _stopped_reason(inspect) or ""
    record = {key: st.get(key) for key in ("Status", "Running", "Pid", "OOMKilled", "ExitCode", "StartedAt", "FinishedAt")}
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


async def _deliverables_step(state: RunState) -> None:
    await collect_deliverables(state)
    await check_input_unchanged(state)


async def _grade_step(state: RunState) -> None:
    try:
        await stage_reference(state)
    except GradingError as e:  # start()'s reference changed: not the candidate's doing
        raise GradingEnvironmentError(str(e), e.traceback) from e
    state.record.scores = await grade_with_retries(state)


async def grade_with_retries(state: RunState) -> list[float]:
    """evaluate() on the same signed deliverables and the same reference, up to
    ``limits.grading_attempts`` times (each retry with a fresh task process and a
    fresh grading sandbox, after a backoff). A failure the harness can show is its
    own (the grading sandbox, the engine) ends it at once, retryable; a failure that
    repeats on every attempt is charged to the candidate."""
    lim = state.plan.limits
    attempts: list[dict[str, Any]] = []
    try:
        for n in range(1, lim.grading_attempts + 1):
            # A desktop task's grader reads the live window through what start() kept in
            # its process (window ids): it is tried again in that process while it lives.
            keep = n == 1 or (state.prep.desktop is not None and state.prep.process.alive)
            process = state.prep.process if keep else await _fresh_task_process(state)
            started = now()
            try:
                scores = await grade(state, process, attempt=n)
                attempts.append({"attempt": n, "started_at": started.isoformat(), "ended_at": now().isoformat(),
                                 "scores": scores})
                return scores
            except GradingError as e:
                attempts.append({"attempt": n, "started_at": started.isoformat(), "ended_at": now().isoformat(),
                                 "error": lossless.display(str(e))[:4000],
                                 "traceback": None if e.traceback is None else lossless.display(e.traceback)[-4000:],
                                 "harness_failure": isinstance(e, GradingEnvironmentError)})
                if isinstance(e, GradingEnvironmentError):
                    raise
                state.record.events.append("grading.failed", attempt=n, error=lossless.display(str(e))[:500])
                if _engine_down(state):
                    raise GradingEnvironmentError(f"the engine stopped answering while grading: {e}", e.traceback) from e
                if n == lim.grading_attempts:
                    raise GradingError(f"evaluate() failed on all {n} attempts on the same deliverables; last: {e}",
                                       e.traceback, charged=True) from e
                await asyncio.sleep(lim.grading_backoff_s * 2 ** (n - 1))
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        state.record.store.write_json(Evidence.GRADING_ATTEMPTS, attempts)


async def _fresh_task_process(state: RunState) -> TaskProcess:
    """A new task process for a grading retry (its load() run again); the old one is
    closed, so a grader that left it broken cannot break the next attempt."""
    old = state.live.task_process or state.prep.process
    await old.close()
    process = old.fresh()
    state.live.task_process = process
    try:
        await process.start()
    except (TaskProcessError, TaskCallFailed, TaskError) as e:
        raise GradingError(f"the task process for a grading retry did not start: {e}") from e
    return process


Step = Callable[[RunState], Awaitable[None]]
STEPS: dict[Phase, Step] = {
    Phase.STAGE_INPUT: stage_input,
    Phase.PROVISION: _provision_step,
    Phase.TASK_START: _task_start_step,
    Phase.VERIFY_BEFORE: _verify_before_step,
    Phase.AGENT: _agent_step,
    Phase.STOP: _stop_step,
    Phase.DELIVERABLES: _deliverables_step,
    Phase.GRADE: _grade_step,
}


async def release_sandbox(state: RunState) -> None:
    """Stop the candidate's sandbox, inspect it (after), diff the captures, remove it."""
    if state.live.sandbox is None:
        return
    await stop_and_verify_exited(state)
    await remove_sandbox(state)


async def _scores_of(state: RunState) -> None:
    state.record.scores = await grade_with_retries(state)


# The library every kind's steps are named from (``ale.phases.kind_steps``).
LIBRARY: dict[str, Step] = {
    **{phase.value: step for phase, step in STEPS.items()},
    "provide_software": provide_software,
    "start_in_grading_sandbox": start_in_grading_sandbox,
    "hash_input": hash_input,
    "commit_reference": commit_reference,
    "collect_deliverables": collect_deliverables,
    "stage_reference": stage_reference,
    "grade_with_retries": _scores_of,
}


def _wanted(state: RunState, row: KindStep) -> bool:
    if row.when == WHEN_START:
        return state.prep.task.has("start") and not state.live.start_kept
    return True


async def drive(state: RunState, own: dict[str, Step] | None = None, *, stages: dict[str, float] | None = None) -> None:
    """The one driver: each step of the state's kind in order (``kind_steps``; a
    kind's own steps in ``own``), recorded as its phase where the table names one
    and timed into ``stages``; the candidate's sandbox released where the table puts
    it (also when the step failed: a grader's failure still leaves it stopped and
    inspected); a gate ends the run on any violation. ``state.live.at`` names the
    step a failure came from."""
    library = {**LIBRARY, **(own or {})}
    for row in kind_steps(state.kind, state.prep.shape):
        if not _wanted(state, row):
            continue
        state.live.at = row.step
        t0 = time.monotonic()
        try:
            async with state.record.phase(row.phase) if row.phase is not None else contextlib.nullcontext():
                try:
                    await library[row.step](state)
                except Exception:
                    if row.releases_sandbox:
                        with contextlib.suppress(Exception):  # the step's failure is the one to report
                            await release_sandbox(state)
                    raise
                if row.releases_sandbox:
                    await release_sandbox(state)
        finally:
            if stages is not None:
                stages[row.timed_as] = round(stages.get(row.timed_as, 0.0) + time.monotonic() - t0, 4)
        if row.gate and state.record.violations:
            raise SealBroken()
    state.live.at = None


async def execute_run(
    plan: RunPlan, *, provider: SandboxProvider | None = None, prepared: Prepared | None = None
) -> RunResult:
    """Run one plan to its end and return the result (written last, atomically).

    Raises PreflightError (nothing created) for a bad task, variant, engine or
    image. Every later failure becomes a status; containers are always removed.
    """
    prep: Prepared = prepared if prepared is not None else await prepare(plan, provider)
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=False)
    ev.write_json_new(run_dir / layout.PLAN, json.loads(plan.model_dump_json()))
    prep.process.log_path = run_dir / layout.TASK_LOG
    scratch = Path(plan.runs_dir).resolve() / ".scratch" / plan.run_id  # absolute: bind-mount sources
    state = new_state(prep, RunFolder(run_dir, scratch, prep.variant), run_dir)
    record = state.record
    started = now()
    status: RunStatus = RunStatus.INFRASTRUCTURE_ERROR
    error: str | None = None
    extra: dict[str, Any] = {}
    record.events.append("run.start", run_id=plan.run_id, plan_digest=plan.digest())
    raised = (prep.agent.sandbox_limits or {}).get("raised")
    if raised:  # the agent's needs raised the planned policy's limits (evidence/policy.json is what ran)
        record.events.append("policy.raised", by=prep.agent.name, raised=raised)
    with record.cost("evidence"):
        _record_static_evidence(state)
    try:
        make_dirs(state)
        if plan.resume_from:  # the source run's gateway record, copied in: its turns are replayed
            info = prepare_resume(run_dir, Path(plan.resume_from))
            record.events.append("run.resume", **{k: v for k, v in info.items() if k != "source_usage"})
        await drive(state)
        status = status_after_agent(state.live.agent_outcome)
        if state.live.agent_outcome and state.live.agent_outcome.end is not AgentEnd.FINISHED:
            error = state.live.agent_outcome.detail
    except Exception as e:
        status, error, more = classify_failure(e, state)
        record.scores = None
        extra.update(more)
    finally:
        await cleanup(state)
    scores = record.scores
    if status is RunStatus.INFRASTRUCTURE_ERROR:  # the model's provider failed: no score is the agent's
        scores = None
    attribution = state.record.invalid_attribution if status is RunStatus.GRADING_FAILED else None
    if state.record.violations:
        status, scores = RunStatus.INVALID_EVALUATION_ENVIRONMENT, None
        attribution = state.record.invalid_attribution or (
            InvalidAttribution.AFTER_AGENT_START if state.live.agent_started else InvalidAttribution.BEFORE_AGENT)
    outcome = state.live.agent_outcome
    if outcome and outcome.usage:
        extra["usage"] = outcome.usage
    gw_summary = state.live.gateway or {}
    if "billing" in gw_summary:  # the run's cost, per model, as its gateway record derives it
        extra["billing"] = gw_summary["billing"]
        named = Counter(f["failure"] for f in gw_summary.get("failures") or [])
        if named or gw_summary.get("retries"):
            extra["model_failures"] = {**dict(sorted(named.items())), "retries": gw_summary.get("retries", 0)}
    model_failure = outcome.model_failure if outcome is not None else None
    if model_failure is not None and FAILURE_OWNER[model_failure] is FailureOwner.OPERATOR:
        extra["retryable"] = False  # the key, the quota or the model name: another attempt cannot change it
    resumed = resumed_result(gw_summary["resumed"], run_dir) if isinstance(gw_summary.get("resumed"), dict) else None
    if prep.agent.mode is not None:  # a named harness: native or bridge, never mixed up
        extra["agent_mode"] = prep.agent.mode
    extra["costs"] = {k: round(v, 4) for k, v in state.record.costs.items()}
    if state.record.environment is not None:
        extra["environment"] = state.record.environment
    if state.record.warnings:
        extra["warnings"] = list(state.record.warnings)
    result = RunResult(
        run_id=plan.run_id,
        task_id=prep.variant.task_id,
        task_dir=str(prep.task.path),
        variant=prep.variant.index,
        agent=plan.agent.display,
        status=status,
        scores=scores,
        score=(sum(scores) / len(scores)) if scores else None,
        error=None if error is None else lossless.display(error),  # an agent may put any text in its end
        violations=state.record.violations,
        invalid_attribution=attribution,
        phases=state.record.phases,
        started_at=started,
        ended_at=now(),
        harness_version=ale.__version__,
        experiment=plan.experiment,
        attempt=plan.attempt,
        model_failure=model_failure,
        agent_limit=outcome.limit if outcome is not None and status is RunStatus.TIMEOUT else None,
        resumed=resumed,
        extra=extra,
    )
    _finish_record(state, result)
    return result


def _record_static_evidence(state: RunState) -> None:
    plan = state.plan
    state.record.store.write_json(Evidence.POLICY, json.loads(plan.policy.model_dump_json()))
    state.record.store.write_json(Evidence.TASK_PROCESS, state.prep.process.evidence())
    state.record.store.write_json(
        Evidence.HARNESS,
        {
            "ale_version": ale.__version__,
            "python": platform.python_version(),
            "task_dir": str(state.prep.task.path),
            "task_code_sha256": state.prep.task.code_hash,
            "plan_sha256": plan.digest(),
            "run_shape": str(state.prep.shape),  # ale verify reads the phase table of this shape
        },
    )
    try:
        engine = state.prep.provider.engine_record()
        state.record.store.write_json(Evidence.ENGINE, engine)
        pipe = core_pattern_warning(engine)
        if pipe:
            state.record.warnings.append(pipe)
            state.record.events.append("engine.core_pattern_pipe", core_pattern=engine.get("core_pattern"))
    except SandboxError as e:
        state.record.store.write_json(Evidence.ENGINE, {"error": str(e)})


async def cleanup(state: RunState) -> None:
    """The one cleanup of every kind, on every path out: close the trajectory, the
    task processes, the grader, remove the sandbox, sweep by label what a handle
    cannot reach, drop the scratch folders (and their mounts), release the shared
    package. Shielded so that Ctrl-C still removes what was created."""

    async def _do() -> None:
        if state.live.trajectory is not None:
            with contextlib.suppress(Exception):
                state.live.trajectory.close(
                    usage=(state.live.agent_outcome.usage if state.live.agent_outcome else {}),
                    end=(state.live.agent_outcome.end.value if state.live.agent_outcome else "interrupted"),
                )
        # Independent of each other: done at once.
        jobs = [state.prep.process.close()]
        if state.live.task_process is not None:
            jobs.append(state.live.task_process.close())
        if state.live.sandbox is not None:
            jobs.append(state.sandbox.remove())
        if state.live.grader is not None:
            jobs.append(state.live.grader.close())
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
        # A removal that failed, a run interrupted mid-way or a create that was
        # still in flight when it was: sweep by the run's label, which finds what a
        # handle cannot (only this run's sandboxes carry it).
        task = asyncio.current_task()
        interrupted = task is not None and task.cancelling() > 0
        sweep = []
        if interrupted or (state.live.provisioning and (
                state.live.sandbox is None or any(isinstance(o, BaseException) for o in outcomes))):
            sweep.append(state.plan.run_id)
        if interrupted and state.live.start_sandbox is not None:
            sweep.append(state.live.start_sandbox)
        for run_id in sweep:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(state.prep.provider.remove_managed, run_id=run_id)
        await asyncio.to_thread(release_scratch, state.folder.scratch)
        release_package(state)

    await asyncio.shield(_do())


def release_package(state: RunState) -> None:
    """Let go of the shared public package this run staged from (its lock, so the
    cache may evict the entry). Idempotent."""
    if state.live.package is not None:
        state.live.package.release()


def _finish_record(state: RunState, result: RunResult) -> None:
    if state.record.workspace_at_creation is not None and not state.record.store.path(Evidence.WORKSPACE_EMPTY).exists():
        # The run stopped before the agent's start: keep the creation proof alone.
        state.record.store.write_json(Evidence.WORKSPACE_EMPTY, {"at_creation": state.record.workspace_at_creation})
    if state.record.screens:
        state.record.store.write_json(Evidence.SCREENS, state.record.screens)
    state.record.store.write_json(Evidence.CHECKS, state.record.checks)
    state.record.store.write_json(Evidence.PHASES, [p.model_dump(mode="json") for p in state.record.phases])
    state.record.events.append("run.end", status=result.status.value, score=result.score)
    tmp = state.folder.run_dir / layout.RESULT_TMP
    tmp.write_text(result.model_dump_json(indent=2))
    os.replace(tmp, state.folder.run_dir / layout.RESULT)
    # Nothing may be written into the run folder after this: the manifest covers it all.
    key = load_or_create_signing_key(Path(state.plan.signing_key) if state.plan.signing_key else None)
    ev.write_manifest_and_sign(state.folder.run_dir, key)
