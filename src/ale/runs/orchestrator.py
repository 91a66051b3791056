"""Run an experiment: bounded, ramping concurrency; retries; resume; clean stops.

One asyncio process runs every unit of an experiment (see ``experiment.py``):

- **Concurrency** starts at ``min(2, N)`` slots and gains one slot each time a
  run is seen to start well (it is still going ``ramp_after_s`` later, or it
  ended with anything but an infrastructure error), up to N. An infrastructure
  error takes a slot away again (never below one): Docker degrades when pushed.
- **Retries**: only ``infrastructure_error`` is retried, as a new attempt (its own
  run id ``<unit>-a<n>`` and folder), after an exponential backoff, up to
  ``retry.max_attempts``. Agent failures, timeouts, grading failures and invalid
  runs are final.
- **Resume**: a unit whose latest attempt has a final ``result.json`` is skipped.
  ``<output>/experiment.json`` keeps the experiment's content hash; a changed
  experiment is refused unless ``allow_changed``.
- **Reconcile** at start (after a SIGKILL): containers labelled with the
  experiment are removed; run folders without ``result.json`` are moved to
  ``<output>/.incomplete/`` and that attempt is run again: from turn 1, or with
  ``resume_turns`` (``ale exp run --resume-turns``) from the interrupted folder's
  gateway record (``reconcile.interrupted_source``; ale.agents.gateway.resume).
- **Stop** (SIGINT/SIGTERM): nothing new is launched, in-flight runs are
  cancelled (the lifecycle removes their containers on cancellation), then every
  container labelled with the experiment is removed. A second signal stops
  waiting for the grace period.

This module owns scheduling and the retry policy; the experiment record and
the output lock are ``exp_record.py``'s, crash reconcile and resume are
``reconcile.py``'s, and progress display is ``progress.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ale
from ale import layout
from ale.plan import RunPlan
from ale.result import RunResult, reason_line
from ale.runs.cluster import resolve_cluster
from ale.runs.exp_record import (
    OutputLock,
    unit_info,
    write_experiment_record,
)
from ale.runs.experiment import Experiment, PlannedUnit, plan_units
from ale.runs.images import ensure_images, images_for
from ale.runs.lifecycle import execute_run
from ale.runs.progress import NullProgress, ProgressSink, ProgressState
from ale.runs.reconcile import Janitor, UnitState, interrupted_source, reconcile, resume_states
from ale.runs.store import RunIndex, runs_root
from ale.sandbox.base import SandboxProvider
from ale.sandbox.providers import make_provider
from ale.status import RunStatus

Runner = Callable[[RunPlan, asyncio.Event], Awaitable[RunResult]]



# -- the default runner and janitor (a sandbox provider) ----------------------


def provider_runner(provider: SandboxProvider | None = None) -> Runner:
    """The lifecycle's ``execute_run`` as a Runner, sharing one provider."""

    async def run(plan: RunPlan, cancel: asyncio.Event) -> RunResult:
        return await execute_run(plan, provider=provider)

    return run


def provider_janitor(provider: SandboxProvider) -> Janitor:
    """Removes the sandboxes labelled with one experiment, nothing else."""

    def clean(experiment: str) -> list[str]:
        return provider.remove_managed(experiment=experiment)

    return clean


# -- the orchestrator ---------------------------------------------------------


@dataclass
class OrchestratorSummary:
    output: Path
    total: int
    skipped: int
    executed: int  # attempts run in this session
    retried: int
    interrupted: bool
    incomplete_moved: list[str]
    orphans_removed: list[str]
    statuses: dict[str, int]

    @property
    def all_final(self) -> bool:
        return sum(self.statuses.values()) == self.total


@dataclass
class _Schedule:
    """One session's scheduling state: the units, what waits, what runs, the slots."""

    states: list[UnitState]
    index: RunIndex
    progress: ProgressState
    changed: asyncio.Event  # set when a slot, a requeued unit or a stop may let the loop act
    slots: int
    pending: deque[UnitState]
    in_flight: dict[asyncio.Task[RunResult], tuple[UnitState, int]] = field(default_factory=dict)
    delayed: set[asyncio.Task[None]] = field(default_factory=set)  # retries waiting out their backoff
    ramp_timers: set[asyncio.Task[None]] = field(default_factory=set)
    ramped: set[str] = field(default_factory=set)  # runs that already earned a slot
    executed: int = 0
    retried: int = 0
    stop_deadline: float | None = None


class Orchestrator:
    def __init__(
        self,
        exp: Experiment,
        *,
        runner: Runner | None = None,
        janitor: Janitor | None = None,
        progress: ProgressSink | None = None,
        concurrency: int | None = None,
        allow_changed: bool = False,
        ramp_start: int = 2,
        ramp_after_s: float = 1.0,
        stop_grace_s: float = 60.0,
        units: list[PlannedUnit] | None = None,
        cluster: str | None = None,
        retry_errors: bool = False,
        resume_turns: bool = False,
    ):
        self.exp = exp
        self.retry_errors = retry_errors
        self.resume_turns = resume_turns
        self.units = units if units is not None else plan_units(exp)
        self.output = exp.output_dir
        self.concurrency = concurrency or exp.concurrency
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        self.allow_changed = allow_changed
        self.ramp_start = max(1, min(ramp_start, self.concurrency))
        self.ramp_after_s = ramp_after_s
        self.stop_grace_s = stop_grace_s
        self._provider: SandboxProvider | None = None
        self._cluster: Any = None
        # Where attempts run: --cluster, else ALE_CLUSTER, else the file's, else local.
        self.cluster = resolve_cluster(cluster, exp.environment.cluster)
        if (runner is None or janitor is None) and self.cluster.kind == "ray":
            from ale.runs.cluster import connect

            self._cluster = connect(self.cluster, self.output)
            runner = runner or self._cluster.run
            janitor = janitor or self._cluster.janitor
        if runner is None or janitor is None:
            self._provider = make_provider(exp.environment.provider)
        self.runner = runner or provider_runner(self._provider)
        self.janitor = janitor or provider_janitor(self._provider)  # type: ignore[arg-type]
        self.progress: ProgressSink = progress or NullProgress()
        self.cancel = asyncio.Event()
        self._stop_requests = 0
        self._handled: list[signal.Signals] = []  # signals this run handles (install_signal_handlers)
        self._changed: asyncio.Event | None = None
        self._lock = OutputLock(self.output)
        # Observed by tests and the bench: the largest number of runs in flight.
        self.max_in_flight = 0

    # -- stop ----------------------------------------------------------------
    def request_stop(self) -> None:
        """First call: launch nothing more and cancel in-flight runs. Second: hurry."""
        self._stop_requests += 1
        self.cancel.set()
        if self._changed is not None:
            self._changed.set()

    @property
    def stopping(self) -> bool:
        return self._stop_requests > 0

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_IGN:  # `nohup ale exp run`: SIGHUP stays ignored
                continue
            self._handled.append(sig)
            loop.add_signal_handler(sig, self.request_stop)

    def remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._handled:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        self._handled = []

    # -- preparation ---------------------------------------------------------
    # -- running -------------------------------------------------------------
    async def run(self) -> OrchestratorSummary:
        self._lock.acquire()
        try:
            return await self._run_locked()
        finally:
            self._lock.release()
            if self._cluster is not None:
                self._cluster.close()

    async def _run_locked(self) -> OrchestratorSummary:
        states, index, orphans, moved = await self._prepare()
        progress = self._start_progress(states)
        await self._build_images(states, progress)
        if moved:
            self.progress.update(
                progress, f"moved {len(moved)} interrupted run folder(s) to {layout.INCOMPLETE_DIR}/; redoing them")
        if orphans:
            self.progress.update(progress, f"removed {len(orphans)} orphan container(s)")
        s = _Schedule(states, index, progress, changed=asyncio.Event(), slots=self.ramp_start,
                      pending=deque(st for st in states if st.final is None))
        self._changed = s.changed
        try:
            await self._schedule(s)
        finally:
            await self._wind_down(s)
        return self._summary(s, orphans, moved)

    async def _prepare(self) -> tuple[list[UnitState], RunIndex, list[str], list[str]]:
        """The session's worker threads, the experiment record, the reconcile after a
        crash (its orphans removed, its unfinished folders moved) and each unit's state."""
        # Each run in flight holds worker threads for its blocking calls (an exec's
        # output stream for as long as the command runs, a package build, a hash):
        # the loop's default pool (CPUs + 4, at most 32) would queue one run's engine
        # calls behind another run's hashing, and deadlock past 32 long commands.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=max(32, 4 * self.concurrency + 8), thread_name_prefix="ale-run"))
        write_experiment_record(self.exp, self.units, self.output, allow_changed=self.allow_changed)
        orphans, moved = await asyncio.to_thread(reconcile, self.output, self.exp.name, self.janitor)
        runs_root(self.output).mkdir(parents=True, exist_ok=True)
        index = RunIndex(self.output)
        states = await asyncio.to_thread(resume_states, self.units, self.output, index, self.exp.retry.max_attempts,
                                       retry_errors=self.retry_errors)
        return states, index, orphans, moved

    def _start_progress(self, states: list[UnitState]) -> ProgressState:
        """The progress display, started with the units an earlier session finished."""
        progress = ProgressState(total=len(states))
        for st in states:
            if st.final is not None:
                progress.count_final(st.final)
        progress.skipped = progress.done
        progress.slots = self.ramp_start
        self.progress.start(progress)
        return progress

    async def _build_images(self, states: list[UnitState], progress: ProgressState) -> None:
        """Runs on this engine: build the images the units still to run need, first."""
        if self._provider is None:
            return
        plans = [st.unit.plan for st in states if st.final is None]
        try:
            say = lambda m: self.progress.update(progress, m)  # noqa: E731
            if getattr(self._provider, "name", "docker") == "qemu":  # ale's VM guest (ale image build --vm)
                from ale.sandbox.qemu.image import ensure_vm_images

                await asyncio.to_thread(ensure_vm_images, [p.image for p in plans], say)
            else:
                await asyncio.to_thread(ensure_images, images_for(plans), say)
        except BaseException:
            self.progress.stop(progress)
            raise

    async def _schedule(self, s: _Schedule) -> None:
        """Launch pending units into the free slots and take each run that ends, until
        every unit is final or waits for a later session; on a stop, cancel and wait
        for the runs in flight up to the grace period."""
        while s.pending or s.in_flight or s.delayed:
            if self.stopping:
                if s.stop_deadline is None:
                    self._begin_stop(s)
                if not s.in_flight:
                    break
            else:
                while s.pending and len(s.in_flight) < s.slots:
                    self._launch(s, s.pending.popleft())
            done = await self._wait(s)
            if s.stop_deadline is not None and time.monotonic() >= s.stop_deadline and s.in_flight:
                # The runs did not end within the grace period: leave them.
                break
            for task in [t for t in done if t in s.in_flight]:
                self._take(s, task)
            for task in [t for t in done if t in s.delayed]:
                s.delayed.discard(task)

    def _begin_stop(self, s: _Schedule) -> None:
        """The first pass after a stop request: launch nothing more, cancel the rest."""
        s.stop_deadline = time.monotonic() + self.stop_grace_s
        s.progress.stopping = True
        s.pending.clear()
        for d in list(s.delayed):
            d.cancel()
        # The lifecycle ends a run on task cancellation (its cleanup
        # is shielded); the cancel event tells runners that watch it.
        for t in s.in_flight:
            t.cancel()
        self.progress.update(s.progress, f"stopping: cancelling {len(s.in_flight)} in-flight run(s)")

    def _launch(self, s: _Schedule, st: UnitState) -> None:
        """Start the unit's next attempt (resumed from its interrupted one's turns when
        asked), with the timer that grows the slots if it is still running later."""
        attempt = st.next_attempt
        plan = st.unit.plan_for(attempt)
        source = interrupted_source(self.output, plan.run_id) if self.resume_turns else None
        if source is not None:  # continues from the interrupted attempt's gateway record
            plan = plan.model_copy(update={"resume_from": str(source)})
            self.progress.update(
                s.progress, f"{plan.run_id}: resuming from {source.name} (its recorded model turns replayed)")
        task = asyncio.create_task(self._attempt(plan), name=plan.run_id)
        s.in_flight[task] = (st, attempt)
        s.executed += 1
        self.max_in_flight = max(self.max_in_flight, len(s.in_flight))
        s.progress.running = len(s.in_flight)
        timer = asyncio.create_task(self._ramp_timer(s, task))
        s.ramp_timers.add(timer)
        timer.add_done_callback(s.ramp_timers.discard)

    async def _wait(self, s: _Schedule) -> set[asyncio.Future[Any]]:
        """Until a run ends, a delayed retry is due, something changed (a slot, a
        stop) or the stop's grace period is over: what ended."""
        s.changed.clear()
        waiters: set[asyncio.Future[Any]] = set(s.in_flight) | set(s.delayed)
        change_waiter = asyncio.ensure_future(s.changed.wait())
        waiters.add(change_waiter)
        timeout = None
        if s.stop_deadline is not None:
            timeout = max(0.0, s.stop_deadline - time.monotonic())
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not change_waiter.done():
            change_waiter.cancel()
        return done

    def _take(self, s: _Schedule, task: asyncio.Task[RunResult]) -> None:
        """A run that ended: recorded in the index, then retried later (an error worth
        another attempt) or final."""
        st, attempt = s.in_flight.pop(task)
        s.progress.running = len(s.in_flight)
        if task.cancelled():
            self.progress.update(s.progress, f"{task.get_name()}: cancelled")
            return
        exc = task.exception()
        if exc is not None:  # _attempt turns runner errors into results
            raise exc
        result = task.result()
        s.index.record(result, unit_info(st.unit), runs_root(self.output) / result.run_id)
        status = RunStatus(result.status)
        retryable = result.retryable
        if retryable and attempt < self.exp.retry.max_attempts and not self.stopping:
            self._retry_later(s, st, attempt, result)
            return
        if retryable and attempt < self.exp.retry.max_attempts:
            # Stopping: leave the retry for the next start.
            return
        st.final = result
        s.progress.count_final(result)
        s.progress.finished_this_session += 1
        if result.run_id not in s.ramped:
            s.ramped.add(result.run_id)
            self._grow(s, status is not RunStatus.INFRASTRUCTURE_ERROR)
        score = "-" if result.score is None else f"{result.score:.3f}"
        why = reason_line(result)
        self.progress.update(s.progress, f"{result.run_id}: {status.value} score={score}"
                             + (f"  ({why})" if why else ""))

    def _retry_later(self, s: _Schedule, st: UnitState, attempt: int, result: RunResult) -> None:
        """The unit's next attempt after an exponential backoff, with one slot fewer."""
        st.next_attempt = attempt + 1
        s.retried += 1
        s.progress.retries += 1
        if s.slots > 1:
            s.slots -= 1
            s.progress.slots = s.slots
        delay = min(
            self.exp.retry.backoff_max_s,
            self.exp.retry.backoff_initial_s * (2 ** (attempt - 1)),
        )
        d = asyncio.create_task(self._requeue_later(s, st, delay))
        s.delayed.add(d)
        d.add_done_callback(s.delayed.discard)
        self.progress.update(
            s.progress,
            f"{result.run_id}: {RunStatus(result.status).value} ({_short(result.error)}); "
            f"attempt {attempt + 1} in {delay:.1f}s",
        )

    def _grow(self, s: _Schedule, reason_ok: bool) -> None:
        if reason_ok and s.slots < self.concurrency:
            s.slots += 1
            s.progress.slots = s.slots
            s.changed.set()

    async def _ramp_timer(self, s: _Schedule, task: asyncio.Task[RunResult]) -> None:
        await asyncio.sleep(self.ramp_after_s)
        if not task.done() and task.get_name() not in s.ramped:
            s.ramped.add(task.get_name())
            self._grow(s, True)

    async def _requeue_later(self, s: _Schedule, st: UnitState, delay: float) -> None:
        await asyncio.sleep(delay)
        if not self.stopping:
            s.pending.appendleft(st)
            s.changed.set()

    async def _wind_down(self, s: _Schedule) -> None:
        """However the schedule ended: cancel what is left, remove what the runs left
        (a crash, a cancelled run), stop the progress display."""
        pending_tasks: list[asyncio.Task[Any]] = [*s.in_flight, *s.delayed, *s.ramp_timers]
        for t in pending_tasks:
            t.cancel()
        if s.in_flight:
            await asyncio.wait(list(s.in_flight), timeout=30)
        for timer in s.ramp_timers:
            timer.cancel()
        s.progress.running = 0
        # Whatever the runs left (a crash, a cancelled run): remove it.
        with contextlib.suppress(Exception):
            leftovers = await asyncio.to_thread(self.janitor, self.exp.name)
            if leftovers:
                self.progress.update(s.progress, f"removed {len(leftovers)} leftover container(s)")
        self.progress.stop(s.progress)
        self._changed = None

    def _summary(self, s: _Schedule, orphans: list[str], moved: list[str]) -> OrchestratorSummary:
        statuses: dict[str, int] = {}
        for st in s.states:
            if st.final is not None:
                key = str(RunStatus(st.final.status))
                statuses[key] = statuses.get(key, 0) + 1
        return OrchestratorSummary(
            output=self.output,
            total=len(s.states),
            skipped=s.progress.skipped,
            executed=s.executed,
            retried=s.retried,
            interrupted=self.stopping,
            incomplete_moved=moved,
            orphans_removed=orphans,
            statuses=statuses,
        )

    async def _attempt(self, plan: RunPlan) -> RunResult:
        """One attempt; a runner that raises is recorded as an infrastructure error."""
        started = datetime.now(UTC)
        try:
            return await self.runner(plan, self.cancel)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # A plan that cannot begin (bad task, variant, image, agent config) fails
            # the same way every time: recorded once, not retried.
            retryable = getattr(e, "retryable", True)
            result = RunResult(
                run_id=plan.run_id,
                task_id=Path(plan.task_dir).name,
                task_dir=plan.task_dir,
                variant=plan.variant,
                agent=plan.agent.display,
                status=RunStatus.INFRASTRUCTURE_ERROR,
                error=f"the run could not be executed: {type(e).__name__}: {e}",
                started_at=started,
                ended_at=datetime.now(UTC),
                harness_version=ale.__version__,
                experiment=plan.experiment,
                attempt=plan.attempt,
                extra={} if retryable else {"retryable": False},
            )
            await asyncio.to_thread(_write_result, plan, result)
            return result


def _write_result(plan: RunPlan, result: RunResult) -> None:
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / layout.PLAN).exists():
        (run_dir / layout.PLAN).write_text(plan.model_dump_json(indent=2))
    if (run_dir / layout.RESULT).exists():
        return
    tmp = run_dir / layout.RESULT_TMP
    tmp.write_text(result.model_dump_json(indent=2))
    os.replace(tmp, run_dir / layout.RESULT)


def _short(text: str | None, limit: int = 120) -> str:
    if not text:
        return "no detail"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def run_experiment(
    exp: Experiment,
    *,
    runner: Runner | None = None,
    janitor: Janitor | None = None,
    progress: ProgressSink | None = None,
    concurrency: int | None = None,
    allow_changed: bool = False,
    handle_signals: bool = True,
    cluster: str | None = None,
    retry_errors: bool = False,
    units: list[PlannedUnit] | None = None,
    resume_turns: bool = False,
) -> OrchestratorSummary:
    """Run (or resume) an experiment with signal handling installed."""
    orch = Orchestrator(
        exp,
        runner=runner,
        janitor=janitor,
        progress=progress,
        concurrency=concurrency,
        allow_changed=allow_changed,
        cluster=cluster,
        retry_errors=retry_errors,
        units=units,
        resume_turns=resume_turns,
    )
    if handle_signals:
        orch.install_signal_handlers()
    try:
        return await orch.run()
    finally:
        if handle_signals:
            orch.remove_signal_handlers()
