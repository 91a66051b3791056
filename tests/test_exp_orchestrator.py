"""The orchestrator with a fake runner: bounds, ramp, retries, resume, stop, reconcile."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

import ale
from ale.plan import RunPlan
from ale.result import RunResult
from ale.runs.exp_record import ExperimentChanged, OutputBusy
from ale.runs.experiment import Experiment, load_experiment, plan_units
from ale.runs.orchestrator import Orchestrator, run_experiment
from ale.runs.store import RunIndex, rebuild_index, runs_root
from ale.status import RunStatus

Outcome = Callable[[RunPlan], tuple[RunStatus, float | None]]


class FakeRunner:
    """Writes run folders like the lifecycle: plan.json first, result.json last."""

    def __init__(self, outcome: Outcome | None = None, delay: float = 0.02):
        self.outcome = outcome or (lambda plan: (RunStatus.SCORED, 1.0))
        self.delay = delay
        self.current = 0
        self.max_seen = 0
        self.history: list[int] = []  # in-flight count at each start
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.on_start: Callable[[FakeRunner], None] | None = None

    async def __call__(self, plan: RunPlan, cancel: asyncio.Event) -> RunResult:
        run_dir = plan.run_dir
        run_dir.mkdir(parents=True, exist_ok=False)
        (run_dir / "plan.json").write_text(plan.model_dump_json())
        self.current += 1
        self.max_seen = max(self.max_seen, self.current)
        self.history.append(self.current)
        self.calls.append(plan.run_id)
        started = datetime.now(UTC)
        try:
            if self.on_start:
                self.on_start(self)
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled.append(plan.run_id)
            raise
        finally:
            self.current -= 1
        status, score = self.outcome(plan)
        result = RunResult(
            run_id=plan.run_id, task_id=Path(plan.task_dir).name, task_dir=plan.task_dir,
            variant=plan.variant, agent=plan.agent.display, status=status,
            scores=None if score is None else [score], score=score,
            started_at=started, ended_at=datetime.now(UTC), harness_version=ale.__version__,
            experiment=plan.experiment, attempt=plan.attempt,
        )
        (run_dir / "result.json").write_text(result.model_dump_json())
        return result


class FakeJanitor:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, experiment: str) -> list[str]:
        self.calls.append(experiment)
        return []


def make_exp(tmp: Path, n_tasks: int = 5, agents: tuple[str, ...] = ("oracle",), repeats: int = 1,
             extra: str = "") -> Experiment:
    for i in range(n_tasks):
        d = tmp / "tasks" / f"t{i:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "main.py").write_text("def load():\n    return [{'description': 'do it'}]\n\n\ndef evaluate(cfg, session):\n    return [1.0]\n")
    agent_yaml = ", ".join(f"{{name: {a}}}" for a in agents)
    f = tmp / "exp.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: fake
        tasks_root: tasks
        agents: [{agent_yaml}]
        tasks: [{{glob: "t*"}}]
        repeats: {repeats}
        retry: {{max_attempts: 3, backoff_initial_s: 0.01, backoff_max_s: 0.05}}
        output: out
    """) + extra)
    return load_experiment(f)


def results_by_unit(exp: Experiment) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for d in sorted(runs_root(exp.output_dir).iterdir()):
        if (d / "result.json").is_file():
            out[d.name.rsplit("-a", 1)[0]].append(d.name)
    return dict(out)


def run(orch: Orchestrator):
    return asyncio.run(orch.run())


@pytest.mark.parametrize("n", [1, 3])
def test_concurrency_never_exceeds_n(tmp_path: Path, n: int) -> None:
    exp = make_exp(tmp_path, n_tasks=12, agents=("a", "b"))
    runner = FakeRunner(delay=0.03)
    orch = Orchestrator(exp, runner=runner, janitor=FakeJanitor(), concurrency=n, ramp_after_s=0.005)
    summary = run(orch)
    assert runner.max_seen == n == orch.max_in_flight
    assert summary.statuses == {"scored": 24} and summary.all_final
    assert len(runner.calls) == 24


def test_ramp_starts_with_two_slots_and_grows(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=30)
    runner = FakeRunner(delay=0.02)
    # ramp_after_s is long: slots grow only as runs end well, one per run.
    orch = Orchestrator(exp, runner=runner, janitor=FakeJanitor(), concurrency=6, ramp_after_s=60)
    run(orch)
    assert runner.history[:2] == [1, 2]
    assert max(runner.history[:3]) <= 2
    assert runner.max_seen == 6


def test_only_infrastructure_errors_are_retried(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=4)
    plan_of = {u.task: u.unit_id for u in plan_units(exp)}

    def outcome(plan: RunPlan) -> tuple[RunStatus, float | None]:
        task = Path(plan.task_dir).name
        if task == "t00":  # infra twice, then fine
            return (RunStatus.INFRASTRUCTURE_ERROR, None) if plan.attempt < 3 else (RunStatus.SCORED, 0.5)
        if task == "t01":
            return RunStatus.AGENT_FAILED, 0.0
        if task == "t02":
            return RunStatus.INVALID_EVALUATION_ENVIRONMENT, None
        return RunStatus.INFRASTRUCTURE_ERROR, None  # always

    runner = FakeRunner(outcome)
    summary = run(Orchestrator(exp, runner=runner, janitor=FakeJanitor(), concurrency=2))
    got = results_by_unit(exp)
    assert got[plan_of["t00"]] == [f"{plan_of['t00']}-a{i}" for i in (1, 2, 3)]
    assert got[plan_of["t01"]] == [f"{plan_of['t01']}-a1"]
    assert got[plan_of["t02"]] == [f"{plan_of['t02']}-a1"]
    assert got[plan_of["t03"]] == [f"{plan_of['t03']}-a{i}" for i in (1, 2, 3)]
    assert summary.retried == 4
    assert summary.statuses == {"scored": 1, "agent_failed": 1, "invalid_evaluation_environment": 1,
                                "infrastructure_error": 1}
    # every attempt is in the index
    assert len(RunIndex(exp.output_dir).query()) == 8
    assert RunIndex(exp.output_dir).count_by_status()["infrastructure_error"] == 1


def test_runner_exception_is_recorded_as_infrastructure_error(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=1, extra="")

    async def broken(plan: RunPlan, cancel: asyncio.Event) -> RunResult:
        raise RuntimeError("engine went away")

    summary = run(Orchestrator(exp, runner=broken, janitor=FakeJanitor()))
    assert summary.statuses == {"infrastructure_error": 1}
    unit = plan_units(exp)[0].unit_id
    for a in (1, 2, 3):
        text = (runs_root(exp.output_dir) / f"{unit}-a{a}" / "result.json").read_text()
        assert "engine went away" in text


def test_resume_skips_finished_runs(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=6, repeats=2)
    first = FakeRunner()
    s1 = run(Orchestrator(exp, runner=first, janitor=FakeJanitor()))
    assert s1.executed == 12
    second = FakeRunner()
    s2 = run(Orchestrator(load_experiment(exp.source), runner=second, janitor=FakeJanitor(), concurrency=4))
    assert second.calls == [] and s2.skipped == 12 and s2.statuses == {"scored": 12}


def test_resume_after_stop_ends_every_run_exactly_once(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=10)
    holder: dict[str, Orchestrator] = {}

    def stop_at_fifth(r: FakeRunner) -> None:
        if len(r.calls) == 5:
            holder["o"].request_stop()

    runner = FakeRunner(delay=0.05)
    runner.on_start = stop_at_fifth
    holder["o"] = Orchestrator(exp, runner=runner, janitor=FakeJanitor(), concurrency=3, ramp_after_s=0.001)
    s1 = run(holder["o"])
    # Runs launched in the same batch as the fifth may start too; nothing later does.
    assert s1.interrupted and 5 <= len(runner.calls) <= 7
    assert runner.cancelled  # in-flight runs were cancelled, not waited for
    s2 = run(Orchestrator(exp, runner=FakeRunner(), janitor=FakeJanitor()))
    assert sorted(s2.incomplete_moved) == sorted(runner.cancelled)
    per_unit = results_by_unit(exp)
    assert len(per_unit) == 10 and all(len(v) == 1 for v in per_unit.values())
    assert s2.statuses == {"scored": 10}


def test_changed_experiment_is_refused_unless_allowed(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=2)
    run(Orchestrator(exp, runner=FakeRunner(), janitor=FakeJanitor()))
    src = Path(exp.source)
    src.write_text(src.read_text().replace("repeats: 1", "repeats: 2"))
    changed = load_experiment(src)
    with pytest.raises(ExperimentChanged, match="--allow-changed"):
        run(Orchestrator(changed, runner=FakeRunner(), janitor=FakeJanitor()))
    runner = FakeRunner()
    s = run(Orchestrator(changed, runner=runner, janitor=FakeJanitor(), allow_changed=True))
    assert len(runner.calls) == 2 and s.skipped == 2 and s.statuses == {"scored": 4}


def test_reconcile_moves_half_done_runs_and_removes_orphans(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=2)
    unit = plan_units(exp)[0]
    half = runs_root(exp.output_dir) / f"{unit.unit_id}-a1"
    half.mkdir(parents=True)
    (half / "plan.json").write_text("{}")
    janitor = FakeJanitor()
    runner = FakeRunner()
    s = run(Orchestrator(exp, runner=runner, janitor=janitor))
    assert s.incomplete_moved == [f"{unit.unit_id}-a1"]
    assert [p.name.split(".")[0] for p in (exp.output_dir / ".incomplete").iterdir()] == [f"{unit.unit_id}-a1"]
    assert (half / "result.json").is_file()  # redone, same attempt
    assert janitor.calls[0] == "fake" and len(janitor.calls) == 2  # at start and at the end
    assert len(runner.calls) == 2


def test_sigint_stops_launching(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=20)

    def interrupt(r: FakeRunner) -> None:
        if len(r.calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)

    runner = FakeRunner(delay=0.2)
    runner.on_start = interrupt
    janitor = FakeJanitor()
    launched_at_stop: list[int] = []

    class Recording(Orchestrator):
        def request_stop(self) -> None:
            launched_at_stop.append(len(runner.calls))
            super().request_stop()

    async def main():
        orch = Recording(exp, runner=runner, janitor=janitor, concurrency=2, ramp_after_s=0.01)
        orch.install_signal_handlers()
        try:
            return await orch.run()
        finally:
            orch.remove_signal_handlers()

    s = asyncio.run(main())
    assert s.interrupted and launched_at_stop
    assert len(runner.calls) == launched_at_stop[0] <= 4  # nothing launched after the signal
    assert runner.current == 0 and runner.cancelled
    assert janitor.calls[-1] == "fake"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_run_experiment_installs_and_removes_handlers(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=2)
    s = asyncio.run(run_experiment(exp, runner=FakeRunner(), janitor=FakeJanitor()))
    assert s.statuses == {"scored": 2}
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_output_folder_is_locked(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=2)

    async def both() -> None:
        slow = FakeRunner(delay=0.3)
        a = asyncio.create_task(Orchestrator(exp, runner=slow, janitor=FakeJanitor()).run())
        await asyncio.sleep(0.1)
        with pytest.raises(OutputBusy):
            await Orchestrator(exp, runner=FakeRunner(), janitor=FakeJanitor()).run()
        await a

    asyncio.run(both())


def test_index_is_rebuildable_from_folders(tmp_path: Path) -> None:
    exp = make_exp(tmp_path, n_tasks=3, agents=("a", "b"), repeats=2)
    run(Orchestrator(exp, runner=FakeRunner(lambda p: (RunStatus.SCORED, 0.25)), janitor=FakeJanitor()))
    before = RunIndex(exp.output_dir).query()
    (exp.output_dir / "index.sqlite").unlink()
    after = rebuild_index(exp.output_dir).query()
    assert before == after and len(after) == 12
    row = after[0]
    assert (row.task, row.agent, row.repeat, row.status, row.score) == ("t00", "a", 0, "scored", 0.25)
    assert row.path == f"runs/{row.run_id}"
    assert len(RunIndex(exp.output_dir).query("agent = ? AND task = ?", ("b", "t01"))) == 2


def test_progress_displays(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from ale.runs.progress import PlainProgress, RichProgress

    exp = make_exp(tmp_path, n_tasks=4)
    outcome = {"t00": (RunStatus.SCORED, 1.0), "t01": (RunStatus.SCORED, 0.0),
               "t02": (RunStatus.INVALID_EVALUATION_ENVIRONMENT, 1.0), "t03": (RunStatus.AGENT_FAILED, None)}
    buf = io.StringIO()
    run(Orchestrator(exp, runner=FakeRunner(lambda p: outcome[Path(p.task_dir).name]), janitor=FakeJanitor(),
                     progress=PlainProgress(buf)))
    text = buf.getvalue()
    assert "4 runs planned, 0 already done" in text
    # the invalid run's 1.0 and the unscored agent failure stay out of the mean
    assert "finished: done 4/4  running 0  scored 2  failed 1  invalid 1  retries 0  mean 0.500" in text

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    s = run(Orchestrator(load_experiment(exp.source), runner=FakeRunner(), janitor=FakeJanitor(),
                         progress=RichProgress(console)))
    assert s.skipped == 4
    assert "done 4/4" in out.getvalue() and "invalid 1" in out.getvalue()
