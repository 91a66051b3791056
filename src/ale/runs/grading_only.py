"""A grading probe: a candidate's output graded as a run grades it, with no candidate sandbox.

``ale task check`` asks a task's grader what it makes of ~20 adversarial outputs
(and of the oracle's output without its reference). None of them needs a candidate
sandbox: the output is known in advance. A probe is a kind of the one run engine
(``RunKind.GRADING_PROBE``): the lifecycle's driver runs its steps as
``ale.phases.kind_steps`` lists them, the run's own steps but for the one it adds
(``write_output``), and ``grade_probe`` only finishes it (``probe.json``):

1. preflight (``lifecycle.prepare``: the task process, ``load()``, the variant, the
   image), the input staged from the data source (``stage_input``) and the task's
   software provided (``provide_software``: the image the grading sandbox starts from);
2. the task's ``start()`` when it has one: its input and reference writes land on the
   host as in a run; its commands run in a grading sandbox (no network, the input
   read-only), there being no candidate's;
3. the reference committed (``commit_reference``), then the output written straight
   into a fresh workspace folder on the host (the caller's ``write``);
4. the deliverables extracted from it (``collect_deliverables``: the same extraction,
   limits and manifest), the reference staged (``stage_reference``) and ``evaluate()``
   run in the task process with a fresh grading sandbox, retried as in a run
   (``grade_with_retries``); a failure is classified as the run's would be.

A probe is **not a run**: no candidate sandbox ran, nothing proves a seal, so its
folder (``<runs-dir>/.probes/<id>``) holds no ``result.json``, no manifest and no
signature (``ale verify`` refuses it; no report counts it) and its record is
``probe.json``, whose ``kind`` is ``grading-probe``. A desktop task's grader reads
the candidate's live desktop: ``GradingOnlyUnsupported``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ale
from ale import layout
from ale.layout import Evidence
from ale.phases import RunKind, RunShape
from ale.plan import AgentSpec, RunPlan, new_run_id
from ale.runs import lifecycle
from ale.runs.state import Prepared, RunFolder, RunState, now
from ale.sandbox.base import SandboxProvider
from ale.status import RunStatus
from ale.tasks.jail import task_network
from ale.tasks.process import TaskProcessPool, judge_env

KIND = "grading-probe"
PROBES_DIR = layout.PROBES_DIR
STALE_PROBE_S = 3600.0  # a probe folder untouched this long belongs to no running check
PROBE_RECORD = "probe.json"
NOT_A_RUN = ("a grading probe, not a run: the output was written on the host by the harness and graded as a run "
             "grades it; no candidate sandbox ran and no seal was proven, so nothing here is signed evidence")


class GradingOnlyUnsupported(RuntimeError):
    """The task cannot be graded without a candidate sandbox (its grader reads the live desktop)."""


@dataclass
class ProbeResult:
    """What a grading probe found. Not a ``RunResult``: it never goes where runs go."""

    probe_id: str
    probe_dir: Path
    task_id: str
    variant: int
    label: str
    status: RunStatus
    scores: list[float] | None
    score: float | None
    error: str | None
    violations: list[str] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    write_failures: list[str] = field(default_factory=list)  # ops of the output that failed, as a shell call would
    extra: dict[str, Any] = field(default_factory=dict)

    kind = KIND

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND, "note": NOT_A_RUN, "probe_id": self.probe_id, "task_id": self.task_id,
            "variant": self.variant,
            "label": self.label, "status": self.status.value, "scores": self.scores, "score": self.score,
            "error": self.error, "violations": self.violations, "stages": self.stages,
            "write_failures": self.write_failures, "harness_version": ale.__version__, **self.extra,
        }


class WarmProcesses:
    """The task processes a check's grading probes use: a ``TaskProcessPool`` per task
    folder (and network), so that each probe's task process is a fork of a warm one
    that has run ``load()``, not a new interpreter, jail and import (0.1-0.5 s each
    under load). Everything else of a probe's preflight is a run's
    (``lifecycle.prepare``). ``close()`` ends every warm process."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, bool], TaskProcessPool] = {}
        self._lock = asyncio.Lock()

    async def warm_up(self, plan: RunPlan, n: int) -> None:
        """Start ``n`` warm processes for ``plan``'s task now (while the oracle and nop
        run); a failure is left for the probes to meet, as they would."""
        with contextlib.suppress(Exception):
            await (await self._pool(plan)).warm_up(n)

    async def prepare(self, plan: RunPlan, provider: SandboxProvider | None) -> Prepared:
        """``lifecycle.prepare`` with a lent task process; raises ``PreflightError`` as it does."""
        return await lifecycle.prepare(plan, provider, process=(await self._pool(plan)).lend())

    async def _pool(self, plan: RunPlan) -> TaskProcessPool:
        card = lifecycle.check_card(plan)
        network = task_network(judge_env(names=plan.judge_env))
        key = (str(Path(plan.task_dir).resolve()), network)
        async with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                environment = await lifecycle.task_environment(plan)
                pool = self._pools[key] = TaskProcessPool(plan.task_dir, environment=environment, card=card,
                                                          network=network)
        return pool

    def counts(self) -> dict[str, int]:
        """How many warm processes were started and how many runs they served."""
        return {"spawned": sum(p.spawned for p in self._pools.values()),
                "lent": sum(p.lent for p in self._pools.values())}

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)


def probe_dir_for(plan: RunPlan, probe_id: str) -> Path:
    return Path(plan.runs_dir) / PROBES_DIR / probe_id


async def grade_probe(
    plan: RunPlan,
    write: Callable[[Path, Path, str], Any],
    label: str,
    *,
    provider: SandboxProvider | None = None,
    warm: WarmProcesses | None = None,
) -> ProbeResult:
    """Grade what ``write(workspace_host, input_host, input_digest)`` puts in a fresh
    workspace (``input_digest``: the public package's after start()), as
    the run of ``plan`` would grade it (see the module's docstring). ``write`` may
    raise to refuse (nothing is graded then; the exception propagates, the probe's
    folder is removed). Raises ``lifecycle.PreflightError`` as a run would, and
    ``GradingOnlyUnsupported`` for a desktop task. With ``warm``, the task process is
    a fork of a warm one (``WarmProcesses``), else one of its own as in a run."""
    probe_id = new_run_id(Path(plan.task_dir).name, plan.variant, f"probe-{label}")
    plan = plan.model_copy(update={"run_id": probe_id, "agent": AgentSpec(name="nop", label=f"probe:{label}")})
    t0 = time.monotonic()
    prep = await (lifecycle.prepare(plan, provider) if warm is None else warm.prepare(plan, provider))
    prepared_in = round(time.monotonic() - t0, 4)  # the task process and load(), the variant, the image
    if prep.shape is not RunShape.STANDARD:
        await prep.process.close()
        raise GradingOnlyUnsupported(f"{plan.task_dir}: a {prep.shape} task's grader reads the candidate's "
                                     "live desktop")
    probe_dir = probe_dir_for(plan, probe_id)
    probe_dir.mkdir(parents=True)
    prep.process.log_path = probe_dir / layout.TASK_LOG
    scratch = layout.scratch_dir(plan.runs_dir, probe_id)
    # no evidence: nothing here is fsynced (a probe's 20-odd fsyncs would stall the others' event loop)
    state = lifecycle.new_state(prep, RunFolder(probe_dir, scratch, prep.variant), probe_dir,
                                kind=RunKind.GRADING_PROBE, durable=False)
    record = state.record
    stages: dict[str, float] = {"prepare": prepared_in}
    started = now()
    status, error = RunStatus.INFRASTRUCTURE_ERROR, None
    extra: dict[str, Any] = {}
    failures: list[str] = []
    refused: BaseException | None = None

    async def write_output(state: RunState) -> None:
        nonlocal failures, refused
        assert record.input_after_start is not None  # the hash_input step's
        try:
            failures = list(await asyncio.to_thread(write, state.folder.workspace_host, state.folder.input_host,
                                                    record.input_after_start["digest"]) or [])
        except Exception as e:  # the caller's refusal: nothing to grade
            refused = e
            raise
        record.events.append("probe.output_written", failures=failures[:20])
        state.live.agent_started = True  # from here on, what fails is graded as in a run after the agent's turn

    record.events.append("probe.start", probe_id=probe_id, kind=KIND, label=label, note=NOT_A_RUN)
    try:
        lifecycle.make_dirs(state)
        await lifecycle.drive(state, {"write_output": write_output}, stages=stages)
        status = RunStatus.SCORED
    except Exception as e:
        if refused is None:
            status, error, extra = lifecycle.classify_failure(e, state)  # a run's own classification
            record.scores = None
    finally:
        await lifecycle.cleanup(state)
    if refused is not None:
        _remove(probe_dir)
        raise refused
    scores = record.scores
    result = ProbeResult(
        probe_id=probe_id, probe_dir=probe_dir, task_id=prep.variant.task_id, variant=prep.variant.index, label=label,
        status=status, scores=scores, score=(sum(scores) / len(scores)) if scores else None, error=error,
        violations=list(record.violations), stages=stages, write_failures=failures,
        extra={**extra, "started_at": started.isoformat(), "ended_at": now().isoformat(),
               "task_code_sha256": prep.task.code_hash},
    )
    record.store.write_json(Evidence.PHASES, [p.model_dump(mode="json") for p in record.phases])
    record.events.append("probe.end", status=status.value, score=result.score)
    (probe_dir / PROBE_RECORD).write_text(json.dumps(result.to_dict(), indent=1, default=str))
    return result


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def prune_stale_probes(runs_dir: Path, *, older_than_s: float = STALE_PROBE_S) -> list[Path]:
    """Remove the probe folders under ``runs_dir/.probes`` a killed check left behind
    (their staged input and reference included): those not modified for ``older_than_s``,
    so that a check running now keeps its own. Returns the folders removed."""
    root = Path(runs_dir) / PROBES_DIR
    if not root.is_dir() or root.is_symlink():
        return []
    cutoff = time.time() - older_than_s
    removed = []
    for entry in sorted(root.iterdir()):
        try:
            if entry.is_symlink() or not entry.is_dir() or entry.stat().st_mtime > cutoff:
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    return removed
