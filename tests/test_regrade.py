"""`ale regrade`: a finished run graded again from its signed deliverables, the new
grading appended and signed, the original kept; refused when the record or the data
does not match what the run committed. Real Docker (a tiny experiment, run once)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ale import layout
from ale.cli.main import app
from ale.record import regrades as rg
from ale.record.verify import verify_run_dir
from ale.runs.regrade import latest_grading, map_task
from ale.status import RunStatus
from tests.regrade_rig import Finished, finished_experiment, run_experiment, write_task_tree

__all__ = ["finished_experiment"]  # the session fixture, imported for pytest

pytestmark = pytest.mark.docker
runner = CliRunner()


def _regrade(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["regrade", *args])
    return res.exit_code, res.output


def test_regrade_after_a_grader_change(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    run = finished_experiment.run_dir(exp, "oracle")
    original = (run / layout.RESULT).read_bytes()
    assert latest_grading(run).score == 0.5 and latest_grading(run).regrade is None
    fixed = write_task_tree(tmp_path / "fixed", 1.0)  # the repaired grader: full credit for the right answer

    code, out = _regrade(str(run), "--tasks", str(fixed), "--reason", "grader repaired for v1.1")
    assert code == 0, out
    assert "scored 0.5 -> scored 1.0" in out
    grading = latest_grading(run)
    assert (grading.status, grading.score, grading.scores) == (RunStatus.SCORED, 1.0, [1.0])
    record = grading.regrade
    assert record is not None
    assert record["old"]["score"] == 0.5 and record["new"]["score"] == 1.0  # the old one stays, beside the new
    assert record["reason"] == "grader repaired for v1.1"
    assert record["task"]["dir_new"] == str(fixed / "demo" / "tiny")
    assert record["task"]["code_sha256_old"] != record["task"]["code_sha256_new"]
    assert (run / layout.RESULT).read_bytes() == original  # the run's own record is untouched
    report = verify_run_dir(run)
    assert report.valid, report.reasons
    assert report.latest_grading is not None and report.latest_grading["score"] == 1.0

    # a second regrade chains to the first, with the task code as it is now
    code, out = _regrade(str(run), "--reason", "back to the original code")
    assert code == 0, out
    assert latest_grading(run).score == 0.5
    assert rg.regrade_numbers(run) == [1, 2]
    assert verify_run_dir(run).valid


def test_a_tampered_regrade_fails_verification(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    run = finished_experiment.run_dir(exp, "oracle")
    fixed = write_task_tree(tmp_path / "fixed", 1.0)
    assert _regrade(str(run), "--tasks", str(fixed))[0] == 0
    assert _regrade(str(run))[0] == 0

    # the score raised by hand in the record
    edited = tmp_path / "edited"
    shutil.copytree(run, edited)
    rec = rg.regrade_dir(edited, 2) / rg.REGRADE_RECORD
    doc = json.loads(rec.read_text())
    doc["new"]["score"], doc["new"]["scores"] = 1.0, [1.0]
    rec.write_text(json.dumps(doc))
    report = verify_run_dir(edited)
    assert not report.valid and any("regrades/2/regrade.json changed" in r for r in report.reasons), report.reasons

    # a regrade removed from the middle of the chain
    removed = tmp_path / "removed"
    shutil.copytree(run, removed)
    shutil.rmtree(rg.regrade_dir(removed, 1))
    report = verify_run_dir(removed)
    assert not report.valid and any("numbered" in r or "chain" in r for r in report.reasons), report.reasons

    # a stray file next to the regrades
    stray = tmp_path / "stray"
    shutil.copytree(run, stray)
    (stray / rg.REGRADES_DIR / "3").mkdir()
    (stray / rg.REGRADES_DIR / "3" / rg.REGRADE_RECORD).write_text("{}")
    assert not verify_run_dir(stray).valid


def test_regrade_refused_when_the_deliverables_were_tampered(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    run = finished_experiment.run_dir(exp, "nop")
    (run / layout.DELIVERABLES_DIR).mkdir(exist_ok=True)
    (run / layout.DELIVERABLES_DIR / "answer.txt").write_text("42")  # the right answer, slipped in afterwards
    code, out = _regrade(str(run), "--tasks", str(write_task_tree(tmp_path / "fixed", 1.0)))
    assert code == 1
    assert "does not verify" in out and "added after signing" in out, out
    assert not (run / rg.REGRADES_DIR).exists()  # nothing appended


def test_regrade_refused_when_the_reference_changed(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    run = finished_experiment.run_dir(exp, "oracle")
    ref = finished_experiment.data / "tasks" / "demo" / "tiny" / "base" / "reference" / "answer.txt"
    before = ref.read_text()
    ref.write_text("43\n")
    try:
        code, out = _regrade(str(run))
    finally:
        ref.write_text(before)
    assert code == 1
    assert layout.evidence_path(layout.Evidence.REFERENCE_COMMIT) in out, out
    assert not (run / rg.REGRADES_DIR).exists()


def test_regrade_refused_when_the_input_changed(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    run = finished_experiment.run_dir(exp, "oracle")
    doc = finished_experiment.data / "tasks" / "demo" / "tiny" / "base" / "input" / "question.txt"
    before = doc.read_text()
    doc.write_text("What is six times nine?\n")
    try:
        code, out = _regrade(str(run))
    finally:
        doc.write_text(before)
    assert code == 1
    assert layout.evidence_path(layout.Evidence.INPUT_AFTER_START) in out and "question.txt" in out, out


def test_regrade_an_experiment_rewrites_its_report(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    fixed = write_task_tree(tmp_path / "fixed", 1.0)
    res = runner.invoke(app, ["regrade", str(exp), "--tasks", str(fixed), "--reason", "v1.1", "--json"])
    assert res.exit_code == 0, res.output
    done = json.loads(res.stdout)
    assert len(done["regraded"]) == 2 and not done["refused"]
    report = json.loads((exp / layout.REPORT_JSON).read_text())
    means = {a["agent"]: a["mean"] for a in report["agents"]}
    assert means == {"oracle": 1.0, "nop": 0.0}
    assert report["regrades"]["runs"] == 2 and list(report["regrades"]["task_code"].values()) == [2]


def test_a_run_charged_for_a_broken_grader_is_regraded_once_it_is_fixed(tmp_path_factory, docker_client,
                                                                         tmp_path: Path) -> None:
    from ale.report.verify_experiment import experiment_report, verify_experiment
    from ale.sandbox.docker import remove_containers
    from ale.status import InvalidAttribution

    base = tmp_path_factory.mktemp("broken-grader")
    write_task_tree(base / "tasks", "1 / 0")  # the grader raises on every right answer
    name = run_experiment(base, tmp_path_factory.getbasetemp(), agents="[{name: oracle}]",
                          extra="limits: {grading_attempts: 1}\n")
    try:
        exp = base / "out"
        run = next(p for p in (exp / "runs").iterdir() if not p.name.startswith("."))
        before = latest_grading(run)
        assert before.status is RunStatus.GRADING_FAILED
        report, _ = experiment_report(exp)
        assert [r.run_id for r in report.flagged_runs] == [run.name]  # charged: 0 in the headline, flagged

        code, out = _regrade(str(exp), "--tasks", str(write_task_tree(tmp_path / "fixed", 1.0)), "--reason", "ZeroDivisionError")
        assert code == 0, out
        after = latest_grading(run)
        assert (after.status, after.score) == (RunStatus.SCORED, 1.0)
        assert after.regrade is not None
        assert after.regrade["old"]["invalid_attribution"] == InvalidAttribution.AFTER_AGENT_START
        report = json.loads((exp / layout.REPORT_JSON).read_text())
        assert report["flagged_runs"] == [] and report["agents"][0]["mean"] == 1.0
        assert verify_experiment(exp).valid
    finally:
        remove_containers(docker_client, experiment=name)


def test_map_task_finds_the_same_task_in_another_tree(tmp_path: Path) -> None:
    tree = write_task_tree(tmp_path / "v11", 1.0)
    assert map_task("/somewhere/else/tasks/demo/tiny", tree) == (tree / "demo" / "tiny").resolve()
    from ale.runs.regrade import RegradeRefused

    with pytest.raises(RegradeRefused):
        map_task("/somewhere/else/tasks/demo/other", tree)


def test_an_experiment_of_a_task_whose_start_writes_its_input_regrades_every_run(tmp_path_factory, docker_client,
                                                                                  tmp_path: Path) -> None:
    """``secrets/echo_secret``: load() draws a fresh secret, start() writes it into the
    input and the reference. Run again, start() would write another one; the run keeps
    what start() wrote (start/, signed) and the regrade stages it from there (issue 27,
    item 4)."""
    import os
    import subprocess
    import sys

    from ale.runs import start_writes
    from ale.sandbox.docker import remove_containers
    from tests.conftest import EXAMPLES

    base = tmp_path_factory.mktemp("echo-secret")
    shutil.copytree(EXAMPLES / "secrets" / "echo_secret", base / "tasks" / "secrets" / "echo_secret")
    shutil.copytree(EXAMPLES.parent / "data" / "tasks" / "secrets", base / "data" / "tasks" / "secrets")
    card = base / "tasks" / "secrets" / "echo_secret" / "task_card.json"
    card.write_text(card.read_text().replace('"local:../../../data"', f'"local:{base / "data"}"'))
    name = f"rg-secret-{os.getpid()}"
    (base / "exp.yaml").write_text(f"name: {name}\ntasks_root: tasks\nagents: [{{name: oracle}}, {{name: nop}}]\n"
                                   "tasks: [{path: secrets/echo_secret}]\nrepeats: 2\nconcurrency: 2\noutput: out\n")
    basetemp = tmp_path_factory.getbasetemp()
    env = {**os.environ, "ALE_CONFIG_DIR": str(basetemp / "ale-config"), "ALE_CACHE_DIR": str(basetemp / "ale-cache")}
    res = subprocess.run([sys.executable, "-m", "ale.cli.exp", "run", str(base / "exp.yaml"), "--plain"],
                         capture_output=True, text=True, timeout=900, env=env)
    try:
        assert res.returncode == 0, res.stderr[-3000:]
        exp = base / "out"
        runs = sorted(p for p in (exp / "runs").iterdir() if not p.name.startswith("."))
        assert len(runs) == 4
        secrets = set()
        for run in runs:
            kept = (run / start_writes.PUBLIC).rglob("secret.txt")
            (secret,) = kept  # what start() wrote into the input, kept in the run folder
            secrets.add(secret.read_text())
            assert (run / start_writes.REFERENCE / "expected.txt").read_text() == secret.read_text()
            manifest = json.loads((run / layout.MANIFEST).read_text())
            assert f"{start_writes.REFERENCE}/expected.txt" in json.dumps(manifest)  # signed
        assert len(secrets) == 4  # a fresh secret per run: start() run again could not reproduce one

        res = runner.invoke(app, ["regrade", str(exp), "--reason", "echo_secret from the record", "--json"])
        assert res.exit_code == 0, res.output
        done = json.loads(res.stdout)
        assert len(done["regraded"]) == 4 and not done["refused"], done
        for run in runs:
            grading = latest_grading(run)
            want = 1.0 if "-oracle-" in run.name else 0.0
            assert (grading.status, grading.score) == (RunStatus.SCORED, want), run.name
            assert verify_run_dir(run).valid
            events = (rg.regrade_dir(run, 1) / layout.EVENTS).read_text()
            assert "the run's record (start/)" in events

        # a kept write edited afterwards: the run no longer verifies, nothing regrades
        run = runs[0]
        (next((run / start_writes.PUBLIC).rglob("secret.txt"))).write_text("ALE-SECRET-forged\n")
        code, out = _regrade(str(run))
        assert code == 1 and "does not verify" in out, out
    finally:
        remove_containers(docker_client, experiment=name)
