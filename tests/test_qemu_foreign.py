"""A foreign disk under ``--provider qemu`` (``ale.sandbox.qemu.foreign``): the test disk
of ``ale image build --vm --foreign-test`` (its own MBR, syslinux and kernel, cua's
computer-server on guest port 5000, no ale agent) mapped to a task's vm.snapshot, booted
from a per-run overlay with restricted user-mode networking and one 127.0.0.1 forward.
Whole runs score as ale's own guest does (oracle 1.0, nop 0) and ``ale verify`` accepts
them; the same VM built wrong (unrestricted user-net, a guest-to-host forward, a forward
on every address) is rejected by the VM rules, in a paused QEMU and in a whole run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, Limits, RunPlan
from ale.runs.lifecycle import execute_run
from ale.sandbox.policy import MIB, IsolationPolicy
from ale.sandbox.qemu.provider import QemuProvider
from ale.sandbox.qemu.sandbox import state_root
from ale.status import RunStatus
from tests.conftest import EXAMPLES, in_ci, require
from tests.qemu_support import VM_DIR, qemu_processes

POLICY = IsolationPolicy(memory_bytes=768 * MIB, cpus=1.0)
SNAPSHOT = "cpu-free-ubuntu"


def _foreign_disk() -> Path | None:
    from ale.sandbox.qemu.foreign_disk import build_foreign_test_disk, find_foreign_test_disk

    if in_ci():  # the disk of this ale's scripts (cached by their content), never an older one
        return build_foreign_test_disk(say=lambda _m: None)
    return find_foreign_test_disk()


@pytest.fixture
def disk(monkeypatch) -> Path:
    monkeypatch.setenv("ALE_VM_DIR", VM_DIR)
    monkeypatch.setenv("ALE_QEMU_ACCEL", "tcg")
    require(shutil.which("qemu-system-x86_64") and shutil.which("qemu-img"), "needs qemu-system-x86_64 and qemu-img")
    found = _foreign_disk()
    require(found is not None, "needs the foreign test disk: ale image build --vm --foreign-test")
    assert found is not None
    return found


EXTRA_INPUT = """
    # (the foreign-disk test) start() adds to the input after the guest booted
    await session.write_file(f"{task_cfg.metadata['input_dir']}/extra.txt", "written by start()\\n")
"""


def task_copy(tmp_path: Path, *, extra_input: bool = False) -> Path:
    """files/word_count with a vm.snapshot (the disk is mapped to it) and its data where it
    is; ``extra_input``: its start() also writes a file into the input."""
    dest = tmp_path / "tasks" / "files" / "word_count"
    shutil.copytree(EXAMPLES / "files" / "word_count", dest)
    if extra_input:
        main = (dest / "main.py").read_text()
        anchor = 'raise FileNotFoundError(f"the staged input has no {doc}")\n'
        assert anchor in main
        (dest / "main.py").write_text(main.replace(anchor, anchor + EXTRA_INPUT, 1))
    card = json.loads((dest / "task_card.json").read_text())
    card["data_source"] = f"local:{(EXAMPLES / 'files' / 'word_count' / '../../../data').resolve()}"
    card["vm"]["snapshot"] = SNAPSHOT
    (dest / "task_card.json").write_text(json.dumps(card))
    return dest


def plan_for(tmp_path: Path, disk: Path, agent: str, *, extra_input: bool = False) -> RunPlan:
    return RunPlan(run_id=f"t-{uuid.uuid4().hex[:12]}", task_dir=str(task_copy(tmp_path, extra_input=extra_input)),
                   variant=0,
                   agent=AgentSpec(name=agent, config={}), image="ale-vm:latest", policy=POLICY, limits=Limits(),
                   runs_dir=str(tmp_path / "runs"), provider="qemu", vm_image=str(disk))


def run(plan: RunPlan):
    result = asyncio.run(execute_run(plan, provider=QemuProvider(accel="tcg")))
    assert not [p for p in qemu_processes() if plan.run_id in p], "a qemu process outlived its run"
    left = [p for p in state_root().glob("*/labels.json") if plan.run_id in p.read_text()] if state_root().is_dir() else []
    assert left == [], f"a VM state folder (overlay) outlived its run: {left}"
    return result


def verify(plan: RunPlan):
    from ale.record.verify import verify_run_dir

    return verify_run_dir(plan.run_dir)


def test_foreign_disk_oracle_one_sealed_and_verified(tmp_path, disk):
    plan = plan_for(tmp_path, disk, "oracle", extra_input=True)
    result = run(plan)
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores and all(s == 1.0 for s in result.scores)
    ev = plan.run_dir / "evidence"
    expect = json.loads((ev / "vm-expectation.json").read_text())
    assert expect["network"] == "user-restricted" and expect["guest_port"] == 5000 and expect["shares"] == {}
    assert expect["input_transfer"] == "copy" and expect["base_path"] == str(disk)
    before = json.loads((ev / "vm-before.json").read_text())
    argv = before["cmdline"]
    assert "-kernel" not in argv and not any("9p" in a for a in argv)
    net = argv[argv.index("-netdev") + 1]
    assert "restrict=on" in net and f"hostfwd=tcp:127.0.0.1:{expect['hostfwd_port']}-:5000" in net and "guestfwd" not in net
    checks = json.loads((ev / "checks.json").read_text())
    vm = [c for c in checks if c["phase"].startswith("vm-")]
    ids = {c["id"] for c in vm}
    assert {"vm.net.user_restricted", "vm.net.hostfwd", "vm.net.no_guestfwd", "vm.probe.uid_not_root",
            "vm.probe.no_default_route", "vm.probe.no_egress", "vm.capture.unchanged"} <= ids, ids
    # The disk took its address by DHCP (restrict=on: no router offered); the probe tried
    # QEMU's host and DNS addresses from inside, and every connect failed.
    probes = (ev / "vm-probes-before.txt").read_text()
    egress = probes.split("=== ale-probe:egress ===\n", 1)[1].split("=== ale-probe:", 1)[0].split()
    assert egress and egress[0::3] == ["closed"] * (len(egress) // 3) and "10.0.2.3" in egress, egress
    assert "vm.probe.input_read_only" not in ids  # the guest's input is a copy: the host's is hashed instead
    assert all(c["ok"] for c in vm), [c for c in vm if not c["ok"]]
    stop = json.loads((ev / "stop.json").read_text())
    assert stop["halt"]["method"] == "qmp" and stop["halt"]["frozen"] is True
    cua = json.loads((ev / "cua.json").read_text())
    assert cua["kind"] == "foreign" and cua["boot"]["ready_s"] > 0
    assert cua["copies"]["in"]["files"] == 1 and cua["copies"]["in_again"]["files"] == 1  # document.txt, then extra.txt
    deliverables = json.loads((plan.run_dir / "deliverables.json").read_text()) if (plan.run_dir / "deliverables.json").exists() else None
    assert deliverables is None or any("answer.json" in json.dumps(f) for f in deliverables.get("files", []))
    report = verify(plan)
    assert report.valid, report.reasons


def test_foreign_disk_nop_zero_verified(tmp_path, disk):
    plan = plan_for(tmp_path, disk, "nop")
    result = run(plan)
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores is not None and all(s == 0.0 for s in result.scores)
    report = verify(plan)
    assert report.valid, report.reasons


# -- built wrong ---------------------------------------------------------------------------------
WRONG = {
    "unrestricted": lambda net: net.replace("restrict=on,", ""),
    "guestfwd": lambda net: net + ",guestfwd=tcp:10.0.2.100:80-cmd:/bin/cat",
    "hostfwd-any-address": lambda net: net.replace("hostfwd=tcp:127.0.0.1:", "hostfwd=tcp::"),
}
EXPECTED_FAILURE = {"unrestricted": "vm.net.user_restricted", "guestfwd": "vm.net.no_guestfwd",
                    "hostfwd-any-address": "vm.net.hostfwd"}


def _wrong_argv(argv: list[str], how: str) -> list[str]:
    i = argv.index("-netdev") + 1
    return [*argv[:i], WRONG[how](argv[i]), *argv[i + 1:]]


def _created(disk: Path, tmp_path: Path):
    from ale.sandbox.base import Mount, SandboxSpec
    from ale.sandbox.qemu.foreign import ForeignQemuSandbox, foreign_inspect

    (tmp_path / "in").mkdir()
    (tmp_path / "ws").mkdir()
    spec = SandboxSpec(name=f"ale-foreign-wrong-{os.getpid()}", image=str(disk), policy=POLICY,
                       mounts=(Mount(str(tmp_path / "in"), "/input", True), Mount(str(tmp_path / "ws"), "/workspace", False)),
                       workdir="/workspace", labels={"ale.run_id": f"foreign-wrong-{os.getpid()}"}, environment={"HOME": "/tmp"})
    return ForeignQemuSandbox.create_foreign(spec, foreign_inspect(str(disk)), {"accel": "tcg"})


@pytest.mark.parametrize("how", sorted(WRONG))
def test_foreign_vm_built_wrong_is_rejected_paused(tmp_path, disk, how):
    """The foreign VM's own command line, paused before its firmware runs (``-S``): as
    built it passes the rules it is planned under; with one thing wrong it fails that rule."""
    from ale.isolation.vm_rules import VmExpectation, judge_vm_state
    from ale.sandbox.qemu.capture import capture_vm_at
    from ale.sandbox.qemu.foreign import expectation_fields

    sb = _created(disk, tmp_path)
    procs = []
    try:
        meta = sb.meta
        exp = VmExpectation(base_path=meta["base"], base_sha256=meta["base_sha256"], overlay_path=meta["overlay"],
                            memory_mib=meta["memory_mb"], vcpus=meta["vcpus"], control_sockets=(meta["qmp_socket"],),
                            console_logs=(str(sb.state / "console.log"),), **expectation_fields(meta))
        verdicts = {}
        for label, argv in (("as built", meta["argv"]), (how, _wrong_argv(meta["argv"], how))):
            pidfile = sb.state / "qemu.pid"
            pidfile.unlink(missing_ok=True)
            p = subprocess.Popen([*argv, "-S"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            procs.append(p)
            for _ in range(200):
                if (pidfile.is_file() and os.path.exists(meta["qmp_socket"])) or p.poll() is not None:
                    break
                time.sleep(0.05)
            assert p.poll() is None, p.stderr.read().decode() if p.stderr else ""
            cap = capture_vm_at(meta["qmp_socket"], base_sha256=meta["base_sha256"], pid=p.pid)
            checks = judge_vm_state(cap, exp, "before")
            verdicts[label] = {c.id: c.ok for c in checks}
            p.kill()
            p.wait(10)
            Path(meta["qmp_socket"]).unlink(missing_ok=True)
        good = verdicts["as built"]
        assert all(ok for ok in good.values()), {k: v for k, v in good.items() if not v}
        assert verdicts[how][EXPECTED_FAILURE[how]] is False, verdicts[how]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        asyncio.run(sb.remove())
    assert not sb.state.exists()


def test_foreign_run_with_unrestricted_net_and_guestfwd_is_invalid(tmp_path, disk, monkeypatch):
    """A whole run whose VM was started with user-mode networking unrestricted and a
    guest-to-host forward: refused before the agent's first step, and ale verify agrees."""
    from ale.sandbox.qemu import foreign

    made = foreign.ForeignQemuSandbox.create_foreign

    def wrong(spec, disk_, accel):
        sb = made(spec, disk_, accel)
        sb.meta["argv"] = _wrong_argv(_wrong_argv(sb.meta["argv"], "unrestricted"), "guestfwd")
        (sb.state / "labels.json").write_text(json.dumps(sb.meta))
        return foreign.ForeignQemuSandbox(sb.state, spec.policy)

    monkeypatch.setattr(foreign.ForeignQemuSandbox, "create_foreign", staticmethod(wrong))
    plan = plan_for(tmp_path, disk, "oracle")
    result = run(plan)
    assert result.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT, (result.status, result.error)
    failed = {m.group(1) for v in result.violations if (m := re.search(r"\] (vm\.[a-z_.]+):", str(v)))}
    assert {"vm.net.user_restricted", "vm.net.no_guestfwd"} <= failed, result.violations
    assert not (plan.run_dir / "evidence" / "agent.json").exists()  # the agent never ran
    report = verify(plan)  # the record verifies, and its evidence, re-judged, shows the violations again
    assert report.valid, report.reasons
    assert any("isolation check(s) fail on it" in n for n in report.notes), report.notes


# -- without QEMU ----------------------------------------------------------------------------------
def test_a_copied_input_is_planned_so_and_its_guest_write_test_not_judged(tmp_path) -> None:
    """``input_transfer="copy"`` (a foreign disk's guest) round-trips through the stored
    expectation, and the guest's write test of the input is not a rule for it (the guest
    holds the candidate's own copy; the host's input is hashed before and after)."""
    from ale.isolation.vm_rules import VmExpectation, judge_vm_probes
    from ale.sandbox.qemu.foreign import expectation_fields, is_foreign_disk

    meta = {"hostfwd_port": 40000, "guest_port": 5000}
    exp = VmExpectation(base_path="/d.qcow2", base_sha256="0" * 64, overlay_path="/o.qcow2", memory_mib=1, vcpus=1,
                        guest_input_dir="/input", guest_workspace_dir="/workspace", candidate_uid=1000,
                        **expectation_fields(meta))
    assert VmExpectation.from_dict(exp.to_dict()) == exp
    legacy = exp.to_dict()
    legacy.pop("input_transfer")
    assert VmExpectation.from_dict(legacy).input_transfer == "share"  # runs recorded before it existed
    with pytest.raises(ValueError):
        VmExpectation.from_dict({**exp.to_dict(), "input_transfer": "nfs"})
    copy_ids = {c.id for c in judge_vm_probes("", exp, "before")}
    share_ids = {c.id for c in judge_vm_probes("", VmExpectation.from_dict({**exp.to_dict(), "input_transfer": "share"}),
                                               "before")}
    assert "vm.probe.input_read_only" in share_ids - copy_ids
    disk = tmp_path / "d.qcow2"
    disk.write_bytes(b"x")
    assert is_foreign_disk(str(disk)) and is_foreign_disk(f"local:{disk}")
    (tmp_path / "guest.json").write_text("{}")
    assert not is_foreign_disk(str(disk))  # ale's own guest (ale image build --vm)
    assert not is_foreign_disk("ale-vm:latest") and not is_foreign_disk(str(tmp_path))


def test_workspace_names_from_the_guest_are_checked() -> None:
    from ale.sandbox.qemu.foreign import _safe_rel

    assert _safe_rel("answer.json") and _safe_rel("a/b c/d")
    for bad in ("", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\0b", "a/."):
        assert not _safe_rel(bad), bad


def test_a_windows_guest_is_stopped_before_the_agent_and_not_retried(tmp_path) -> None:
    """A guest whose computer-server says os_type windows cannot be proven sealed (the probes
    are POSIX shell): its boot ends the run before the agent, infrastructure_error, never
    retried."""
    from types import SimpleNamespace

    from ale.runs.steps.outcome import classify_failure
    from ale.sandbox.base import UnsupportedGuest
    from ale.sandbox.qemu.foreign import unsupported_guest

    assert unsupported_guest({"status": "ok", "os_type": "linux"}) is None
    assert unsupported_guest({"status": "ok"}) is None
    why = unsupported_guest({"status": "ok", "os_type": "Windows"})
    assert why is not None and "'windows'" in why and "cannot be proven sealed" in why
    before = SimpleNamespace(live=SimpleNamespace(agent_started=False))
    status, error, extra = classify_failure(UnsupportedGuest(why), before)  # type: ignore[arg-type]
    assert status is RunStatus.INFRASTRUCTURE_ERROR and extra == {"retryable": False} and "windows" in error
