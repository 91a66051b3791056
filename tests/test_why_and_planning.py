"""Issue 20: every run that did not score says why (one line, everywhere), and
experiments plan what can run and say what cannot (no Docker needed here)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import ale
from ale.cli.exp import exp_app, report_command
from ale.plan import RunPlan
from ale.result import RunResult, reason_line
from ale.status import InvalidAttribution, RunStatus

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
GOOD = "def load():\n    return [{'description': 'do it'}]\n\n\ndef evaluate(cfg, session):\n    return [1.0]\n"
WINDOWS = ("def load():\n    return [{'description': 'on windows', 'computer': {'provider': 'native', "
           "'setup_config': {'os_type': 'windows'}}}]\n\n\ndef evaluate(cfg, session):\n    return [1.0]\n")
BROKEN = "import sgfmill_not_installed\n\ndef load():\n    return [{'description': 'x'}]\n"
NEEDS_DATA = ("def load():\n    return [{'description': 'data', 'metadata': {'requires_task_data': True}}]\n\n\n"
              "def evaluate(cfg, session):\n    return [1.0]\n")


def _result(status: RunStatus, error: str | None = None, **kw) -> RunResult:
    now = datetime.now(UTC)
    return RunResult(run_id="r", task_id="t", task_dir="/t", variant=0, agent="a", status=status, error=error,
                     started_at=now, ended_at=now, harness_version=ale.__version__, **kw)


# -- the one line ------------------------------------------------------------------


def test_reason_line_is_one_line_for_every_status_that_did_not_score() -> None:
    assert reason_line(_result(RunStatus.SCORED, scores=[1.0], score=1.0)) is None
    tb = "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: the real cause\n"
    assert reason_line(_result(RunStatus.INFRASTRUCTURE_ERROR, tb)) == "ValueError: the real cause"
    line = reason_line(_result(RunStatus.INFRASTRUCTURE_ERROR, "the run could not be executed: PreflightError: x\nmore"))
    assert line == "the run could not be executed: PreflightError: x"
    inv = _result(RunStatus.INVALID_EVALUATION_ENVIRONMENT, "not sealed; see violations",
                  violations=["network: eth0 is up", "mounts: 3"], invalid_attribution=InvalidAttribution.BEFORE_AGENT)
    assert reason_line(inv) == "network: eth0 is up (+1 more) [before the agent started; retried]"
    for status in RunStatus:
        if status is not RunStatus.SCORED:
            text = reason_line(_result(status))
            assert text and "\n" not in text
    assert len(reason_line(_result(RunStatus.AGENT_FAILED, "x" * 1000)) or "") <= 240


# -- experiments: status lines, report, HTML, status ---------------------------------


def _tasks(tmp: Path, bodies: dict[str, str]) -> None:
    for name, body in bodies.items():
        (tmp / "tasks" / name).mkdir(parents=True, exist_ok=True)
        (tmp / "tasks" / name / "main.py").write_text(body)


def _exp(tmp: Path, tasks: str = "[a, b]", agents: str = "[{name: oracle}, {name: nop}]", extra: str = "") -> Path:
    f = tmp / "exp.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: why
        tasks_root: tasks
        agents: {agents}
        tasks: {tasks}
        output: out
        retry: {{max_attempts: 1}}
    """) + extra)
    return f


def _run_fake(tmp: Path, outcome, **kw):
    from ale.runs.experiment import load_experiment
    from ale.runs.orchestrator import Orchestrator
    from tests.test_exp_orchestrator import FakeJanitor

    class Runner:
        def __init__(self) -> None:
            self.calls: list[str] = []

        async def __call__(self, plan: RunPlan, cancel: asyncio.Event) -> RunResult:
            self.calls.append(plan.run_id)
            status, error = outcome(plan)
            now = datetime.now(UTC)
            result = RunResult(run_id=plan.run_id, task_id=Path(plan.task_dir).name, task_dir=plan.task_dir,
                               variant=plan.variant, agent=plan.agent.display, status=status, error=error,
                               scores=[1.0] if status is RunStatus.SCORED else None,
                               score=1.0 if status is RunStatus.SCORED else None, started_at=now, ended_at=now,
                               harness_version=ale.__version__, experiment=plan.experiment, attempt=plan.attempt)
            plan.run_dir.mkdir(parents=True)
            (plan.run_dir / "plan.json").write_text(plan.model_dump_json())
            (plan.run_dir / "result.json").write_text(result.model_dump_json())
            return result

    exp = load_experiment(tmp / "exp.yaml")
    r = Runner()
    from ale.runs.progress import PlainProgress

    lines: list[str] = []
    progress = PlainProgress()
    progress._print = lines.append  # type: ignore[method-assign]
    summary = asyncio.run(Orchestrator(exp, runner=r, janitor=FakeJanitor(), progress=progress, **kw).run())
    return exp.output_dir, r, summary, lines


def test_every_place_says_why_a_run_did_not_score(tmp_path: Path) -> None:
    _tasks(tmp_path, {"a": GOOD, "b": GOOD})
    _exp(tmp_path)
    why = "the run could not be executed: PreflightError: image 'ale-desktop:latest' is missing"
    out, _, _, lines = _run_fake(tmp_path, lambda p: (RunStatus.SCORED, None) if p.agent.name == "oracle"
                                 else (RunStatus.INFRASTRUCTURE_ERROR, why + "\nTraceback ..."))
    # the status line of each final run
    assert any(ln.endswith(f"infrastructure_error score=-  ({why})") for ln in lines), lines
    # ale report (piped: the table is not cut) lists each run that did not score, with why
    app = typer.Typer()
    app.command()(report_command)
    res = runner.invoke(app, [str(out)])
    assert res.exit_code == 0, res.output
    assert "2 run(s) did not score" in res.stdout
    assert f"2  infrastructure_error: {why}" in res.stdout
    assert f"a-v0-nop-r0-a1: infrastructure_error: {why}" in res.stdout
    assert "counted/runs" in res.stdout and "…" not in res.stdout  # no column cut to fit 80
    # the HTML report: a column and a section grouping the reasons with counts
    res = runner.invoke(app, [str(out), "--html", str(tmp_path / "r.html")])
    html = (tmp_path / "r.html").read_text()
    assert "<th>why not scored</th>" in html and "id='reasons'" in html
    assert "<td class='num'>2</td><td>infrastructure_error</td><td>the run could not be executed: PreflightError: " in html
    # ale exp status, and the tasks planning left out (skipped.json)
    from ale.runs.screening import Skipped, write_skipped

    write_skipped(out, [Skipped("win", "/t/win", None, "unsupported", "needs a Windows VM (vm.snapshot=cpu-free)")])
    res = runner.invoke(exp_app, ["status", str(out)])
    assert res.exit_code == 0, res.output
    assert f"b-v0-nop-r0-a1: infrastructure_error: {why}" in res.stdout
    assert "1 task(s) or variant(s) not planned" in res.stdout and "unsupported  win: needs a Windows VM" in res.stdout
    res = runner.invoke(app, [str(out)])
    assert "unsupported  win: needs a Windows VM" in res.stdout


def test_report_prints_pass_at_k_when_piped(tmp_path: Path) -> None:
    _tasks(tmp_path, {"a": GOOD})
    _exp(tmp_path, tasks="[a]", agents="[{name: oracle}]", extra="repeats: 3\n")
    out, *_ = _run_fake(tmp_path, lambda p: (RunStatus.SCORED, None))
    app = typer.Typer()
    app.command()(report_command)
    res = runner.invoke(app, [str(out)])
    assert res.exit_code == 0, res.output
    header = next(ln for ln in res.stdout.splitlines() if "agent" in ln and "mean" in ln)
    assert all(f"pass@{k}" in header for k in (1, 2, 3)), res.stdout


def test_report_table_is_not_cut_when_piped(tmp_path: Path) -> None:
    _tasks(tmp_path, {"a": GOOD})
    _exp(tmp_path, tasks="[a]", agents="[{name: oracle, label: an-agent-label-long-enough-to-overflow-eighty-columns}]")
    out, *_ = _run_fake(tmp_path, lambda p: (RunStatus.SCORED, None))
    proc = subprocess.run([sys.executable, "-m", "ale.cli", "report", str(out)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "", "TERM": "dumb"})
    assert proc.returncode == 0, proc.stderr
    assert "an-agent-label-long-enough-to-overflow-eighty-columns" in proc.stdout
    assert "flagged" in proc.stdout and "counted/runs" in proc.stdout


def test_retry_errors_runs_errored_units_once_more(tmp_path: Path) -> None:
    _tasks(tmp_path, {"a": GOOD, "b": GOOD})
    _exp(tmp_path)
    out, r1, s1, _ = _run_fake(tmp_path, lambda p: (RunStatus.INFRASTRUCTURE_ERROR, "boom") if p.agent.name == "nop"
                               else (RunStatus.SCORED, None))
    assert s1.statuses == {"scored": 2, "infrastructure_error": 2}
    _, r2, _, _ = _run_fake(tmp_path, lambda p: (RunStatus.SCORED, None))
    assert r2.calls == []  # final: a plain resume runs nothing
    _, r3, s3, _ = _run_fake(tmp_path, lambda p: (RunStatus.SCORED, None), retry_errors=True)
    assert sorted(r3.calls) == ["a-v0-nop-r0-a2", "b-v0-nop-r0-a2"]
    assert s3.statuses == {"scored": 4}


def test_retry_errors_flag_on_the_cli(tmp_path: Path) -> None:
    res = runner.invoke(exp_app, ["run", "--help"])
    assert "--retry-errors" in res.output


# -- planning: what cannot run is listed, recorded, and never stops the rest -----------


def test_unsupported_and_broken_tasks_are_listed_never_planned(tmp_path: Path) -> None:
    _tasks(tmp_path, {"a": GOOD, "win": WINDOWS, "broken": BROKEN, "data": NEEDS_DATA})
    (tmp_path / "list.txt").write_text("a\nwin\nbroken\ndata\n")
    f = _exp(tmp_path, tasks="[list.txt]", agents="[{name: nop}]")
    res = runner.invoke(exp_app, ["run", str(f), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert [ln.split("\t")[0] for ln in res.stdout.splitlines() if ln.strip()] == ["a-v0-nop-r0"]
    assert "3 task(s) or variant(s) not planned" in res.output
    assert "unsupported  win v0: needs a Windows VM (os_type=windows)" in res.output
    assert "error        broken: does not load:" in res.output and "sgfmill_not_installed" in res.output
    assert ("no_data data v0: variant 0 (tasks/data/0) needs task data and no data source was given: pass "
            "environment.data_source") in " ".join(res.output.split())
    assert not (tmp_path / "out").exists()
    # recorded in the experiment folder by a real run
    from ale.runs.experiment import load_experiment, plan_experiment
    from ale.runs.screening import read_skipped, write_skipped

    units, skipped = plan_experiment(load_experiment(f))
    assert [u.unit_id for u in units] == ["a-v0-nop-r0"]
    write_skipped(tmp_path / "out", skipped)
    assert {s["task"]: s["status"] for s in read_skipped(tmp_path / "out")} == {
        "win": "unsupported", "broken": "error", "data": "no_data"}


def test_a_missing_variant_is_listed(tmp_path: Path) -> None:
    _tasks(tmp_path, {"a": GOOD})
    f = _exp(tmp_path, tasks="[{path: a, variants: [0, 4]}]", agents="[{name: nop}]")
    res = runner.invoke(exp_app, ["run", str(f), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "no_such_variant a v4: variant 4 does not exist: the task has 1" in " ".join(res.output.split())


@pytest.mark.parametrize(("agents", "expected"), [
    ("[{name: nop}, {name: oracel}]", "agents[1] (oracel): unknown agent 'oracel'; did you mean 'oracle'?"),
    ("[{name: replay, config: {scrpit: s.json}}]",
     "agents[0] (replay): replay agent: unknown config key 'scrpit'; did you mean 'script'?"),
    ("[{name: replay, config: {script: missing.json}}]", "agents[0] (replay): "),
])
def test_agents_are_checked_at_planning(tmp_path: Path, agents: str, expected: str) -> None:
    _tasks(tmp_path, {"a": GOOD})
    f = _exp(tmp_path, tasks="[a]", agents=agents)
    res = runner.invoke(exp_app, ["run", str(f), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert expected in " ".join(res.output.split())


def test_ale_run_refuses_a_typo_and_missing_data_before_any_sandbox(tmp_path: Path) -> None:
    from ale.cli.main import app

    _tasks(tmp_path, {"data": NEEDS_DATA})
    res = runner.invoke(app, ["run", str(tmp_path / "tasks" / "data"), "--agent", "oracel", "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 2 and "did you mean 'oracle'" in res.output
    res = runner.invoke(app, ["run", str(tmp_path / "tasks" / "data"), "--agent", "nop", "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "needs task data and no data source was given: pass --data with a data root holding tasks/data/0/input/" in text
    assert not (tmp_path / "runs").exists()  # refused before a run folder or a sandbox


# -- an unreachable data store: one line, fast, retryable --------------------------------


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:{port}", "http://no-such-host.invalid:443"])
def test_an_unreachable_store_is_not_missing_data(tmp_path: Path, monkeypatch, endpoint: str) -> None:
    from ale.data.base import DataMissing, VariantKey
    from ale.data.remote import DataUnreachable
    from ale.data.sources import open_source

    monkeypatch.setenv("ALE_GCS_ENDPOINT_URL", endpoint.format(port=_closed_port()))
    t0 = time.monotonic()
    src = open_source("gs://ale-data-public", anon=True)
    with pytest.raises(DataUnreachable) as e:
        src.stage_input(VariantKey("d", "t", "v"), tmp_path / "in")
    assert time.monotonic() - t0 < 10
    assert not isinstance(e.value, DataMissing) and e.value.retryable
    assert "\n" not in str(e.value) and "the data store is unreachable" in str(e.value)
    assert str(e.value).startswith("gs://ale-data-public")


def test_store_endpoints() -> None:
    from ale.data.remote import store_endpoint

    assert store_endpoint("gcs", {}) == ("storage.googleapis.com", 443)
    assert store_endpoint("s3", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}) == ("127.0.0.1", 9000)
    assert store_endpoint("hf", {"endpoint": "https://hf.example"}) == ("hf.example", 443)
    assert store_endpoint("memory", {}) is None


# -- ale task show, ale key show ----------------------------------------------------


def test_task_show_prints_variants_and_prompts() -> None:
    from ale.cli.main import app

    res = runner.invoke(app, ["task", "show", str(ROOT / "examples/tasks/gui/click_button")])
    assert res.exit_code == 0, res.output
    assert "variant 0: gui/click_button  [desktop]" in res.stdout and "Press its 'Launch' button" in res.stdout
    res = runner.invoke(app, ["task", "show", str(ROOT / "examples/tasks/files/word_count"), "--json"])
    doc = json.loads(res.stdout)
    assert doc["variants"] and all(v["prompt"] for v in doc["variants"])


def test_key_show_prints_the_key_verify_takes(tmp_path: Path) -> None:
    from ale.cli.main import app
    from ale.record.signing import load_or_create_signing_key, public_key_pem

    key = tmp_path / "k.pem"
    res = runner.invoke(app, ["key", "show", "--signing-key", str(key), "-o", str(tmp_path / "pub.pem")])
    assert res.exit_code == 0, res.output
    pem = public_key_pem(load_or_create_signing_key(key)).decode()
    assert pem.strip() in res.stdout and (tmp_path / "pub.pem").read_text() == pem
