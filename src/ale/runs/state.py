"""What one run holds while it goes on, split by who may change it.

- ``Prepared`` and ``RunFolder``: fixed once preflight has passed (the folder's
  properties are the run's paths);
- ``RunRecord``: the record being written (event log, evidence store, phases'
  times, checks, violations, and the values a later phase compares with what an
  earlier one committed);
- ``LiveHandles``: what is alive and must be closed (sandbox, grader, data source,
  trajectory) and the agent's outcome;
- ``RunExtension``: what a kind of task adds at the points the phase table names.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ale import layout
from ale.agents.base import Agent, AgentOutcome
from ale.agents.trajectory import TrajectoryWriter
from ale.data.base import DataSource, ReferenceCommitment
from ale.grading.grader import Grader
from ale.isolation.checks import Check, failures, violation_line
from ale.phases import CheckGroup, Phase, RunKind, RunShape
from ale.plan import RunPlan
from ale.record import evidence as ev
from ale.result import PhaseTiming
from ale.runs.packages import SharedPackage
from ale.sandbox.base import Mount, Sandbox, SandboxProvider
from ale.sandbox.computer import Computer
from ale.sandbox.desktop import DesktopSpec
from ale.status import InvalidAttribution
from ale.tasks.loader import TaskVariant
from ale.tasks.process import TaskInfo, TaskProcess


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Prepared:
    """What the run starts from, fixed once preflight has passed."""

    plan: RunPlan
    task: TaskInfo
    variant: TaskVariant
    data_spec: str | None
    wall_time_s: float
    provider: SandboxProvider
    agent: Agent
    process: TaskProcess  # the task's code, alive from load() to the end of evaluate()
    desktop: DesktopSpec | None = None  # the task asks for a desktop: the run's shape is live_grading
    image: str = ""  # the candidate's image (the desktop image for desktop tasks)
    image_record: dict | None = None  # the engine's description of that image, read at preflight

    @property
    def shape(self) -> RunShape:
        if self.plan.provider == "qemu":
            return RunShape.VM
        return RunShape.LIVE_GRADING if self.desktop is not None else RunShape.STANDARD


@dataclass(frozen=True)
class RunFolder:
    """Where the run's files are: the run folder (kept) and its scratch (removed at the
    end), each path a property."""

    run_dir: Path
    scratch: Path
    variant: TaskVariant

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
    def private(self) -> Path:
        return self.scratch / "private"

    @property
    def setup_reference_host(self) -> Path:
        return self.private / "setup-reference"

    @property
    def reference_host(self) -> Path:
        return self.private / "reference"

    @property
    def grading_scratch(self) -> Path:
        return self.scratch / "grading"

    def grading_scratch_for(self, attempt: int) -> Path:
        """The grading scratch folder of one grading attempt (its working copy is ``output/`` in it)."""
        return self.grading_scratch if attempt == 1 else self.grading_scratch.with_name(f"grading-{attempt}")

    def copy_bases(self, attempts: int) -> list[Path]:
        """Every host folder the deliverables are copied under after the run folder's
        own (the grader's working copy of each attempt): the deliverables get one path
        budget, for the longest of them (``deliverables.path_budget``)."""
        return [self.grading_scratch_for(n) / "output" for n in range(1, max(1, attempts) + 1)]

    @property
    def deliverables(self) -> Path:
        return self.run_dir / layout.DELIVERABLES_DIR

    def mounts(self) -> list[Mount]:
        return [
            Mount(str(self.public_host.resolve()), self.variant.public_root, True),
            Mount(str(self.workspace_host.resolve()), self.variant.output_dir, False),
        ]

    def mount_inodes(self) -> dict[str, int]:
        return {m.source: os.stat(m.source).st_ino for m in self.mounts()}


@dataclass
class RunRecord:
    """The record being written: the event log, the evidence store, the phases'
    times, the checks and violations, and the values a later phase compares with
    what an earlier one committed."""

    events: ev.EventLog
    store: ev.EvidenceStore
    phases: list[PhaseTiming] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # result.extra["warnings"]: nothing void, worth a look
    costs: dict[str, float] = field(default_factory=dict)
    workspace_at_creation: dict | None = None  # listing + inode, proof the workspace began empty
    inspect_before: dict | None = None  # the raw capture at create, diffed with the one after exit
    vm_before: dict | None = None  # a VM run: QEMU's capture before the agent, diffed with the one after its turn
    input_after_start: dict | None = None  # the input's tree hash once start() has run
    public_before_start: dict | None = None  # the public package's stat listing before start() (start_writes)
    # a desktop run's screenshots by moment (screens.json)
    screens: dict[str, dict[str, Any]] = field(default_factory=dict)
    commitment: ReferenceCommitment | None = None  # the data source's reference, committed before the agent
    reference_commit: dict | None = None  # what was committed before the agent started
    invalid_attribution: InvalidAttribution | None = None  # set by a phase that knows better than agent_started
    scores: list[float] | None = None  # what evaluate() returned
    environment: dict[str, Any] | None = None  # result.extra["environment"]: the image the sandboxes started from

    @contextlib.contextmanager
    def cost(self, what: str) -> Iterator[None]:
        """Accumulate wall time spent on `what` (verify, evidence) for the benchmarks."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.costs[what] = self.costs.get(what, 0.0) + time.perf_counter() - t0

    @contextlib.asynccontextmanager
    async def phase(self, name: Phase) -> AsyncIterator[None]:
        started = now()
        t0 = time.monotonic()
        self.events.append("phase.start", phase=name)
        try:
            yield
        finally:
            ended = now()
            self.phases.append(PhaseTiming(name=name, started_at=started, ended_at=ended,
                                           seconds=round(time.monotonic() - t0, 4)))
            self.events.append("phase.end", phase=name)

    def add_checks(self, group: CheckGroup, checks: list[Check]) -> None:
        for c in checks:
            self.checks.append({"phase": str(group), **c.to_dict()})
        failed = failures(checks)
        self.violations += [violation_line(group, c) for c in failed]
        if failed:
            self.events.append("verify.failed", phase=str(group), ids=[c.id for c in failed])


@dataclass
class LiveHandles:
    """What is alive while the run goes on; ``_cleanup`` closes each."""

    sandbox: Sandbox | None = None
    grader: Grader | None = None
    source: DataSource | None = None
    package: SharedPackage | None = None  # the shared public package this run's overlay sits on
    trajectory: TrajectoryWriter | None = None
    image: str | None = None  # the image the sandboxes start from, once the task's software is provided
    image_record: dict | None = None  # its description, when it is not the one read at preflight
    task_process: TaskProcess | None = None  # a grading retry's fresh task process (the first is Prepared's)
    agent_outcome: AgentOutcome | None = None
    gateway: dict[str, Any] | None = None  # the gateway record's summary (record.derive), once the turn ended
    agent_started: bool = False  # from here on, a failure may be the candidate's doing
    provisioning: bool = False  # a sandbox may exist from here on (cleanup sweeps by label if in doubt)
    # the grading sandbox start() runs in when there is no candidate's (swept if in doubt)
    start_sandbox: str | None = None
    start_kept: bool = False  # start()'s writes were laid from a run's record: start() is not run again
    at: str | None = None  # the step the driver is in (a kind's finisher reads where a failure happened)


@dataclass
class RunState:
    """One run: what is fixed, the record, the live handles, the run's extension."""

    prep: Prepared
    folder: RunFolder
    record: RunRecord
    live: LiveHandles
    extension: RunExtension
    kind: RunKind = RunKind.RUN

    @property
    def plan(self) -> RunPlan:
        return self.prep.plan

    @property
    def variant(self) -> TaskVariant:
        return self.prep.variant

    @property
    def planned_image(self) -> str:
        """The image the preflight chose (the plan's, the desktop image, an operator's VM disk)."""
        return self.prep.image or self.plan.image

    @property
    def candidate_image(self) -> str:
        """The image the candidate's sandbox starts from: the task's software's (or a
        native harness's layer over it) once provided, else the preflight's choice."""
        return self.live.image or self.planned_image

    @property
    def grading_image(self) -> str:
        """The image grading sandboxes (and start() with no candidate sandbox) start
        from: the task's software's once provided, else the plan's."""
        return self.live.image or self.plan.image

    @property
    def sandbox(self) -> Sandbox:
        """The candidate's sandbox; only steps of phases after PROVISION ask for it."""
        assert self.live.sandbox is not None, "no sandbox before the provision phase"
        return self.live.sandbox


class RunExtension:
    """What a kind of task adds to the run at the points the phase table names.
    The plain run adds nothing."""

    computer: Computer | None = None  # the computer tool the agent's and start()'s tool boxes get

    async def sandbox_started(self, state: RunState) -> None:
        """PROVISION, once the sealed sandbox runs (before start())."""

    def grading_gui(self, state: RunState) -> Any:
        """What serves evaluate()'s GUI calls; None: the task has none."""
        return None
