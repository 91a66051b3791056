"""`ale exp run --dry-run`, validation errors, `status`, and `report` formats."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from pathlib import Path

import typer
from typer.testing import CliRunner

from ale.cli.exp import exp_app, report_command

runner = CliRunner()


def exp_file(tmp: Path, extra: str = "") -> Path:
    for t in ("a", "b"):
        (tmp / "tasks" / t).mkdir(parents=True, exist_ok=True)
        (tmp / "tasks" / t / "main.py").write_text("def load():\n    return [{'description': 'do it'}]\n\n\ndef evaluate(cfg, session):\n    return [1.0]\n")
    f = tmp / "exp.yaml"
    f.write_text(textwrap.dedent("""\
        name: cli
        tasks_root: tasks
        agents: [{name: oracle}, {name: nop}]
        tasks: [a, b]
        output: out
    """) + extra)
    return f


def test_dry_run_lists_runs(tmp_path: Path) -> None:
    res = runner.invoke(exp_app, ["run", str(exp_file(tmp_path)), "--dry-run"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert [ln.split("\t")[0] for ln in lines[:4]] == ["a-v0-oracle-r0", "a-v0-nop-r0", "b-v0-oracle-r0", "b-v0-nop-r0"]
    assert "4 run(s) planned" in res.output
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_invalid_file_exits_2_with_message(tmp_path: Path) -> None:
    res = runner.invoke(exp_app, ["run", str(exp_file(tmp_path, "concurency: 3\n")), "--dry-run"])
    assert res.exit_code == 2
    assert "unknown key 'concurency'" in res.output and "did you mean 'concurrency'" in res.output


def _finished_experiment(tmp_path: Path) -> Path:
    import asyncio

    from ale.runs.experiment import load_experiment
    from ale.runs.orchestrator import Orchestrator
    from ale.status import RunStatus
    from tests.test_exp_orchestrator import FakeJanitor, FakeRunner

    exp = load_experiment(exp_file(tmp_path))
    outcome = {"oracle": (RunStatus.SCORED, 1.0), "nop": (RunStatus.INVALID_EVALUATION_ENVIRONMENT, None)}
    asyncio.run(Orchestrator(exp, runner=FakeRunner(lambda p: outcome[p.agent.name]), janitor=FakeJanitor()).run())
    return exp.output_dir


def test_status_and_report_formats(tmp_path: Path) -> None:
    out = _finished_experiment(tmp_path)
    res = runner.invoke(exp_app, ["status", str(out)])
    assert res.exit_code == 0, res.output
    assert "invalid_evaluation_environment" in res.stdout and "4 / 4" in res.stdout and "not running" in res.output

    app = typer.Typer()
    app.command()(report_command)
    res = runner.invoke(app, [str(out), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["experiment"] == "cli"
    assert [(a["agent"], a["mean"], a["counted"]) for a in data["agents"]] == [("nop", None, 0), ("oracle", 1.0, 2)]
    assert len(data["invalid_runs"]) == 2 and data["tiers"]["near-term"] == ["a@v0", "b@v0"]

    res = runner.invoke(app, [str(out), "--csv"])
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"scored", "invalid_evaluation_environment"}

    html = tmp_path / "elsewhere" / "r.html"
    res = runner.invoke(app, [str(out), "--html", str(html), "--threshold", "1.0"])
    assert res.exit_code == 0, res.output
    text = html.read_text()
    assert 'href="../out/runs/a-v0-oracle-r0-a1/trajectory.json"' in text and "pass rate ≥ 1" in text

    res = runner.invoke(app, [str(out)])
    assert res.exit_code == 0 and "oracle" in res.stdout and "2 invalid run(s)" in res.stdout

    res = runner.invoke(app, [str(tmp_path / "missing")])
    assert res.exit_code == 2
