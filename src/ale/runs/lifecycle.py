"""One run, as a sequence of small phases.

    prepare ─► stage input ─► provision ─► inspect (before) ─► start ─► task start()
      ─► probes (before) ─► commit reference ─► agent ─► kill everything ─► probes (after)
      ─► stop ─► inspect (after) ─► deliverables ─► remove sandbox ─► stage reference
      ─► evaluate() ─► result + evidence + signature

Each phase does one job and records its times. A phase that finds the sandbox
not sealed adds violations; any violation makes the run
`invalid_evaluation_environment` and no score is produced. Containers are
removed on every path out, cancellation (Ctrl-C) included.
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
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ale
from ale import layout, lossless
from ale.agents.base import AgentContext, AgentEnd, AgentOutcome
from ale.agents.errors import AgentConfigError
from ale.agents.gateway.record import evidence_record as gateway_evidence
from ale.agents.registry import agent_evidence, make_agent
from ale.agents.trajectory import TrajectoryWriter
from ale.data.base import DataError, ReferenceCommitment
from ale.data.hashing import restore_runnable
from ale.data.sources import open_source
from ale.defaults import DEFAULT_TOOLS_IMAGE  # desktop (ale-desktop)
from ale.grading.deliverables import extract_deliverables
from ale.grading.grader import Grader, GradingError, GradingInputs
from ale.isolation.checks import Check, check_inspect, diff_captures, failures
from ale.isolation.probes import (
    judge_probes,
    probe_command,
    run_probes,
    workspace_empty_checks,
    workspace_listing,
)
from ale.layout import Evidence
from ale.plan import RunPlan
from ale.record import evidence as ev
from ale.record.signing import load_or_create_signing_key
from ale.result import Phase, PhaseTiming, RunResult
from ale.runs.watchdog import WorkspaceLimits, watch
from ale.sandbox.base import (
    LABEL_EXPERIMENT,
    LABEL_ROLE,
    LABEL_RUN,
    ExecResult,
    ImageMissing,
    Mount,
    Sandbox,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
)
from ale.sandbox.computer import Computer  # desktop (ale-desktop)
from ale.sandbox.desktop import (  # desktop (ale-desktop)
    DEFAULT_DESKTOP_IMAGE,
    Desktop,
    DesktopSpec,
    desktop_spec,
)
from ale.sandbox.providers import make_provider
from ale.sandbox.scratch import mount_workspace_tmpfs, release_scratch
from ale.sandbox.session import ContainerSession, Route, RoutedSession
from ale.sandbox.tools import TASK_OUTPUT_LIMIT, TASK_READ_LIMIT, ToolBox
from ale.status import InvalidAttribution, RunStatus
from ale.tasks.card import load_card
from ale.tasks.environment import EnvironmentBuildError, TaskEnvironment, resolve_environment
from ale.tasks.errors import TaskError
from ale.tasks.jail import task_network
from ale.tasks.loader import TaskVariant, select_variant
from ale.tasks.process import (
    TaskCallFailed,
    TaskInfo,
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


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Prepared:
    plan: RunPlan
    task: TaskInfo
    variant: TaskVariant
    data_spec: str | None
    wall_time_s: float
    provider: SandboxProvider
    agent: Any
    process: TaskProcess  # the task's code, alive from load() to the end of evaluate()
    desktop: DesktopSpec | None = None  # desktop (ale-desktop): the task asks for one
    image: str = ""  # desktop (ale-desktop): the candidate's image (the desktop image for desktop tasks)
    image_record: dict | None = None  # the engine's description of that image, read at preflight


@dataclass
class RunState:
    """What the phases share while one run goes on."""

    prep: Prepared
    run_dir: Path
    scratch: Path
    events: Any
    store: Any
    phases: list[PhaseTiming] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # result.extra["warnings"]: nothing void, worth a look
    sandbox: Sandbox | None = None
    grader: Grader | None = None
    source: Any = None
    commitment: ReferenceCommitment | None = None
    agent_outcome: AgentOutcome | None = None
    trajectory: Any = None
    costs: dict[str, float] = field(default_factory=dict)
    workspace_at_creation: dict | None = None  # listing + inode, proof the workspace began empty
    inspect_before: dict | None = None  # the raw capture at create, diffed with the one after exit
    input_after_start: dict | None = None  # the input's tree hash once start() has run
    reference_commit: dict | None = None  # what was committed before the agent started
    agent_started: bool = False  # from here on, a failure may be the candidate's doing
    provisioning: bool = False  # a sandbox may exist from here on (cleanup sweeps by label if in doubt)
    invalid_attribution: InvalidAttribution | None = None  # set by a phase that knows better than agent_started
    desktop: Desktop | None = None  # desktop (ale-desktop): alive from start until after evaluate()
    computer: Computer | None = None  # desktop (ale-desktop): the computer tool over it

    @contextlib.contextmanager
    def cost(self, what: str) -> Iterator[None]:
        """Accumulate wall time spent on `what` (verify, evidence) for the benchmarks."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.costs[what] = self.costs.get(what, 0.0) + time.perf_counter() - t0

    @property
    def plan(self) -> RunPlan:
        return self.prep.plan

    @property
    def variant(self) -> TaskVariant:
        return self.prep.variant

    @property
    def public_host(self) -> Path:
        """The run's public package on the host, mounted read-only at the
        variant's public root: for ALE tasks ``input/``, ``software/`` and the
        workspace's (empty) mount point; for others the input alone."""
        return self.scratch / ("public" if self.variant.task_dir else "input")

    @property
    def input_host(self) -> Path:
        rel = self.variant.public_relpath(self.variant.input_dir)
        return self.public_host if rel in (None, ".") else self.public_host / rel

    @property
    def software_host(self) -> Path | None:
        """Where the data source staged ``software/`` (next to the input), when it is
        inside the public package; None when the task has no software there."""
        sw = self.input_host.parent / "software"
        inside = self.public_host in sw.parents
        return sw if inside and sw.is_dir() else None

    @property
    def workspace_host(self) -> Path:
        return self.scratch / "workspace"

    @property
    def setup_reference_host(self) -> Path:
        return self.scratch / "private" / "setup-reference"

    @property
    def reference_host(self) -> Path:
        return self.scratch / "private" / "reference"

    def mounts(self) -> list[Mount]:
        return [
            Mount(str(self.public_host.resolve()), self.variant.public_root, True),
            Mount(str(self.workspace_host.resolve()), self.variant.output_dir, False),
        ]

    @contextlib.asynccontextmanager
    async def phase(self, name: Phase) -> AsyncIterator[None]:
        started = _now()
        t0 = time.monotonic()
        self.events.append("phase.start", phase=name)
        try:
            yield
        finally:
            ended = _now()
            self.phases.append(PhaseTiming(name=name, started_at=started, ended_at=ended, seconds=round(time.monotonic() - t0, 4)))
            self.events.append("phase.end", phase=name)

    def add_checks(self, phase: str, checks: list[Check]) -> None:
        for c in checks:
            self.checks.append({"phase": phase, **c.to_dict()})
        for c in failures(checks):
            self.violations.append(f"[{phase}] {c.id}: expected {c.expected!r}, observed {c.observed!r}" + (f" ({c.detail})" if c.detail else ""))
        if failures(checks):
            self.events.append("verify.failed", phase=phase, ids=[c.id for c in failures(checks)])


class SealBroken(Exception):
    """Verification found violations: the agent must not (or no longer) run."""


# -- preflight -----------------------------------------------------------------
async def prepare(
    plan: RunPlan, provider: SandboxProvider | None = None, *, environment: TaskEnvironment | None = None
) -> Prepared:
    """Start the task process (``load()``), pick the variant, check the agent, the
    engine and the image. Raises ``PreflightError``; nothing is left running then."""
    try:
        card = load_card(plan.task_dir)
        reason = card.unsupported_reason(plan.provider)
    except TaskError as e:
        raise PreflightError(str(e)) from e
    if reason is not None:
        raise PreflightError(f"{plan.task_dir}: {reason}")
    try:
        if environment is None:
            environment = await asyncio.to_thread(resolve_environment, plan.task_dir)
    except (TaskError, EnvironmentBuildError) as e:
        raise PreflightError(str(e)) from e
    process = TaskProcess(plan.task_dir, environment=environment, card=card,
                          network=task_network(judge_env(names=plan.judge_env)))
    try:
        return await _prepare(plan, provider, process)
    except BaseException:
        await process.close()
        raise


async def _prepare(plan: RunPlan, provider: SandboxProvider | None, process: TaskProcess) -> Prepared:
    try:
        task = await process.start()
        variant = select_variant(task.variants, plan.variant)
        os_type = ((variant.computer or {}).get("setup_config") or {}).get("os_type")
        reason = task.card.unsupported_reason(plan.provider, variant_os=os_type if isinstance(os_type, str) else None)
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
        check = getattr(agent, "preflight", None)
        if check is not None:
            check(private=[Path(plan.runs_dir), Path(plan.task_dir)])
    except AgentConfigError as e:
        raise PreflightError(str(e)) from e
    data_spec = plan.data_source or task.card.data_source
    wall = plan.limits.wall_time_s or task.card.timeout_s or DEFAULT_WALL_TIME_S
    # desktop (ale-desktop): a task asking for a desktop runs in the desktop image
    desktop = desktop_spec(task.card.raw, variant.computer)
    image = DEFAULT_DESKTOP_IMAGE if desktop is not None and plan.image == DEFAULT_TOOLS_IMAGE else plan.image
    try:
        provider = provider or make_provider(plan.provider)
        image_record = await asyncio.to_thread(provider.image_inspect, image)
    except ImageMissing as e:
        raise PreflightError(str(e)) from e
    except SandboxError as e:
        raise PreflightError(str(e), retryable=True) from e
    return Prepared(plan, task, variant, data_spec, float(wall), provider, agent, process, desktop, image, image_record)


# -- phases --------------------------------------------------------------------
def _make_dirs(state: RunState) -> None:
    state.scratch.mkdir(parents=True, mode=0o700)
    os.chmod(state.scratch, 0o700)
    state.public_host.mkdir(mode=0o755)
    if state.input_host != state.public_host:
        state.input_host.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    state.workspace_host.mkdir(mode=0o755)
    policy, cap = state.plan.policy, state.plan.limits.workspace_max_bytes
    if cap is not None and os.geteuid() == 0:  # a hard cap; otherwise the watchdog's
        mount_workspace_tmpfs(state.workspace_host, max_bytes=cap, uid=policy.uid, gid=policy.gid)
    else:
        try:
            os.chown(state.workspace_host, policy.uid, policy.gid)
        except PermissionError:
            os.chmod(state.workspace_host, 0o777)
    (state.scratch / "private").mkdir(mode=0o700)
    state.setup_reference_host.mkdir(mode=0o700)


async def stage_input(state: RunState) -> None:
    spec = state.prep.data_spec
    if spec is None or state.variant.metadata.get("requires_task_data") is False:
        # No data: ALE's REQUIRES_TASK_DATA = False (its config's metadata says
        # requires_task_data: false), or no source at all. An empty input folder.
        note = "task has no data source" if spec is None else "the task stages no data (requires_task_data: false)"
        state.input_host.mkdir(parents=True, exist_ok=True, mode=0o755)
        _make_workspace_mount_point(state)
        state.store.write_json(Evidence.INPUT_STAGED, {"source": None, "note": note})
        return
    state.source = open_source(spec, base_dir=state.prep.task.path, image_store=state.prep.provider.image_store())
    tree = await asyncio.to_thread(state.source.stage_input, state.variant.data_key, state.input_host)
    _make_workspace_mount_point(state)
    key = state.variant.data_key
    state.store.write_json(
        Evidence.INPUT_STAGED,
        {"source": spec, "key": key.relpath, "layout": state.source.layout_of(key), "location": state.source.location(key), "tree": tree},
    )


def _make_workspace_mount_point(state: RunState) -> None:
    """An empty folder in the public package where the workspace is mounted
    (ALE tasks write to ``<task_dir>/output``, inside the read-only package)."""
    rel = state.variant.public_relpath(state.variant.output_dir)
    if rel not in (None, "."):
        point = state.public_host / rel
        if point.exists() and (point.is_symlink() or not point.is_dir() or any(point.iterdir())):
            raise DataError(f"the public package holds {rel!r} where the workspace is mounted; it must not")
        point.mkdir(parents=True, exist_ok=True, mode=0o755)


def _public_package_checks(state: RunState) -> list[Check]:
    """The public package holds no reference: nothing where the task expects its
    reference and, for an ALE task folder, no ``reference``/``reference.7z`` in it."""
    found = []
    if state.variant.task_dir:
        found = [n for n in ("reference", "reference.7z") if os.path.lexists(state.public_host / n)]
    rel = state.variant.public_relpath(state.variant.reference_dir)
    if rel not in (None, ".") and os.path.lexists(state.public_host / rel):
        found.append(rel)
    found = sorted(set(found))
    return [Check("public.no_reference", not found, "no reference in the public package", found or None,
                  f"the public package holds {found}" if found else "")]


async def provision(state: RunState) -> None:
    plan = state.plan
    labels = {LABEL_RUN: plan.run_id, LABEL_ROLE: "candidate"}
    if plan.experiment:
        labels[LABEL_EXPERIMENT] = plan.experiment
    mounts = state.mounts()
    state.store.write_json(
        Evidence.MOUNTS,
        [
            {"source": m.source, "inode": os.stat(m.source).st_ino, "target": m.target, "read_only": m.read_only}
            for m in mounts
        ],
    )
    state.workspace_at_creation = workspace_listing(state.workspace_host)
    state.provisioning = True
    state.sandbox = await state.prep.provider.create(
        SandboxSpec(
            name=f"ale-{plan.run_id}"[:120],
            image=state.prep.image or plan.image,
            policy=plan.policy,
            mounts=tuple(mounts),
            labels=labels,
            workdir=state.variant.output_dir,
        )
    )
    state.events.append("sandbox.created", name=state.sandbox.name, id=state.sandbox.id)


def _mount_inodes(state: RunState) -> dict[str, int]:
    return {m.source: os.stat(m.source).st_ino for m in state.mounts()}


async def verify_created(state: RunState) -> None:
    assert state.sandbox is not None
    with state.cost("verify"):
        await _verify_created(state)


async def _verify_created(state: RunState) -> None:
    assert state.sandbox is not None
    inspect = await asyncio.to_thread(state.sandbox.inspect)
    state.inspect_before = inspect
    state.store.write_json(Evidence.INSPECT_BEFORE, inspect)
    image = state.prep.image_record
    if image is None or image.get("Id") != inspect.get("Image"):  # the container's image, as the engine says now
        image = await asyncio.to_thread(state.prep.provider.image_inspect, inspect.get("Image", state.plan.image))
    state.store.write_json(Evidence.IMAGE, image)
    checks = check_inspect(
        inspect, state.plan.policy, state.mounts(), phase="before", image_inspect=image, mount_inodes=_mount_inodes(state)
    )
    state.add_checks("inspect-before", checks)


async def run_task_setup(state: RunState) -> None:
    """The task's start(cfg, session): input and reference writes land on the host."""
    if not state.prep.task.has("start"):
        return
    assert state.sandbox is not None
    v = state.variant
    tools = ToolBox(state.sandbox, workdir=v.output_dir, default_timeout=state.plan.limits.command_timeout_s,
                    output_limit=TASK_OUTPUT_LIMIT, read_limit=TASK_READ_LIMIT,
                    computer=state.computer)  # desktop (ale-desktop): start() launches its windows
    container = ContainerSession(tools, default_timeout=state.plan.limits.command_timeout_s)

    async def factory() -> ContainerSession:
        return container

    session = RoutedSession(
        [Route(v.input_dir, state.input_host, writable=True), Route(v.reference_dir, state.setup_reference_host, writable=True)],
        factory, gui=container if state.computer is not None else None,
    )
    await state.prep.process.call("start", v.index, session, timeout=state.plan.limits.grading_timeout_s)


async def verify_running(state: RunState, phase: str, probe: ExecResult | None = None, *, ran: bool = False) -> None:
    """Probes inside the running sandbox (the harness's own exec; the same code
    ``verify-container`` and the real-container tests use). ``ran``: they already
    ran, in the end-of-turn kill's exec, and ``probe`` is their result."""
    assert state.sandbox is not None
    with state.cost("verify"):
        v, policy = state.variant, state.plan.policy
        if ran:
            raw, checks = judge_probes(probe, policy, input_dir=v.public_root, workspace_dir=v.output_dir, phase=phase)
        else:
            raw, checks = await run_probes(state.sandbox, policy, input_dir=v.public_root, workspace_dir=v.output_dir, phase=phase)
        state.store.write_text(Evidence.probes(phase), raw)
        state.add_checks(f"probes-{phase}", checks)


def seal_input_and_workspace(state: RunState) -> None:
    """After start(): hash the input, prove the workspace is still empty."""
    with state.cost("evidence"):
        _seal_input_and_workspace(state)


def _seal_input_and_workspace(state: RunState) -> None:
    state.input_after_start = ev.hash_tree(state.public_host)
    state.store.write_json(Evidence.INPUT_AFTER_START, state.input_after_start)
    created = state.workspace_at_creation or {}
    listing = workspace_listing(state.workspace_host)
    state.store.write_json(Evidence.WORKSPACE_EMPTY, {"at_creation": created, "at_agent_start": listing})
    state.add_checks("agent-start", workspace_empty_checks(listing, expected_inode=created.get("inode")) + _public_package_checks(state))


async def commit_reference(state: RunState) -> None:
    src_commit = None
    if state.source is not None:
        src_commit = await asyncio.to_thread(state.source.commit_reference, state.variant.data_key)
    state.commitment = src_commit
    setup_tree = ev.hash_tree(state.setup_reference_host)
    state.reference_commit = {
        "source": None if src_commit is None else {"kind": src_commit.kind, "sha256": src_commit.sha256, "files": src_commit.files},
        "setup_written": setup_tree,
        "committed_at": _now().isoformat(),
    }
    state.store.write_json(Evidence.REFERENCE_COMMIT, state.reference_commit)
    state.events.append("reference.committed", sha256=None if src_commit is None else src_commit.sha256, setup_digest=setup_tree["digest"])


async def run_agent(state: RunState) -> None:
    assert state.sandbox is not None
    plan, v = state.plan, state.variant
    agent = state.prep.agent
    state.store.write_json(Evidence.AGENT, agent_evidence(plan.agent))
    state.store.write_json(Evidence.NETWORK, {"network_mode": plan.policy.network_mode, "controller": "outside the sandbox; tools reach it only through docker exec"})
    state.trajectory = TrajectoryWriter(state.run_dir, plan.run_id, plan.agent.display)
    deadline = time.monotonic() + state.prep.wall_time_s
    tools = ToolBox(
        state.sandbox,
        workdir=v.output_dir,
        allowlist=plan.agent.allowlist,
        recorder=state.trajectory,
        default_timeout=plan.limits.command_timeout_s,
        deadline=deadline,
        computer=state.computer,  # desktop (ale-desktop)
    )
    ctx = AgentContext(
        prompt=v.description,
        tools=tools,
        workdir=v.output_dir,
        input_dir=v.input_dir,
        run_dir=state.run_dir,
        wall_time_s=state.prep.wall_time_s,
        max_steps=plan.limits.max_steps,
        oracle=_oracle(state) if plan.agent.name == "oracle" else None,
    )
    limits = WorkspaceLimits.for_host(state.workspace_host, plan.limits.workspace_max_bytes)
    state.events.append("workspace.watch", **limits.to_dict())
    watchdog = asyncio.ensure_future(watch(state.workspace_host, limits))
    turn = asyncio.ensure_future(asyncio.wait_for(agent.run(ctx), state.prep.wall_time_s))
    try:
        await asyncio.wait({turn, watchdog}, return_when=asyncio.FIRST_COMPLETED)
        if not turn.done():  # a workspace limit: the agent's turn ends here
            turn.cancel()
            with contextlib.suppress(BaseException):
                await turn
            reason = watchdog.result()
            state.events.append("workspace.limit", reason=reason)
            state.agent_outcome = AgentOutcome(AgentEnd.FAILED, detail=f"the agent's turn was ended: {reason}")
        else:
            state.agent_outcome = turn.result()
    except TimeoutError:
        state.agent_outcome = AgentOutcome(AgentEnd.TIMEOUT, detail=f"wall time of {state.prep.wall_time_s:.0f}s reached")
    except asyncio.CancelledError:
        turn.cancel()
        raise
    except Exception as e:
        state.agent_outcome = AgentOutcome(AgentEnd.FAILED, detail=f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}")
    finally:
        watchdog.cancel()
    outcome = state.agent_outcome
    assert outcome is not None
    state.events.append("agent.ended", end=outcome.end.value, detail=(outcome.detail or "")[:2000])


def record_model_gateway(state: RunState) -> None:
    """The model gateway's record (agents that reach a model through it): its summary
    and the harness's confinement as evidence, its chain head in the event log. A
    request that offered the model a forbidden tool makes the run invalid, charged to
    the controller's configuration when no model answer came before it."""
    doc = gateway_evidence(state.run_dir)
    if doc is None:
        return
    gw = doc["gateway"]
    state.store.write_json(Evidence.CONTROLLER, doc)
    state.events.append("gateway.recorded", head=gw.get("head"), records=gw.get("records"),
                        tools_offered=gw.get("tools_offered", []), refusals=gw.get("refusals", []))
    state.violations += [f"[agent] gateway.record: {p}" for p in gw.get("problems", [])]
    for r in gw.get("refusals", []):
        state.violations.append(f"[agent] gateway.tools_allowed: request {r['seq']} offered the model "
                                f"{', '.join(r['forbidden'])}, outside the run's allowlist; refused")
    if gw.get("refusals") and gw["refusals"][0].get("before_any_answer"):
        state.invalid_attribution = InvalidAttribution.CONTROLLER_CONFIGURATION


def _oracle(state: RunState) -> Any:
    """The task's solve(), run in the task process with the agent's session."""
    if not state.prep.task.has("solve"):
        return None
    index = state.variant.index

    async def solve(session: Any) -> Any:
        return await state.prep.process.call("solve", index, session)

    return solve


async def kill_agent_processes(state: RunState) -> ExecResult | None:
    """End the turn: kill every process the agent left, then (same exec) probe."""
    assert state.sandbox is not None
    v = state.variant
    remaining, probe = await state.sandbox.kill_user_processes_then(
        probe_command(state.plan.policy, input_dir=v.public_root, workspace_dir=v.output_dir)
    )
    state.events.append("agent.processes_killed", remaining=remaining)
    return probe


async def stop_and_verify_exited(state: RunState) -> None:
    assert state.sandbox is not None
    await state.sandbox.stop()
    with state.cost("verify"):
        after = await asyncio.to_thread(state.sandbox.inspect)
        state.store.write_json(Evidence.INSPECT_AFTER, after)
        before = state.inspect_before or {}
        checks = check_inspect(after, state.plan.policy, state.mounts(), phase="after", mount_inodes=_mount_inodes(state))
        checks += diff_captures(before, after)
        state.add_checks("inspect-after", checks)


async def collect_deliverables(state: RunState) -> None:
    """Copy the workspace out, off the event loop (the walk may take up to its time
    limit, and other runs share the loop)."""
    lim = state.plan.limits
    manifest = await asyncio.to_thread(
        extract_deliverables,
        state.workspace_host, state.run_dir / layout.DELIVERABLES_DIR, max_files=lim.deliverable_max_files,
        max_bytes=lim.deliverable_max_bytes, owner=(state.plan.policy.uid, state.plan.policy.gid) if os.geteuid() == 0 else None,
        mount_point=state.variant.output_dir,
    )
    ev.write_json_new(state.run_dir / layout.DELIVERABLES, json.loads(manifest.model_dump_json()))
    state.events.append("deliverables.collected", files=len(manifest.files), skipped=len(manifest.skipped), digest=manifest.digest)
    limited = [e for e in manifest.skipped if e.limit is not None]
    if limited:
        state.warnings.append(
            f"deliverables: {len(limited)} entr{'y' if len(limited) == 1 else 'ies'} of the workspace not copied at a limit "
            f"({limited[0].reason}: {limited[0].path}); the grader saw the rest ({layout.DELIVERABLES})")


async def remove_sandbox(state: RunState) -> None:
    if state.sandbox is not None:
        await state.sandbox.remove()
        state.events.append("sandbox.removed", name=state.sandbox.name)


def check_input_unchanged(state: RunState) -> None:
    with state.cost("evidence"):
        after = ev.hash_tree(state.public_host)
    state.store.write_json(Evidence.INPUT_AFTER_RUN, after)
    start = state.input_after_start or {}
    if after["digest"] != start.get("digest"):
        state.violations.append("[after-run] input.unchanged: the staged input changed during the run")


async def stage_reference(state: RunState) -> None:
    """Trusted side, candidate container gone: source reference + start()'s writes."""
    dest = state.reference_host
    if state.source is not None:
        await asyncio.to_thread(state.source.stage_reference, state.variant.data_key, dest, state.commitment)
    else:
        dest.mkdir(mode=0o700)
    setup_tree = ev.hash_tree(state.setup_reference_host)
    committed = state.reference_commit or {}
    if setup_tree["digest"] != (committed.get("setup_written") or {}).get("digest"):
        raise GradingError("reference written by start() changed after it was committed")
    for rel in setup_tree["files"]:
        target = dest / rel
        if target.exists():
            raise GradingError(f"start() wrote {rel} into the reference, which the data source also holds")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(state.setup_reference_host / rel, target)
    # The grading container reads it as the candidate uid: readable, on the trusted side
    # only; what is meant to run (execute bits, #!, ELF) stays runnable on its read-only mount.
    restore_runnable(dest)
    state.store.write_json(
        Evidence.REFERENCE_CHECK,
        {
            "source_sha256": None if state.commitment is None else state.commitment.sha256,
            "setup_written_digest": setup_tree["digest"],
            "staged_tree": ev.hash_tree(dest),
            "unpacked_at": _now().isoformat(),
        },
    )
    state.events.append("reference.staged")


async def grade(state: RunState) -> list[float]:
    plan, v = state.plan, state.variant
    state.grader = Grader(
        state.prep.provider,
        image=plan.image,
        policy=plan.policy,
        run_id=plan.run_id,
        experiment=plan.experiment,
        inputs=GradingInputs(
            input_host=state.input_host.resolve(),
            deliverables_host=(state.run_dir / "deliverables").resolve(),
            reference_host=state.reference_host.resolve(),
            input_dir=v.input_dir,
            output_dir=v.output_dir,
            reference_dir=v.reference_dir,
            software_host=None if state.software_host is None else state.software_host.resolve(),
            software_dir=f"{v.public_root}/software" if state.software_host is not None else None,
            task_dir=v.task_dir,
            scratch_host=state.scratch / "grading",
        ),
        command_timeout=plan.limits.grading_timeout_s,  # ALE graders run commands for up to about an hour
        gui=_grading_gui(state),  # desktop (ale-desktop): evaluate()'s GUI calls, the live desktop
    )
    try:
        process, timeout, env = state.prep.process, plan.limits.grading_timeout_s, judge_env(names=plan.judge_env)

        async def evaluate(session: Any) -> Any:
            return await process.call("evaluate", v.index, session, timeout=timeout, env=env)

        return await state.grader.grade(evaluate)
    finally:
        await state.grader.close()


# -- desktop (ale-desktop) -------------------------------------------------------
async def start_desktop(state: RunState) -> None:
    """Start the sandbox's desktop (as the desktop user, before start()); the
    computer tool's resolution is the agent config's ``display_width``/``display_height``
    (default 1024x768), scaled to the screen's."""
    assert state.sandbox is not None and state.prep.desktop is not None
    state.desktop = Desktop(state.sandbox, state.prep.desktop)
    started = await state.desktop.start()
    cfg = state.plan.agent.config or {}
    state.computer = Computer(state.desktop, width=int(cfg.get("display_width", 1024)),
                              height=int(cfg.get("display_height", 768)))
    state.costs["desktop_start"] = started["start_s"]
    state.store.write_json("desktop.json", {"spec": state.prep.desktop.to_dict(), "image": state.prep.image,
                                            "tool_resolution": [state.computer.width, state.computer.height],
                                            "started": started})
    state.events.append("desktop.started", seconds=started["start_s"])


def _grading_gui(state: RunState) -> Any:
    """evaluate()'s GUI calls: served by the candidate's sandbox, still sealed, the
    candidate's processes all killed, the desktop's alive (not recorded in the
    trajectory, which is the agent's)."""
    if state.computer is None or state.sandbox is None:
        return None
    return ContainerSession(ToolBox(state.sandbox, workdir="/", computer=state.computer))


async def finish_desktop_sandbox(state: RunState) -> None:
    """After evaluate(): stop the sandbox, inspect it (after), remove it."""
    if state.desktop is None or state.sandbox is None:
        return
    await stop_and_verify_exited(state)
    await remove_sandbox(state)
# -- end desktop --


# -- the run -------------------------------------------------------------------
def _classify_failure(e: Exception, state: RunState) -> tuple[RunStatus, str, dict[str, Any]]:
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
        return RunStatus.GRADING_FAILED, str(e), ({"grading_traceback": e.traceback} if e.traceback else {})
    if isinstance(e, TaskCallFailed):  # start() raised: the task could not be set up
        return RunStatus.INFRASTRUCTURE_ERROR, f"start() raised {e}", {"traceback": e.traceback[-8000:], "retryable": False}
    if isinstance(e, DataError):
        if state.agent_started:
            return RunStatus.GRADING_FAILED, f"{type(e).__name__}: {e}", {}
        # A reference failing its digest, password or limits is grading_failed;
        # an unreachable input is infrastructure_error (retryable), a missing one
        # too, recorded once (another attempt finds the same).
        return RunStatus(e.status), f"{type(e).__name__}: {e}", ({} if e.retryable else {"retryable": False})
    detail = f"{type(e).__name__}: {e}"
    if state.agent_started and not _engine_down(state):
        state.violations.append(f"[after-agent] run.checks_completed: the run's checks could not be completed ({detail})")
        return RunStatus.INVALID_EVALUATION_ENVIRONMENT, f"the seal could not be proven after the agent started: {detail}", {
            "traceback": traceback.format_exc()[-8000:]}
    return RunStatus.INFRASTRUCTURE_ERROR, detail, {"traceback": traceback.format_exc()[-8000:]}


def _engine_down(state: RunState) -> bool:
    try:
        state.prep.provider.ping()
    except SandboxError:
        return True
    return False


def _status_after_agent(outcome: AgentOutcome | None) -> RunStatus:
    if outcome is None:
        return RunStatus.AGENT_FAILED
    return {AgentEnd.FINISHED: RunStatus.SCORED, AgentEnd.FAILED: RunStatus.AGENT_FAILED, AgentEnd.TIMEOUT: RunStatus.TIMEOUT}[outcome.end]


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
    state = RunState(prep=prep, run_dir=run_dir, scratch=scratch, events=ev.EventLog(run_dir / layout.EVENTS), store=ev.EvidenceStore(run_dir))
    started = _now()
    status: RunStatus = RunStatus.INFRASTRUCTURE_ERROR
    scores: list[float] | None = None
    error: str | None = None
    extra: dict[str, Any] = {}
    state.events.append("run.start", run_id=plan.run_id, plan_digest=plan.digest())
    with state.cost("evidence"):
        _record_static_evidence(state)
    try:
        _make_dirs(state)
        async with state.phase(Phase.STAGE_INPUT):
            await stage_input(state)
        async with state.phase(Phase.PROVISION):
            await provision(state)
            await verify_created(state)
            assert state.sandbox is not None
            await state.sandbox.start()
            state.events.append("sandbox.started")
            if state.prep.desktop is not None:  # desktop (ale-desktop)
                await start_desktop(state)
        async with state.phase(Phase.TASK_START):
            await run_task_setup(state)
        async with state.phase(Phase.VERIFY_BEFORE):
            await verify_running(state, "before")
            seal_input_and_workspace(state)
            await commit_reference(state)
        if state.violations:
            raise SealBroken()
        async with state.phase(Phase.AGENT):
            state.agent_started = True
            await run_agent(state)
            record_model_gateway(state)
        async with state.phase(Phase.STOP):
            probe = await kill_agent_processes(state)
            await verify_running(state, "after", probe, ran=True)
            if state.desktop is None:  # desktop (ale-desktop): kept alive (sealed) through evaluate()
                await stop_and_verify_exited(state)
        async with state.phase(Phase.DELIVERABLES):
            await collect_deliverables(state)
            if state.desktop is None:  # desktop (ale-desktop): removed after evaluate()
                await remove_sandbox(state)
            check_input_unchanged(state)
        if state.violations:
            raise SealBroken()
        status = _status_after_agent(state.agent_outcome)
        if state.agent_outcome and state.agent_outcome.end is not AgentEnd.FINISHED:
            error = state.agent_outcome.detail
        async with state.phase(Phase.GRADE):
            try:
                await stage_reference(state)
                scores = await grade(state)
            finally:  # desktop (ale-desktop): stop, inspect after, remove
                await finish_desktop_sandbox(state)
    except Exception as e:
        status, error, more = _classify_failure(e, state)
        scores = None
        extra.update(more)
    finally:
        await _cleanup(state)
    attribution = None
    if state.violations:
        status, scores = RunStatus.INVALID_EVALUATION_ENVIRONMENT, None
        attribution = state.invalid_attribution or (
            InvalidAttribution.AFTER_AGENT_START if state.agent_started else InvalidAttribution.BEFORE_AGENT)
    if state.agent_outcome and state.agent_outcome.usage:
        extra["usage"] = state.agent_outcome.usage
    extra["costs"] = {k: round(v, 4) for k, v in state.costs.items()}
    if state.warnings:
        extra["warnings"] = list(state.warnings)
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
        violations=state.violations,
        invalid_attribution=attribution,
        phases=state.phases,
        started_at=started,
        ended_at=_now(),
        harness_version=ale.__version__,
        experiment=plan.experiment,
        attempt=plan.attempt,
        extra=extra,
    )
    _finish_record(state, result)
    return result


def _record_static_evidence(state: RunState) -> None:
    plan = state.plan
    state.store.write_json(Evidence.POLICY, json.loads(plan.policy.model_dump_json()))
    state.store.write_json(Evidence.TASK_PROCESS, state.prep.process.evidence())
    state.store.write_json(
        Evidence.HARNESS,
        {
            "ale_version": ale.__version__,
            "python": platform.python_version(),
            "task_dir": str(state.prep.task.path),
            "task_code_sha256": state.prep.task.code_hash,
            "plan_sha256": plan.digest(),
        },
    )
    try:
        state.store.write_json(Evidence.ENGINE, state.prep.provider.engine_record())
    except SandboxError as e:
        state.store.write_json(Evidence.ENGINE, {"error": str(e)})


async def _cleanup(state: RunState) -> None:
    """Always: close the trajectory, remove containers, drop the scratch folders.
    Shielded so that Ctrl-C during a run still removes what the run created."""

    async def _do() -> None:
        if state.trajectory is not None:
            with contextlib.suppress(Exception):
                state.trajectory.close(
                    usage=(state.agent_outcome.usage if state.agent_outcome else {}),
                    end=(state.agent_outcome.end.value if state.agent_outcome else "interrupted"),
                )
        # Independent of each other: done at once.
        jobs = [state.prep.process.close()]
        if state.sandbox is not None:
            jobs.append(state.sandbox.remove())
        if state.grader is not None:
            jobs.append(state.grader.close())
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
        # A removal that failed, a run interrupted mid-way or a create that was
        # still in flight when it was: sweep by the run's label, which finds what a
        # handle cannot (only this run's sandboxes carry it).
        task = asyncio.current_task()
        interrupted = task is not None and task.cancelling() > 0
        if state.provisioning and (interrupted or state.sandbox is None or any(isinstance(o, BaseException) for o in outcomes)):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(state.prep.provider.remove_managed, run_id=state.plan.run_id)
        await asyncio.to_thread(release_scratch, state.scratch)

    await asyncio.shield(_do())


def _finish_record(state: RunState, result: RunResult) -> None:
    if state.workspace_at_creation is not None and not state.store.path(Evidence.WORKSPACE_EMPTY).exists():
        # The run stopped before the agent's start: keep the creation proof alone.
        state.store.write_json(Evidence.WORKSPACE_EMPTY, {"at_creation": state.workspace_at_creation})
    state.store.write_json(Evidence.CHECKS, state.checks)
    state.store.write_json(Evidence.PHASES, [p.model_dump(mode="json") for p in state.phases])
    state.events.append("run.end", status=result.status.value, score=result.score)
    tmp = state.run_dir / "result.json.tmp"
    tmp.write_text(result.model_dump_json(indent=2))
    os.replace(tmp, state.run_dir / layout.RESULT)
    # Nothing may be written into the run folder after this: the manifest covers it all.
    key = load_or_create_signing_key(Path(state.plan.signing_key) if state.plan.signing_key else None)
    ev.write_manifest_and_sign(state.run_dir, key)
