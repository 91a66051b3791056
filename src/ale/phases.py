"""The run's phases, declared once: what each runs, the evidence it writes, the
checks that follow it.

``ale.runs.lifecycle`` executes this table (one step function per phase, one
failure classifier) and ``ale verify`` (``ale.record.verify``) derives from it
what a run folder must hold, which check groups ``checks.json`` must record and
in which order the run's moments happened. Read ``PHASES`` to know a run.

A run has one of three shapes (``RunShape``): in the ``standard`` shape the
candidate's sandbox is stopped, inspected and removed before the reference is
staged; a ``live_grading`` run (a desktop task, whose grader reads the live
window) keeps the sandbox, still sealed, with every candidate process killed,
until ``evaluate()`` ends, and stops, inspects and removes it then; a ``vm`` run
(the qemu provider) is a standard one whose seal is read from QEMU itself (QMP)
and from probes in its guest, before the agent and after its turn, while the VM
still runs (``ale.runs.vm_seal``), instead of from the engine's inspect.

Moments are spelled one way: ``before`` (the agent's first step), ``after``
(the agent's turn ended and its processes are dead).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ale.layout import (
    DELIVERABLES,
    EVENTS,
    PLAN,
    RESULT,
    Agent,
    Evidence,
    agent_path,
    evidence_path,
)


class Phase(StrEnum):
    """The lifecycle's phases, in order; ``phases.json`` and ``result.json`` name them."""

    STAGE_INPUT = "stage_input"
    PROVISION = "provision"
    TASK_START = "task_start"
    VERIFY_BEFORE = "verify_before"
    AGENT = "agent"
    STOP = "stop"
    DELIVERABLES = "deliverables"
    GRADE = "grade"


class RunShape(StrEnum):
    STANDARD = "standard"
    LIVE_GRADING = "live_grading"
    VM = "vm"  # the qemu provider: QEMU's own description and the guest's probes (ale.isolation.vm_rules)


class CheckGroup(StrEnum):
    """The groups checks are recorded under (``checks.json``'s ``phase`` field, the
    ``[group]`` of a violation line)."""

    INSPECT_BEFORE = "inspect-before"
    PROBES_BEFORE = "probes-before"
    AGENT_START = "agent-start"  # the workspace still empty, the public package without reference
    AGENT = "agent"  # the model gateway's record
    PROBES_AFTER = "probes-after"
    INSPECT_AFTER = "inspect-after"
    AFTER_RUN = "after-run"  # the input unchanged by the run
    AFTER_AGENT = "after-agent"  # the run's own checks could not be completed once the agent started
    WORKSPACE_AT_CREATION = "workspace-at-creation"  # ale verify: the workspace's listing when created
    WORKSPACE_AT_AGENT_START = "workspace-at-agent-start"  # ... and when the agent started
    VM_BEFORE = "vm-before"  # a VM's capture before the agent (ale.isolation.vm_rules)
    VM_PROBES_BEFORE = "vm-probes-before"  # the probes in its guest before the agent
    VM_PROBES_AFTER = "vm-probes-after"
    VM_AFTER = "vm-after"  # its capture after the agent, and the two captures together


# Check groups whose evidence file, when present, obliges checks.json to record them.
GROUP_EVIDENCE: dict[CheckGroup, str] = {
    CheckGroup.INSPECT_BEFORE: evidence_path(Evidence.INSPECT_BEFORE),
    CheckGroup.INSPECT_AFTER: evidence_path(Evidence.INSPECT_AFTER),
    CheckGroup.PROBES_BEFORE: evidence_path(Evidence.probes("before")),
    CheckGroup.PROBES_AFTER: evidence_path(Evidence.probes("after")),
}
# The same for a VM run's evidence (a VM provider records these groups; the phase table
# names the container's).
VM_GROUP_EVIDENCE: dict[CheckGroup, str] = {
    CheckGroup.VM_BEFORE: evidence_path(Evidence.VM_BEFORE),
    CheckGroup.VM_AFTER: evidence_path(Evidence.VM_AFTER),
    CheckGroup.VM_PROBES_BEFORE: evidence_path(Evidence.vm_probes("before")),
    CheckGroup.VM_PROBES_AFTER: evidence_path(Evidence.vm_probes("after")),
}


@dataclass(frozen=True)
class PhaseSpec:
    """One row of the table.

    - ``runs``: what the phase does, in the words the docs use;
    - ``opens_with``: evidence written as the phase opens, before anything in it can fail;
    - ``writes``: evidence the phase has written once it completed;
    - ``records``: evidence it writes that older run folders may lack (checked for
      its shape when present, never required);
    - ``checks``: the check groups it records;
    - ``gate``: any violation recorded so far ends the run when the phase completes;
    - ``releases_sandbox``: the candidate's sandbox is stopped, inspected (after) and
      removed in this phase (at its end, whatever happened in it).
    """

    phase: Phase
    runs: str
    opens_with: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    records: tuple[str, ...] = ()
    checks: tuple[CheckGroup, ...] = ()
    gate: bool = False
    releases_sandbox: bool = False


# Written at the run's start (``opens``) and at its end, whatever the outcome.
RUN_OPENS_WITH = (PLAN, evidence_path(Evidence.POLICY), evidence_path(Evidence.HARNESS), evidence_path(Evidence.ENGINE))
RUN_CLOSES_WITH = (RESULT, EVENTS, evidence_path(Evidence.PHASES), evidence_path(Evidence.CHECKS))

_STOP_RUNS = ("end the turn from the host (freeze the sandbox, kill every candidate task from outside, thaw; bounded), "
              "then the probes (after) as a uid the candidate never had")
_RELEASE_RUNS = "stop the sandbox, inspect it (after), diff with the capture before, remove it"
_RELEASE_WRITES = (evidence_path(Evidence.INSPECT_AFTER),)


def _table(shape: RunShape) -> tuple[PhaseSpec, ...]:
    if shape is RunShape.VM:
        return _vm_table()
    live = shape is RunShape.LIVE_GRADING
    return (
        PhaseSpec(Phase.STAGE_INPUT,
                  "stage the public package (input, software) into the run's scratch; the reference is not touched",
                  records=(evidence_path(Evidence.INPUT_STAGED),)),
        PhaseSpec(Phase.PROVISION, "provide the task's software (its environment image, built on first use), "
                  "create the sandbox from it, inspect it (before), start it"
                  + (", start its desktop" if live else ""),
                  writes=(evidence_path(Evidence.MOUNTS), evidence_path(Evidence.INSPECT_BEFORE),
                          evidence_path(Evidence.IMAGE)),
                  records=(evidence_path(Evidence.ENVIRONMENT),),
                  checks=(CheckGroup.INSPECT_BEFORE,)),
        PhaseSpec(Phase.TASK_START, "the task's start(cfg, session); its input and reference writes land on the host"
                  + ("; the screen recorded" if live else ""),
                  records=(evidence_path(Evidence.screen("after_start")),) if live else ()),
        PhaseSpec(Phase.VERIFY_BEFORE,
                  "the probes (before), hash the input, prove the workspace empty, commit the reference",
                  writes=(evidence_path(Evidence.probes("before")), evidence_path(Evidence.INPUT_AFTER_START),
                          evidence_path(Evidence.WORKSPACE_EMPTY), evidence_path(Evidence.REFERENCE_COMMIT)),
                  records=(evidence_path(Evidence.START_WRITES),),
                  checks=(CheckGroup.PROBES_BEFORE, CheckGroup.AGENT_START), gate=True),
        PhaseSpec(Phase.AGENT,
                  "the agent's turn, bounded by its wall time and the workspace's limits; the model gateway's record"
                  + ("; the screen recorded at its end, before the kill" if live else ""),
                  opens_with=(evidence_path(Evidence.AGENT), evidence_path(Evidence.NETWORK)),
                  records=(agent_path(Agent.PROMPT),) + ((evidence_path(Evidence.screen("end_of_turn")),
                                                          evidence_path(Evidence.SCREENS)) if live else ()),
                  checks=(CheckGroup.AGENT,)),
        PhaseSpec(Phase.STOP,
                  _STOP_RUNS if live
                  else f"{_STOP_RUNS}; {_RELEASE_RUNS} (kept for the GRADE phase in a live_grading run)",
                  writes=(evidence_path(Evidence.probes("after")),) + (() if live else _RELEASE_WRITES),
                  records=(evidence_path(Evidence.STOP), evidence_path(Evidence.SANDBOX_STOPPED)),
                  checks=(CheckGroup.PROBES_AFTER,) + (() if live else (CheckGroup.INSPECT_AFTER,)),
                  releases_sandbox=not live),
        PhaseSpec(Phase.DELIVERABLES, "copy the workspace's regular files out, check the input unchanged",
                  writes=(DELIVERABLES, evidence_path(Evidence.INPUT_AFTER_RUN)),
                  checks=(CheckGroup.AFTER_RUN,), gate=True),
        PhaseSpec(Phase.GRADE,
                  "stage the reference (trusted side), evaluate() in the task process, its commands in "
                  "a grading sandbox"
                  + (f"; then {_RELEASE_RUNS}" if live else ""),
                  writes=(evidence_path(Evidence.REFERENCE_CHECK),) + (_RELEASE_WRITES if live else ()),
                  records=(evidence_path(Evidence.GRADING_ATTEMPTS),),
                  checks=(CheckGroup.INSPECT_AFTER,) if live else (),
                  releases_sandbox=live),
    )


_VM_WRITES_BEFORE = (evidence_path(Evidence.VM_EXPECTATION), evidence_path(Evidence.VM_BEFORE),
                     evidence_path(Evidence.vm_probes("before")))
_VM_WRITES_AFTER = (evidence_path(Evidence.vm_probes("after")), evidence_path(Evidence.VM_AFTER))


def _vm_table() -> tuple[PhaseSpec, ...]:
    """The standard table with the VM's evidence in place of the container's: nothing is
    judged at creation (no QEMU runs yet); before the agent, QEMU's description (QMP)
    and the guest's probes; after its turn, the same while the VM still runs, and the
    two captures together; then QEMU is quit and the VM's overlay removed."""
    std = {s.phase: s for s in _table(RunShape.STANDARD)}
    return (
        std[Phase.STAGE_INPUT],
        PhaseSpec(Phase.PROVISION, "create the VM (a fresh qcow2 overlay on the read-only base, the public input and "
                  "the workspace as its only shares, no network device), boot it",
                  writes=(evidence_path(Evidence.MOUNTS), evidence_path(Evidence.IMAGE)),
                  records=(evidence_path(Evidence.ENVIRONMENT),)),
        std[Phase.TASK_START],
        PhaseSpec(Phase.VERIFY_BEFORE, "QEMU's description of the VM (QMP) and the probes in its guest (before), "
                  "hash the input, prove the workspace empty, commit the reference",
                  writes=(*_VM_WRITES_BEFORE, evidence_path(Evidence.INPUT_AFTER_START),
                          evidence_path(Evidence.WORKSPACE_EMPTY), evidence_path(Evidence.REFERENCE_COMMIT)),
                  records=(evidence_path(Evidence.START_WRITES),),
                  checks=(CheckGroup.VM_BEFORE, CheckGroup.VM_PROBES_BEFORE, CheckGroup.AGENT_START), gate=True),
        std[Phase.AGENT],
        PhaseSpec(Phase.STOP, "end the turn from outside the candidate's reach (the guest's root agent kills every "
                  "candidate process; QMP stop and quit if it does not answer; bounded), then the probes (after) as a "
                  "uid the candidate never had and QEMU's description again, diffed with the one before; quit QEMU, "
                  "remove the overlay",
                  writes=_VM_WRITES_AFTER,
                  records=(evidence_path(Evidence.STOP), evidence_path(Evidence.SANDBOX_STOPPED)),
                  checks=(CheckGroup.VM_PROBES_AFTER, CheckGroup.VM_AFTER), releases_sandbox=True),
        std[Phase.DELIVERABLES],
        std[Phase.GRADE],
    )


PHASES: dict[RunShape, tuple[PhaseSpec, ...]] = {shape: _table(shape) for shape in RunShape}


def phase_table(shape: RunShape | str = RunShape.STANDARD) -> tuple[PhaseSpec, ...]:
    return PHASES[RunShape(shape)]


def spec_of(phase: Phase | str, shape: RunShape | str = RunShape.STANDARD) -> PhaseSpec:
    return next(s for s in phase_table(shape) if s.phase == phase)


class RunKind(StrEnum):
    """What a run-like thing is. One driver (``ale.runs.lifecycle.drive``) runs each
    kind's steps (``kind_steps``); what differs between kinds is this table and a
    small finisher of each kind's own (its record, its classification of a failure)."""

    RUN = "run"  # a candidate's run: the phase table of its shape
    GRADING_PROBE = "grading-probe"  # ``ale task check``: an output written on the host, graded as a run grades it
    REGRADE = "regrade"  # ``ale regrade``: a finished run's signed deliverables graded again


# A step that runs only when the task defines start() and its writes were not laid
# from a run's record (``KindStep.when``).
WHEN_START = "start"


@dataclass(frozen=True)
class KindStep:
    """One step of a kind: the step's name in the driver's library (a run's phases
    are named by their ``Phase``'s value), the phase ``phases.json`` records it as
    (None: not a phase of its own), the name its time is kept under (default its
    step's), and a condition (``WHEN_START``)."""

    step: str
    phase: Phase | None = None
    stage: str | None = None
    when: str | None = None
    gate: bool = False
    releases_sandbox: bool = False

    @property
    def timed_as(self) -> str:
        return self.stage or self.step


_GRADING_KINDS: dict[RunKind, tuple[KindStep, ...]] = {
    # a grading probe: no candidate sandbox; start() in a grading sandbox, the output written on the host
    RunKind.GRADING_PROBE: (
        KindStep("stage_input", Phase.STAGE_INPUT),
        KindStep("provide_software", stage="software"),
        KindStep("start_in_grading_sandbox", Phase.TASK_START, stage="task_start", when=WHEN_START),
        KindStep("hash_input", stage="commit_reference"),
        KindStep("commit_reference"),
        KindStep("write_output"),  # the probe's own: the caller writes the output
        KindStep("collect_deliverables", Phase.DELIVERABLES, stage="deliverables"),
        KindStep(Phase.GRADE.value, Phase.GRADE),
    ),
    # a regrade: the input staged again, start()'s writes laid from the run's record
    # (or start() run again in a grading sandbox), both commitments compared with the
    # run's, then the run's grading over its signed deliverables
    RunKind.REGRADE: (
        KindStep("stage_input"),
        KindStep("apply_start_writes"),  # the regrade's own
        KindStep("start_in_grading_sandbox", when=WHEN_START),
        KindStep("compare_input"),  # the regrade's own
        KindStep("commit_reference"),
        KindStep("compare_reference"),  # the regrade's own
        KindStep("stage_reference"),
        KindStep("grade_with_retries"),
    ),
}


def kind_steps(kind: RunKind, shape: RunShape | str = RunShape.STANDARD) -> tuple[KindStep, ...]:
    """The steps of ``kind`` in order: a run's are its shape's phase table."""
    if kind is RunKind.RUN:
        return tuple(KindStep(s.phase.value, s.phase, gate=s.gate, releases_sandbox=s.releases_sandbox)
                     for s in phase_table(shape))
    return _GRADING_KINDS[kind]


# The run's moments in the order the evidence must show them (``ale verify``'s
# ``times.order``): the sandbox's life from its inspect captures, the end of the
# candidate's turn from phases.json, the reference's unpacking from its check.
CREATED, STARTED, CANDIDATE_KILLED, FINISHED, REFERENCE_UNPACKED = (
    "container created", "container started", "candidate processes killed", "container finished", "reference unpacked")


def moment_order(shape: RunShape | str) -> tuple[str, ...]:
    if RunShape(shape) is RunShape.LIVE_GRADING:
        return (CREATED, STARTED, CANDIDATE_KILLED, REFERENCE_UNPACKED, FINISHED)
    return (CREATED, STARTED, FINISHED, REFERENCE_UNPACKED)


# Evidence that stands in for another: a sandbox the candidate brought down during its
# turn cannot be probed after it; its stopped state is recorded instead.
STANDS_IN_FOR: dict[str, str] = {
    evidence_path(Evidence.probes("after")): evidence_path(Evidence.SANDBOX_STOPPED),
    evidence_path(Evidence.vm_probes("after")): evidence_path(Evidence.SANDBOX_STOPPED),
    evidence_path(Evidence.VM_AFTER): evidence_path(Evidence.SANDBOX_STOPPED),
}


def required_evidence(shape: RunShape | str, reached: set[str], *, graded: bool) -> tuple[str, ...]:
    """What a run folder must hold, given the phases ``phases.json`` records as
    reached: the run's own records, everything each phase before the last reached
    one wrote, what the last one wrote as it opened; all of it for a graded run."""
    table = phase_table(shape)
    out = list(RUN_OPENS_WITH + RUN_CLOSES_WITH)
    last = max((i for i, s in enumerate(table) if s.phase in reached), default=-1)
    for i, spec in enumerate(table):
        if graded or i < last:
            out += spec.opens_with + spec.writes
        elif i == last:
            out += spec.opens_with
    return tuple(dict.fromkeys(out))


def phase_evidence(shape: RunShape | str = RunShape.STANDARD) -> tuple[str, ...]:
    """Every evidence file some phase writes, in table order."""
    return tuple(dict.fromkeys(f for s in phase_table(shape) for f in s.opens_with + s.writes + s.records))
