"""`ale verify` on whole run folders: a sealed run verifies anywhere; every kind of
tampering or unsupported claim is caught and named."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ale import layout
from ale.cli.verify import verify_command
from ale.record import evidence as ev
from ale.record.signing import public_key_pem
from ale.record.verify import VerifyReport, verify_run_dir
from tests.evidence_fixtures import RunFolder, build_run_folder, load_fixture, requires_captures

pytestmark = requires_captures


@pytest.fixture
def run(tmp_path: Path) -> RunFolder:
    return build_run_folder(tmp_path / "runs" / "r1")


def verify(rf: RunFolder, *, operator_key: bool = True) -> VerifyReport:
    return verify_run_dir(rf.run_dir, rf.public_key_path if operator_key else None)


def assert_invalid(report: VerifyReport, *needles: str) -> None:
    assert report.usable and not report.valid and report.exit_code == 1, report.reasons
    text = "\n".join(report.reasons)
    for n in needles:
        assert n in text, f"{n!r} not named in:\n{text}"


# -- a sealed run --------------------------------------------------------------------
def test_sealed_run_verifies(run: RunFolder) -> None:
    report = verify(run)
    assert report.reasons == []
    assert report.valid and report.usable and report.exit_code == 0
    assert report.run_id == run.run_id and report.status == "scored"
    assert "--public-key" in report.key_source
    ids = {c["id"] for c in report.checks}
    # The isolation policy really ran on the stored captures and probes.
    assert {"net.mode_none", "capture.identical", "probe.cap_eff_zero", "ws.empty_at_start", "times.order"} <= ids
    assert {c.get("phase") for c in report.checks} >= {"inspect-before", "inspect-after", "probes-before", "probes-after"}
    assert all(c["ok"] is True for c in report.checks)


def test_recorded_key_verifies_and_says_what_it_proves(run: RunFolder) -> None:
    report = verify(run, operator_key=False)
    assert report.valid
    assert "not who signed them" in report.key_source


def test_a_copy_elsewhere_verifies(run: RunFolder, tmp_path: Path) -> None:
    copy_dir = tmp_path / "elsewhere" / "copied-run"
    shutil.copytree(run.run_dir, copy_dir)
    shutil.rmtree(run.run_dir)
    shutil.rmtree(run.run_dir.parent / f".scratch-{run.run_dir.name}")
    report = verify_run_dir(copy_dir, run.public_key_path)
    assert report.valid, report.reasons


def test_verify_needs_no_docker(run: RunFolder) -> None:
    code = (
        "import sys\n"
        "sys.modules['docker'] = None  # any import of docker now fails\n"
        "from pathlib import Path\n"
        "from ale.record.verify import verify_run_dir\n"
        f"r = verify_run_dir(Path({str(run.run_dir)!r}), Path({str(run.public_key_path)!r}))\n"
        "assert r.valid, r.reasons\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- tampering after signing -----------------------------------------------------------
def test_changed_score_is_caught(run: RunFolder) -> None:
    run.edit_json("result.json", lambda d: d.update(score=1.0))
    assert_invalid(verify(run), "result.json changed after signing", "disagrees with the signed statement on score")


def test_changed_score_with_a_consistent_mean_is_still_caught(run: RunFolder) -> None:
    run.edit_json("result.json", lambda d: d.update(score=1.0, scores=[1.0, 1.0]))
    assert_invalid(verify(run), "file.result.json", "result.json disagrees with the signed statement on score, scores")


def test_removed_event_line_is_caught(run: RunFolder) -> None:
    p = run.rel("events.jsonl")
    lines = p.read_text().splitlines(keepends=True)
    del lines[2]
    p.write_text("".join(lines))
    assert_invalid(
        verify(run),
        "events.jsonl changed after signing",
        "events.jsonl:3: seq 4 follows seq 2: 1 event(s) missing",
        "events.jsonl does not end where the signed statement says",
    )


def test_edited_inspect_file_is_caught(run: RunFolder) -> None:
    run.edit_json("evidence/inspect-before.json", lambda d: d["HostConfig"].update(NetworkMode="bridge"))
    report = verify(run)
    assert_invalid(report, "evidence/inspect-before.json changed after signing",
                   "the evidence shows a violation, yet the status is scored: [inspect-before] net.mode")


def test_swapped_deliverable_is_caught(run: RunFolder) -> None:
    run.rel("deliverables/report.txt").write_text("total: 4\n")
    assert_invalid(verify(run), "deliverables/report.txt changed after signing",
                   "report.txt differs from deliverables.json")


def test_wrong_public_key_is_caught(run: RunFolder, tmp_path: Path) -> None:
    other = tmp_path / "other.pem"
    other.write_bytes(public_key_pem(Ed25519PrivateKey.generate()))
    report = verify_run_dir(run.run_dir, other)
    assert_invalid(report, "signature.valid: no signature verifies with public key")
    assert str(other) in report.key_source


def test_resigned_forgery_passes_only_the_recorded_key(run: RunFolder) -> None:
    """Whoever holds the folder can re-sign it with a key of their own: the recorded
    key then verifies the signature, the operator's key does not."""
    run.edit_json("result.json", lambda d: d.update(score=1.0, scores=[1.0, 1.0]))
    for name in (layout.MANIFEST, layout.ATTESTATION, layout.PUBLIC_KEY):
        run.rel(name).unlink()
    ev.write_manifest_and_sign(run.run_dir, Ed25519PrivateKey.generate())
    own = verify(run, operator_key=False)
    # The signature and digests now agree; only the hash-chained log still tells.
    assert own.reasons == ["events.run_end: the run.end event records another status or score than result.json"]
    assert_invalid(verify(run), "no signature verifies with public key")


def test_missing_evidence_file_is_caught(run: RunFolder) -> None:
    run.rel("evidence/probes-after.txt").unlink()
    assert_invalid(
        verify(run),
        "evidence/probes-after.txt is listed in the signed statement but missing",
        "evidence/probes-after.txt is missing, yet the run reports a graded outcome",
    )


def test_extra_file_is_caught(run: RunFolder) -> None:
    run.rel("evidence/notes.txt").write_text("added later")
    assert_invalid(verify(run), "evidence/notes.txt is not listed in the signed statement")


def test_extra_deliverable_is_caught(run: RunFolder) -> None:
    run.rel("deliverables/answer.txt").write_text("42")
    assert_invalid(verify(run), "deliverables/answer.txt is not listed", "answer.txt is in deliverables/ but not listed")


def test_edited_manifest_is_caught(run: RunFolder) -> None:
    run.edit_json("manifest.json", lambda d: d.update({"result.json": "00" * 32}))
    assert_invalid(verify(run), "manifest.json disagrees with the signed statement on: result.json")


def test_removed_signature_is_caught(run: RunFolder) -> None:
    run.rel(layout.ATTESTATION).unlink()
    assert_invalid(verify(run), "attestation.dsse.json is missing")


@pytest.mark.parametrize("name", [layout.ATTESTATION, layout.MANIFEST])
@pytest.mark.parametrize("value", [None, [], "x", {}])
def test_hollowed_seal_is_caught(run: RunFolder, name: str, value) -> None:
    run.rel(name).write_text(json.dumps(value))
    report = verify(run)
    assert report.usable and not report.valid, report.reasons


def test_symlink_in_the_folder_is_caught(run: RunFolder) -> None:
    run.rel("deliverables/report.txt").unlink()
    run.rel("deliverables/report.txt").symlink_to("/etc/hostname")
    assert_invalid(verify(run), "deliverables/report.txt is a symlink or special file")


# -- authentic records whose claims the evidence does not support --------------------------
def test_scored_run_with_a_violation_in_its_evidence_is_invalid(tmp_path: Path) -> None:
    bad = copy.deepcopy(load_fixture("inspect_good.json"))
    bad["HostConfig"]["MemorySwap"] = -1
    rf = build_run_folder(tmp_path / "r", inspect_before=bad)
    assert_invalid(verify(rf), "[inspect-before] mem.swap_eq_mem", "yet the status is scored")


def test_scored_run_with_a_failed_probe_is_invalid(tmp_path: Path) -> None:
    raw = load_fixture("probe_good.txt").replace("NoNewPrivs:\t1", "NoNewPrivs:\t0")
    rf = build_run_folder(tmp_path / "r", probes_after=raw)
    assert_invalid(verify(rf), "[probes-after] probe.no_new_privs")


def test_honest_invalid_run_verifies_and_shows_its_violations(tmp_path: Path) -> None:
    bad = copy.deepcopy(load_fixture("inspect_good_after.json"))
    bad["HostConfig"]["NetworkMode"] = "bridge"
    rf = build_run_folder(
        tmp_path / "r", status="invalid_evaluation_environment", scores=None,
        inspect_after=bad, violations=["[inspect-after] net.mode: expected 'none', observed 'bridge'"],
    )
    report = verify(rf)
    assert report.valid, report.reasons
    failing = {(c.get("phase"), c["id"]) for c in report.checks if c["ok"] is not True}
    assert ("inspect-after", "net.mode_none") in failing
    assert ("inspect-after", "capture.identical") in failing
    assert any("confirms the run's status" in n for n in report.notes)


def test_invalid_run_with_a_score_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", status="invalid_evaluation_environment", scores=[1.0],
                          violations=["[x] y: z"])
    assert_invalid(verify(rf), "an invalid_evaluation_environment run carries a score")


def test_score_that_is_not_the_mean_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", scores=[1.0, 0.5], score=0.9)
    assert_invalid(verify(rf), "score 0.9 is not the mean of scores [1.0, 0.5]")


def test_violation_listed_in_a_scored_result_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", violations=["[agent-start] ws.same_inode: replaced"])
    assert_invalid(verify(rf), "result.json lists a violation, yet the status is scored")


def _edit(rel: str, fn):
    def apply(run_dir: Path) -> None:
        p = run_dir / rel
        data = json.loads(p.read_text())
        fn(data)
        p.unlink()
        p.write_text(json.dumps(data))

    return apply


def test_reference_unpacked_before_the_container_finished_is_invalid(tmp_path: Path) -> None:
    after = load_fixture("inspect_good_after.json")
    rf = build_run_folder(tmp_path / "r", before_sign=_edit(
        "evidence/reference-check.json", lambda d: d.update(unpacked_at=after["State"]["StartedAt"])))
    assert_invalid(verify(rf), "container finished (", "is not before reference unpacked")


def test_reference_committed_after_the_agent_started_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", before_sign=_edit(
        "evidence/reference-commit.json", lambda d: d.update(committed_at="2099-01-01T00:00:00+00:00")))
    assert_invalid(verify(rf), "the reference was not committed before the agent started")


def test_reference_digest_mismatch_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", before_sign=_edit(
        "evidence/reference-check.json", lambda d: d.update(source_sha256="ff" * 32)))
    assert_invalid(verify(rf), "reference.digest: the reference checked before unpacking differs")


def test_changed_input_in_a_scored_run_is_invalid(tmp_path: Path) -> None:
    def change(d: dict) -> None:
        d["files"]["brief.md"]["sha256"] = "00" * 32
        d["digest"] = ev.tree_hash_digest(d)

    rf = build_run_folder(tmp_path / "r", before_sign=_edit("evidence/input-after-run.json", change))
    assert_invalid(verify(rf), "[after-run] input.unchanged: expected", "(changed ['brief.md'])")


def test_input_listing_that_does_not_match_its_digest_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", before_sign=_edit(
        "evidence/input-after-start.json", lambda d: d["files"].pop("brief.md")))
    assert_invalid(verify(rf), "evidence/input-after-start.json: its digest does not match its own listing")


def test_workspace_not_empty_at_agent_start_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", before_sign=_edit(
        "evidence/workspace-empty.json",
        lambda d: d["at_agent_start"]["entries"].append({"name": "planted.txt", "mode": "0o100644", "size": 1})))
    assert_invalid(verify(rf), "[workspace-at-agent-start] ws.empty_at_start")


def test_unredacted_agent_secret_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", before_sign=_edit(
        "evidence/agent.json", lambda d: d["config"].update(api_key="sk-live-abcdefghijklmnop")))
    assert_invalid(verify(rf), "evidence/agent.json holds unredacted secrets at ['config.api_key']")


def test_unsigned_run_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", sign=False)
    assert_invalid(verify(rf), "attestation.dsse.json is missing", "manifest.json is missing")


# -- unusable input and the command ------------------------------------------------------
def test_not_a_run_folder_is_unusable(tmp_path: Path) -> None:
    assert verify_run_dir(tmp_path / "missing").exit_code == 2
    (tmp_path / "empty").mkdir()
    report = verify_run_dir(tmp_path / "empty")
    assert not report.usable and report.exit_code == 2
    assert "not a run folder" in report.reasons[0]


def test_unreadable_json_is_unusable(run: RunFolder) -> None:
    run.rel("evidence/inspect-after.json").write_text("{ not json")
    report = verify(run)
    assert not report.usable and report.exit_code == 2
    assert any("evidence/inspect-after.json is not readable JSON" in r for r in report.reasons)


def test_unreadable_public_key_is_unusable(run: RunFolder, tmp_path: Path) -> None:
    report = verify_run_dir(run.run_dir, tmp_path / "no-such.pem")
    assert report.exit_code == 2 and "--public-key" in report.reasons[0]


def test_command_exit_codes_and_json(run: RunFolder, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert verify_command(run.run_dir, True, run.public_key_path) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is True and out["run_id"] == run.run_id and out["reasons"] == []
    assert verify_command(run.run_dir, False, None) == 0
    assert "VALID" in capsys.readouterr().out
    run.edit_json("result.json", lambda d: d.update(score=1.0))
    assert verify_command(run.run_dir, False, run.public_key_path) == 1
    text = capsys.readouterr().out
    assert "INVALID" in text and "result.json changed after signing" in text
    assert verify_command(tmp_path / "nothing", True, None) == 2
    assert json.loads(capsys.readouterr().out)["usable"] is False


def test_signed_but_malformed_records_fail_closed(run: RunFolder, tmp_path: Path) -> None:
    """A record of the wrong shape, even one the operator signed, never verifies
    and never crashes the verifier."""
    names = sorted(
        p.relative_to(run.run_dir).as_posix() for p in run.run_dir.rglob("*.json")
        if p.name not in (layout.MANIFEST, layout.ATTESTATION)
    ) + ["events.jsonl", "evidence/probes-before.txt"]
    for i, name in enumerate(names):
        for j, value in enumerate((None, [1], {"files": {"a": 1}, "State": 1, "source": 1})):
            d = tmp_path / f"case-{i}-{j}"
            shutil.copytree(run.run_dir, d)
            for sealed in (layout.MANIFEST, layout.ATTESTATION, layout.PUBLIC_KEY):
                (d / sealed).unlink()
            (d / name).write_text(json.dumps(value) + "\n")
            try:
                ev.write_manifest_and_sign(d, run.key)
            except ev.EvidenceError:
                assert name in ("result.json", "events.jsonl")  # signing refuses these itself
            report = verify_run_dir(d, run.public_key_path)
            assert not report.valid, (name, value)
            shutil.rmtree(d)


def test_agent_with_more_tools_than_planned_is_invalid(tmp_path: Path) -> None:
    rf = build_run_folder(tmp_path / "r", before_sign=_edit(
        "evidence/agent.json", lambda d: d["allowlist"].append("network")))
    assert_invalid(verify(rf), "agent.allowlist: evidence/agent.json does not record the planned agent")


def test_missing_run_time_checks_are_invalid(tmp_path: Path) -> None:
    def drop(run_dir: Path) -> None:
        p = run_dir / "evidence/checks.json"
        kept = [c for c in json.loads(p.read_text()) if c["phase"] != "probes-before"]
        p.unlink()
        p.write_text(json.dumps(kept))

    rf = build_run_folder(tmp_path / "r", before_sign=drop)
    assert_invalid(verify(rf), "the harness recorded no probes-before checks at run time")
