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
  ``<output>/.incomplete/`` and that attempt is run again.
- **Stop** (SIGINT/SIGTERM): nothing new is launched, in-flight runs are
  cancelled (the lifecycle removes their containers on cancellation), then every
  container labelled with the experiment is removed. A second signal stops
  waiting for the grace period.

A lock file (``<output>/.lock``, ``flock``) keeps two orchestrators off one output
folder; the kernel drops it when the process dies, SIGKILL included.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import inspect
import json
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import ale
from ale.runs.experiment import Experiment, PlannedUnit, attempt_run_id, content_hash, plan_units
from ale.runs.plan import RunPlan
from ale.runs.result import RunResult
from ale.runs.store import RunIndex, UnitInfo, read_result, runs_root, write_units
from ale.sandbox.scratch import release_scratch
from ale.status import RunStatus, counts_toward_score

Runner = Callable[[RunPlan, asyncio.Event], Awaitable[RunResult]]
Janitor = Callable[[str], list[str]]  # experiment name -> removed container names

EXPERIMENT_RECORD = "experiment.json"
INCOMPLETE_DIR = ".incomplete"


class ExperimentChanged(RuntimeError):
    """The experiment differs from the one that started this output folder."""


class OutputBusy(RuntimeError):
    """Another orchestrator holds this output folder."""


# -- progress ----------------------------------------------------------------


@dataclass
class ProgressState:
    total: int
    done: int = 0  # units with a final result (this session or earlier)
    skipped: int = 0  # of which were already final at start
    running: int = 0
    scored: int = 0
    failed: int = 0  # agent_failed, timeout, grading_failed, infrastructure_error (final)
    invalid: int = 0
    retries: int = 0
    slots: int = 0
    score_sum: float = 0.0
    score_n: int = 0
    started_at: float = field(default_factory=time.monotonic)
    finished_this_session: int = 0
    stopping: bool = False

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.score_n if self.score_n else None

    def eta_s(self) -> float | None:
        if not self.finished_this_session:
            return None
        remaining = self.total - self.done
        rate = self.finished_this_session / max(time.monotonic() - self.started_at, 1e-6)
        return remaining / rate

    def count_final(self, result: RunResult) -> None:
        self.done += 1
        status = RunStatus(result.status)
        if status is RunStatus.INVALID_EVALUATION_ENVIRONMENT:
            self.invalid += 1
        elif status is RunStatus.SCORED:
            self.scored += 1
        else:
            self.failed += 1
        if counts_toward_score(status, result.score):
            assert result.score is not None
            self.score_sum += result.score
            self.score_n += 1


class ProgressSink(Protocol):
    def start(self, state: ProgressState) -> None: ...
    def update(self, state: ProgressState, message: str | None = None) -> None: ...
    def stop(self, state: ProgressState) -> None: ...


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def summary_line(s: ProgressState) -> str:
    mean = "-" if s.mean_score is None else f"{s.mean_score:.3f}"
    return (
        f"done {s.done}/{s.total}  running {s.running}  scored {s.scored}  failed {s.failed}  "
        f"invalid {s.invalid}  retries {s.retries}  mean {mean}  slots {s.slots}  "
        f"eta {_fmt_eta(s.eta_s())}" + ("  [stopping]" if s.stopping else "")
    )


class PlainProgress:
    """One line per event, for CI logs and non-terminals."""

    def __init__(self, stream: Any = None, every_s: float = 30.0):
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._last = 0.0

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def start(self, state: ProgressState) -> None:
        self._print(f"[ale] {state.total} runs planned, {state.skipped} already done")

    def update(self, state: ProgressState, message: str | None = None) -> None:
        now = time.monotonic()
        if message:
            self._print(f"[ale] {message}")
        if message or now - self._last >= self.every_s:
            self._last = now
            self._print(f"[ale] {summary_line(state)}")

    def stop(self, state: ProgressState) -> None:
        self._print(f"[ale] finished: {summary_line(state)}")


class RichProgress:
    """A live panel: a bar plus done / running / failed / invalid, mean score, ETA."""

    def __init__(self, console: Any = None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._live: Any = None
        self._recent: deque[str] = deque(maxlen=6)

    def _render(self, s: ProgressState) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 2))
        for _ in range(8):
            table.add_column()
        mean = "-" if s.mean_score is None else f"{s.mean_score:.3f}"
        table.add_row(
            Text(f"done {s.done}/{s.total}", style="bold"),
            Text(f"running {s.running}", style="cyan"),
            Text(f"scored {s.scored}", style="green"),
            Text(f"failed {s.failed}", style="yellow"),
            Text(f"invalid {s.invalid}", style="red"),
            Text(f"mean {mean}"),
            Text(f"slots {s.slots}"),
            Text(f"ETA {_fmt_eta(s.eta_s())}" + (" (stopping)" if s.stopping else "")),
        )
        bar = ProgressBar(total=max(s.total, 1), completed=s.done, width=60)
        return Group(bar, table, *[Text(r, style="dim") for r in self._recent])

    def start(self, state: ProgressState) -> None:
        from rich.live import Live

        self._live = Live(self._render(state), console=self.console, refresh_per_second=4, transient=False)
        self._live.start()

    def update(self, state: ProgressState, message: str | None = None) -> None:
        if message:
            self._recent.append(message)
        if self._live is not None:
            self._live.update(self._render(state))

    def stop(self, state: ProgressState) -> None:
        if self._live is not None:
            self._live.update(self._render(state))
            self._live.stop()
            self._live = None


class NullProgress:
    def start(self, state: ProgressState) -> None:
        pass

    def update(self, state: ProgressState, message: str | None = None) -> None:
        pass

    def stop(self, state: ProgressState) -> None:
        pass


# -- the default runner and janitor (real Docker) ----------------------------


def docker_runner(client: Any = None) -> Runner:
    """The lifecycle's ``execute_run`` as a Runner, sharing one Docker client."""
    from ale.runs.lifecycle import execute_run

    takes_cancel = "cancel" in inspect.signature(execute_run).parameters

    async def run(plan: RunPlan, cancel: asyncio.Event) -> RunResult:
        if takes_cancel:
            return await execute_run(plan, client=client, cancel=cancel)  # type: ignore[call-arg]
        return await execute_run(plan, client=client)

    return run


def docker_janitor(client: Any) -> Janitor:
    from ale.sandbox.docker import remove_containers

    def clean(experiment: str) -> list[str]:
        return remove_containers(client, experiment=experiment)

    return clean


def cleanup_all(client: Any) -> list[str]:
    """Remove every container labelled ``ale.managed=1`` (and nothing else)."""
    from ale.sandbox.docker import remove_containers

    return remove_containers(client)


# -- the orchestrator ---------------------------------------------------------


@dataclass
class UnitState:
    unit: PlannedUnit
    next_attempt: int = 1
    final: RunResult | None = None


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
    ):
        self.exp = exp
        self.units = units if units is not None else plan_units(exp)
        self.output = exp.output_dir
        self.concurrency = concurrency or exp.concurrency
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        self.allow_changed = allow_changed
        self.ramp_start = max(1, min(ramp_start, self.concurrency))
        self.ramp_after_s = ramp_after_s
        self.stop_grace_s = stop_grace_s
        self._client: Any = None
        if runner is None or janitor is None:
            from ale.sandbox.docker import connect

            self._client = connect()
        self.runner = runner or docker_runner(self._client)
        self.janitor = janitor or docker_janitor(self._client)
        self.progress: ProgressSink = progress or NullProgress()
        self.cancel = asyncio.Event()
        self._stop_requests = 0
        self._changed: asyncio.Event | None = None
        self._lock_fd: int | None = None
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
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)

    def remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)

    # -- preparation ---------------------------------------------------------
    def _acquire_lock(self) -> None:
        self.output.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.output / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            raise OutputBusy(
                f"another `ale exp run` is using {self.output} (lock {self.output / '.lock'})"
            ) from e
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = None

    def _check_record(self) -> None:
        """Refuse a changed experiment; write the record of this one."""
        record_path = self.output / EXPERIMENT_RECORD
        digest = content_hash(self.exp, self.units)
        history: list[dict[str, Any]] = []
        if record_path.is_file():
            try:
                old = json.loads(record_path.read_text())
            except ValueError as e:
                raise ExperimentChanged(f"{record_path} is unreadable ({e}); move it aside to start over") from e
            if old.get("name") != self.exp.name and not self.allow_changed:
                raise ExperimentChanged(
                    f"{self.output} holds experiment {old.get('name')!r}, not {self.exp.name!r}; "
                    "use another output folder"
                )
            if old.get("content_hash") != digest and not self.allow_changed:
                raise ExperimentChanged(
                    f"the experiment changed since {self.output} was started "
                    f"(content hash {str(old.get('content_hash'))[:12]} -> {digest[:12]}). "
                    "Runs already done would mix two experiments. Use a new output folder, "
                    "or pass --allow-changed to continue anyway."
                )
            history = list(old.get("history", []))
            if old.get("content_hash") != digest:
                history.append({"content_hash": old.get("content_hash"), "replaced_at": _utc()})
        record = {
            "name": self.exp.name,
            "content_hash": digest,
            "source": self.exp.source,
            "units": len(self.units),
            "harness_version": ale.__version__,
            "updated_at": _utc(),
            "history": history,
            "experiment": json.loads(self.exp.model_dump_json()),
        }
        tmp = record_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(record_path)
        write_units(
            self.output,
            {u.unit_id: UnitInfo(u.unit_id, u.task, u.variant, u.agent, u.repeat) for u in self.units},
        )

    def _reconcile(self) -> tuple[list[str], list[str]]:
        """After a crash: remove orphan containers, move half-done run folders aside."""
        orphans = self.janitor(self.exp.name)
        moved: list[str] = []
        root = runs_root(self.output)
        if root.is_dir():
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            for run_dir in sorted(root.iterdir()):
                if not run_dir.is_dir() or run_dir.name.startswith("."):
                    continue
                if not (run_dir / "result.json").is_file():
                    dest = self.output / INCOMPLETE_DIR / f"{run_dir.name}.{stamp}"
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(run_dir), dest)
                    moved.append(run_dir.name)
            scratch = root / ".scratch"
            if scratch.is_dir():
                release_scratch(scratch)
        return orphans, moved

    def _unit_states(self, index: RunIndex) -> list[UnitState]:
        """Each unit's next attempt, or its final result (read from the run folders)."""
        root = runs_root(self.output)
        states = []
        rows = []
        max_attempts = self.exp.retry.max_attempts
        for unit in self.units:
            st = UnitState(unit)
            attempt = 1
            latest: RunResult | None = None
            while True:
                run_dir = root / attempt_run_id(unit.unit_id, attempt)
                result = read_result(run_dir) if run_dir.is_dir() else None
                if result is None:
                    break
                rows.append((result, _info(unit), run_dir))
                latest = result
                attempt += 1
            st.next_attempt = attempt
            if latest is not None and (
                not RunStatus(latest.status).retryable
                or not latest.extra.get("retryable", True)
                or latest.attempt >= max_attempts
            ):
                st.final = latest
            states.append(st)
        index.record_many(rows)
        return states

    # -- running -------------------------------------------------------------
    async def run(self) -> OrchestratorSummary:
        self._acquire_lock()
        try:
            return await self._run_locked()
        finally:
            self._release_lock()

    async def _run_locked(self) -> OrchestratorSummary:
        self._check_record()
        orphans, moved = await asyncio.to_thread(self._reconcile)
        runs_root(self.output).mkdir(parents=True, exist_ok=True)
        index = RunIndex(self.output)
        states = await asyncio.to_thread(self._unit_states, index)
        progress = ProgressState(total=len(states))
        for st in states:
            if st.final is not None:
                progress.count_final(st.final)
        progress.skipped = progress.done
        progress.slots = self.ramp_start
        self.progress.start(progress)
        if moved:
            self.progress.update(progress, f"moved {len(moved)} interrupted run folder(s) to {INCOMPLETE_DIR}/; redoing them")
        if orphans:
            self.progress.update(progress, f"removed {len(orphans)} orphan container(s)")

        pending: deque[UnitState] = deque(st for st in states if st.final is None)
        in_flight: dict[asyncio.Task[RunResult], tuple[UnitState, int]] = {}
        delayed: set[asyncio.Task[None]] = set()
        ramp_timers: set[asyncio.Task[None]] = set()
        changed = self._changed = asyncio.Event()
        executed = retried = 0
        slots = self.ramp_start

        def grow(reason_ok: bool) -> None:
            nonlocal slots
            if reason_ok and slots < self.concurrency:
                slots += 1
                progress.slots = slots
                changed.set()

        ramped: set[str] = set()  # runs that already earned a slot

        async def ramp_timer(task: asyncio.Task[RunResult]) -> None:
            await asyncio.sleep(self.ramp_after_s)
            if not task.done() and task.get_name() not in ramped:
                ramped.add(task.get_name())
                grow(True)

        async def requeue_later(st: UnitState, delay: float) -> None:
            await asyncio.sleep(delay)
            if not self.stopping:
                pending.appendleft(st)
                changed.set()

        def launch(st: UnitState) -> None:
            nonlocal executed
            attempt = st.next_attempt
            plan = st.unit.plan_for(attempt)
            task = asyncio.create_task(self._attempt(plan), name=plan.run_id)
            in_flight[task] = (st, attempt)
            executed += 1
            self.max_in_flight = max(self.max_in_flight, len(in_flight))
            progress.running = len(in_flight)
            timer = asyncio.create_task(ramp_timer(task))
            ramp_timers.add(timer)
            timer.add_done_callback(ramp_timers.discard)

        stop_deadline: float | None = None
        try:
            while pending or in_flight or delayed:
                if self.stopping:
                    if stop_deadline is None:
                        stop_deadline = time.monotonic() + self.stop_grace_s
                        progress.stopping = True
                        pending.clear()
                        for d in list(delayed):
                            d.cancel()
                        # The lifecycle ends a run on task cancellation (its cleanup
                        # is shielded); the cancel event tells runners that watch it.
                        for t in in_flight:
                            t.cancel()
                        self.progress.update(progress, f"stopping: cancelling {len(in_flight)} in-flight run(s)")
                    if not in_flight:
                        break
                else:
                    while pending and len(in_flight) < slots:
                        launch(pending.popleft())
                changed.clear()
                waiters: set[asyncio.Future[Any]] = set(in_flight) | set(delayed)
                change_waiter = asyncio.ensure_future(changed.wait())
                waiters.add(change_waiter)
                timeout = None
                if stop_deadline is not None:
                    timeout = max(0.0, stop_deadline - time.monotonic())
                done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not change_waiter.done():
                    change_waiter.cancel()
                if stop_deadline is not None and time.monotonic() >= stop_deadline and in_flight:
                    # The runs did not end within the grace period: leave them.
                    break
                for task in [t for t in done if t in in_flight]:
                    st, attempt = in_flight.pop(task)
                    progress.running = len(in_flight)
                    if task.cancelled():
                        self.progress.update(progress, f"{task.get_name()}: cancelled")
                        continue
                    exc = task.exception()
                    if exc is not None:  # _attempt turns runner errors into results
                        raise exc
                    result = task.result()
                    index.record(result, _info(st.unit), runs_root(self.output) / result.run_id)
                    status = RunStatus(result.status)
                    retryable = status.retryable and result.extra.get("retryable", True)
                    if retryable and attempt < self.exp.retry.max_attempts and not self.stopping:
                        st.next_attempt = attempt + 1
                        retried += 1
                        progress.retries += 1
                        if slots > 1:
                            slots -= 1
                            progress.slots = slots
                        delay = min(
                            self.exp.retry.backoff_max_s,
                            self.exp.retry.backoff_initial_s * (2 ** (attempt - 1)),
                        )
                        d = asyncio.create_task(requeue_later(st, delay))
                        delayed.add(d)
                        d.add_done_callback(delayed.discard)
                        self.progress.update(
                            progress,
                            f"{result.run_id}: infrastructure_error ({_short(result.error)}); "
                            f"attempt {attempt + 1} in {delay:.1f}s",
                        )
                        continue
                    if retryable and attempt < self.exp.retry.max_attempts:
                        # Stopping: leave the retry for the next start.
                        continue
                    st.final = result
                    progress.count_final(result)
                    progress.finished_this_session += 1
                    if result.run_id not in ramped:
                        ramped.add(result.run_id)
                        grow(not status.retryable)
                    score = "-" if result.score is None else f"{result.score:.3f}"
                    self.progress.update(progress, f"{result.run_id}: {status.value} score={score}")
                for task in [t for t in done if t in delayed]:
                    delayed.discard(task)  # type: ignore[arg-type]
        finally:
            for t in list(in_flight) + list(delayed) + list(ramp_timers):
                t.cancel()
            if in_flight:
                await asyncio.wait(list(in_flight), timeout=30)
            for t in ramp_timers:
                t.cancel()
            progress.running = 0
            # Whatever the runs left (a crash, a cancelled run): remove it.
            with contextlib.suppress(Exception):
                leftovers = await asyncio.to_thread(self.janitor, self.exp.name)
                if leftovers:
                    self.progress.update(progress, f"removed {len(leftovers)} leftover container(s)")
            self.progress.stop(progress)
            self._changed = None
        statuses: dict[str, int] = {}
        for st in states:
            if st.final is not None:
                key = str(RunStatus(st.final.status))
                statuses[key] = statuses.get(key, 0) + 1
        return OrchestratorSummary(
            output=self.output,
            total=len(states),
            skipped=progress.skipped,
            executed=executed,
            retried=retried,
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
    if not (run_dir / "plan.json").exists():
        (run_dir / "plan.json").write_text(plan.model_dump_json(indent=2))
    if (run_dir / "result.json").exists():
        return
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(result.model_dump_json(indent=2))
    os.replace(tmp, run_dir / "result.json")


def _info(unit: PlannedUnit) -> UnitInfo:
    return UnitInfo(unit.unit_id, unit.task, unit.variant, unit.agent, unit.repeat)


def _short(text: str | None, limit: int = 120) -> str:
    if not text:
        return "no detail"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _utc() -> str:
    return datetime.now(UTC).isoformat()


async def run_experiment(
    exp: Experiment,
    *,
    runner: Runner | None = None,
    janitor: Janitor | None = None,
    progress: ProgressSink | None = None,
    concurrency: int | None = None,
    allow_changed: bool = False,
    handle_signals: bool = True,
) -> OrchestratorSummary:
    """Run (or resume) an experiment with signal handling installed."""
    orch = Orchestrator(
        exp,
        runner=runner,
        janitor=janitor,
        progress=progress,
        concurrency=concurrency,
        allow_changed=allow_changed,
    )
    if handle_signals:
        orch.install_signal_handlers()
    try:
        return await orch.run()
    finally:
        if handle_signals:
            orch.remove_signal_handlers()
