"""`ale verify EXP_DIR`: every run verified, every figure of the stored report
re-derived from the verified runs and compared; an edited report, a removed run and
a tampered run are each named. Works on a copied folder, offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ale import layout
from ale.cli.main import app
from ale.record.signing import load_or_create_signing_key, public_key_pem
from ale.report.verify_experiment import verify_experiment
from tests.regrade_rig import Finished, finished_experiment

__all__ = ["finished_experiment"]  # the session fixture, imported for pytest

pytestmark = pytest.mark.docker
runner = CliRunner()


def _verify(exp: Path, *extra: str) -> tuple[int, str]:
    res = runner.invoke(app, ["verify", str(exp), *extra])
    return res.exit_code, res.output


def test_an_intact_experiment_verifies(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)  # a copy, elsewhere: nothing but its files
    code, out = _verify(exp)
    assert code == 0, out
    assert "VALID experiment" in out and "2 run(s) verify" in out
    result = verify_experiment(exp)
    assert result.valid and result.figures > 50 and all(result.runs.values())


def test_trusted_keys_accept_the_signer(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    pem = tmp_path / "trusted.pem"
    pem.write_bytes(public_key_pem(load_or_create_signing_key(None)))
    code, out = _verify(exp, "--trusted-keys", str(pem))
    assert code == 0, out
    other = tmp_path / "other.pem"
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other.write_bytes(public_key_pem(Ed25519PrivateKey.generate()))
    code, out = _verify(exp, "--trusted-keys", str(other))
    assert code == 1 and "does not verify" in out, out


def test_an_edited_report_is_caught(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    path = exp / layout.REPORT_JSON
    doc = json.loads(path.read_text())
    nop = next(a for a in doc["agents"] if a["agent"] == "nop")
    nop["mean"] = 0.9  # a better number for the nop agent
    path.write_text(json.dumps(doc, indent=2))
    code, out = _verify(exp)
    assert code == 1
    first = out.split("first difference:", 1)[1]
    assert first.lstrip().startswith("agents[nop].mean") and "0.9" in first and "edited by hand" in first, out


def test_an_edited_pass_at_k_or_tier_is_caught(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    path = exp / layout.REPORT_JSON
    doc = json.loads(path.read_text())
    doc["tiers"] = {k: [] for k in doc["tiers"]}
    path.write_text(json.dumps(doc))
    result = verify_experiment(exp)
    assert not result.valid and result.problems[0].startswith("tiers."), result.problems


def test_a_removed_run_is_caught(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    run = finished_experiment.run_dir(exp, "nop")  # the run that pulls the experiment's numbers down
    shutil.rmtree(run)
    code, out = _verify(exp)
    assert code == 1
    first = out.split("first difference:", 1)[1]
    assert f"runs[{run.name}]" in first and "was removed" in first, out


def test_a_tampered_run_is_caught(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    run = finished_experiment.run_dir(exp, "oracle")
    result = json.loads((run / layout.RESULT).read_text())
    result["score"], result["scores"] = 1.0, [1.0]
    (run / layout.RESULT).write_text(json.dumps(result))
    code, out = _verify(exp)
    assert code == 1
    first = out.split("first difference:", 1)[1]
    assert f"runs[{run.name}]" in first and "no longer verifies" in first, out


def test_no_stored_report_fails(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    (exp / layout.REPORT_JSON).unlink()
    code, out = _verify(exp)
    assert code == 1 and "report.json is missing" in out.replace("\n", " "), out


def test_a_report_from_before_regrades_still_verifies(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    path = exp / layout.REPORT_JSON
    doc = json.loads(path.read_text())
    del doc["regrades"]  # written before regrades existed; no run was regraded since
    path.write_text(json.dumps(doc))
    assert verify_experiment(exp).valid
    del doc["counts_by_status"]
    path.write_text(json.dumps(doc))
    result = verify_experiment(exp)
    assert not result.valid and "another ale version" in result.problems[0], result.problems


def test_an_edited_cost_sum_is_caught(finished_experiment: Finished, tmp_path: Path) -> None:
    exp = finished_experiment.copy(tmp_path)
    path = exp / layout.REPORT_JSON
    doc = json.loads(path.read_text())
    nop = next(a for a in doc["agents"] if a["agent"] == "nop")
    nop["usage"] = {"requests": 3, "cost_usd": 1.5}  # the runs' records bill nothing
    doc["usage_all_attempts"] = {"cost_usd": 0.25}
    path.write_text(json.dumps(doc))
    result = verify_experiment(exp)
    assert not result.valid
    assert any(p.startswith("agents[nop].usage") for p in result.problems), result.problems
    assert any(p.startswith("usage_all_attempts") for p in result.problems), result.problems
