"""``ALE_QEMU_BOOT=warm``: VMs restored from a booted guest saved once per shape
(``ale.sandbox.qemu.warm``) instead of booted. The runs score and seal as booted ones
do, the saved state's disk is judged as a read-only layer between the overlay and the
base, clones do not share a clock or a random state, and nothing outlives a run."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, Limits, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.policy import MIB, IsolationPolicy
from ale.sandbox.qemu.provider import QemuProvider
from ale.sandbox.qemu.sandbox import state_root
from ale.status import RunStatus
from tests.conftest import EXAMPLES
from tests.qemu_support import qemu_processes, use_built_guest

POLICY = IsolationPolicy(memory_bytes=768 * MIB, cpus=1.0)
PROBE = ("date +%s; cat /proc/sys/kernel/random/uuid; python3 -c 'import random; print(random.getrandbits(64))'; "
         "cat /proc/sys/kernel/random/boot_id")


@pytest.fixture(autouse=True)
def _vm(monkeypatch):
    use_built_guest(monkeypatch)


def _run(tmp_path: Path, agent: str, config: dict | None = None) -> tuple[RunPlan, object]:
    plan = RunPlan(run_id=f"w-{uuid.uuid4().hex[:12]}", task_dir=str(EXAMPLES / "files/word_count"), variant=0,
                   agent=AgentSpec(name=agent, config=config or {}), image="ale-vm:latest", policy=POLICY,
                   limits=Limits(), runs_dir=str(tmp_path), provider="qemu")
    result = asyncio.run(execute_run(plan, provider=QemuProvider(accel="tcg", boot="warm")))
    assert not [c for c in qemu_processes() if plan.run_id in c], "a qemu process outlived its run"
    left = [p for p in state_root().glob("*/labels.json") if plan.run_id in p.read_text()] if state_root().is_dir() else []
    assert left == [], f"a VM state folder (overlay) outlived its run: {left}"
    return plan, result


def _events(plan: RunPlan, name: str) -> list[dict]:
    lines = (plan.run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == name or e.get("type") == name or e.get("name") == name]


def test_restored_runs_score_seal_and_verify(tmp_path):
    oracle_plan, oracle = _run(tmp_path, "oracle")
    assert oracle.status is RunStatus.SCORED and oracle.scores and all(s == 1.0 for s in oracle.scores), \
        (oracle.status, oracle.error, oracle.violations)
    nop_plan, nop = _run(tmp_path, "nop")
    assert nop.status is RunStatus.SCORED and nop.score == 0.0, (nop.status, nop.error)
    for plan in (oracle_plan, nop_plan):
        report = verify_run_dir(plan.run_dir)
        assert report.valid, report.reasons
        exp = json.loads((plan.run_dir / "evidence" / "vm-expectation.json").read_text())
        (layer,) = exp["layers"]
        assert layer["path"].endswith("/disk.qcow2") and exp["restored_from"]["state_sha256"]
        checks = {c["id"]: c for c in report.checks}
        assert checks.get("vm.disk.overlay_top", {}).get("passed", True) is not False
        engine = json.loads((plan.run_dir / "evidence" / "engine.json").read_text())
        assert engine["boot"] == "warm"


def test_clones_have_the_hosts_clock_and_their_own_random_state(tmp_path):
    outs = []
    for _ in range(2):
        plan, result = _run(tmp_path, "replay", {"steps": [{"tool": "shell", "args": {"command": PROBE}}]})
        assert result.status is RunStatus.SCORED, (result.status, result.error, result.violations)
        step = json.loads((plan.run_dir / "trajectory.json").read_text())["steps"][0]
        assert step["exit_code"] == 0, step
        outs.append(step["stdout"].split())
        started = json.loads((plan.run_dir / "result.json").read_text())
        assert started
    import time

    for out in outs:
        assert abs(int(out[0]) - time.time()) < 600, out  # the clock is the host's, not the save's
    assert outs[0][1] != outs[1][1] and outs[0][2] != outs[1][2], outs  # fresh entropy in each clone


def test_an_edited_layer_digest_fails_verification(tmp_path):
    from ale.record import evidence as ev
    from ale.record.signing import load_or_create_signing_key

    plan, result = _run(tmp_path, "nop")
    assert result.status is RunStatus.SCORED
    path = plan.run_dir / "evidence" / "vm-before.json"
    doc = json.loads(path.read_text())
    doc["layer_sha256"] = {k: "0" * 64 for k in doc["layer_sha256"]}
    path.write_text(json.dumps(doc))
    for name in ("manifest.json", "attestation.dsse.json"):
        (plan.run_dir / name).unlink()
    ev.write_manifest_and_sign(plan.run_dir, load_or_create_signing_key(None))  # re-signed: only the capture lies
    report = verify_run_dir(plan.run_dir)
    assert not report.valid and any("vm.disk.base_digest" in r for r in report.reasons), report.reasons


def test_a_saved_state_that_changed_is_never_run(tmp_path):
    """The state's bytes are hashed as they stream into QEMU: other bytes than were saved
    end the run before the agent (an infrastructure error, retried) and the state is
    removed, so the next warm run saves it again."""
    import os
    import stat

    global POLICY
    saved, POLICY = POLICY, IsolationPolicy(memory_bytes=640 * MIB, cpus=1.0)  # a shape of its own
    try:
        plan, result = _run(tmp_path, "nop")
        assert result.status is RunStatus.SCORED, (result.status, result.error)
        exp = json.loads((plan.run_dir / "evidence" / "vm-expectation.json").read_text())
        state = Path(exp["restored_from"]["state"])
        os.chmod(state, stat.S_IWUSR | stat.S_IRUSR)
        with open(state, "r+b") as f:
            f.seek(4096)
            b = f.read(1)
            f.seek(4096)
            f.write(bytes([b[0] ^ 0xFF]))
        plan, result = _run(tmp_path, "nop")
        assert result.status is RunStatus.INFRASTRUCTURE_ERROR and "as saved" in (result.error or ""), \
            (result.status, result.error)
        assert not state.parent.exists()
        plan, result = _run(tmp_path, "nop")  # saved again
        assert result.status is RunStatus.SCORED, (result.status, result.error)
    finally:
        POLICY = saved


def test_cleanup_removes_a_save_a_crash_left_half_made(tmp_path, monkeypatch):
    from ale.sandbox.qemu import warm

    monkeypatch.setenv("ALE_VM_DIR", str(tmp_path))
    (tmp_path / "warm").mkdir()
    crashed = tmp_path / "warm" / ".aaaaaaaaaaaa-x1"
    crashed.mkdir()
    (crashed / "state.bin").write_bytes(b"half")
    busy = tmp_path / "warm" / ".bbbbbbbbbbbb-x2"
    busy.mkdir()
    held = warm._lock("bbbbbbbbbbbb")  # a save being made now, by another process
    try:
        removed = QemuProvider(accel="tcg").remove_managed()
    finally:
        held.close()
    assert any(str(crashed) in r for r in removed) and not crashed.exists()
    assert busy.exists()
