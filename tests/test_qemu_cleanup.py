"""No VM outlives ale: Ctrl-C during a ``--provider qemu`` run, and ``ale cleanup`` after
a process that died with its VM running, leave no qemu process and no overlay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO, require
from tests.qemu_support import VM_DIR, vm_ready

ALE = str(Path(sys.executable).parent / "ale")


@pytest.fixture
def vm_state(monkeypatch):
    monkeypatch.setenv("ALE_VM_DIR", VM_DIR)
    monkeypatch.setenv("ALE_QEMU_ACCEL", "tcg")
    ok, why = vm_ready()
    require(ok, why)
    state = Path(f"/var/tmp/ale-qemu-test-{os.getpid()}-{time.monotonic_ns() % 10**6}")
    monkeypatch.setenv("ALE_QEMU_STATE_DIR", str(state))
    yield state
    import shutil

    shutil.rmtree(state, ignore_errors=True)


def qemu_of(state: Path) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"qemu-system") and str(state).encode() in cmd:
                out.append(int(p.name))
    return out


def overlays(state: Path) -> list[Path]:
    return list(state.glob("*/overlay.qcow2")) if state.is_dir() else []


def test_ctrl_c_during_a_run_leaves_no_vm(vm_state, tmp_path):
    proc = subprocess.Popen([ALE, "run", str(EXAMPLES / "files/word_count"), "--provider", "qemu", "--agent", "oracle",
                             "--runs-dir", str(tmp_path / "runs")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not qemu_of(vm_state) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert qemu_of(vm_state), f"no VM started: {proc.communicate(timeout=60)[0][-2000:]!r}"
    time.sleep(3)  # booting
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out[-2000:]
    time.sleep(0.5)
    assert qemu_of(vm_state) == [], f"a qemu process outlived Ctrl-C: {out[-2000:]!r}"
    assert overlays(vm_state) == [], "an overlay outlived Ctrl-C"


def test_cleanup_removes_a_vm_whose_process_died(vm_state, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "ws").mkdir()
    script = textwrap.dedent(f"""
        import asyncio, os
        from ale.sandbox.base import Mount, SandboxSpec
        from ale.sandbox.policy import MIB, IsolationPolicy
        from ale.sandbox.qemu.provider import QemuProvider

        async def main():
            spec = SandboxSpec(name="ale-left-behind", image="ale-vm:latest",
                               policy=IsolationPolicy(memory_bytes=256 * MIB, cpus=1.0),
                               mounts=(Mount({str(tmp_path / "in")!r}, "/input", True), Mount({str(tmp_path / "ws")!r}, "/workspace", False)),
                               workdir="/workspace", labels={{"ale.run_id": "left-behind"}})
            sb = await QemuProvider(accel="tcg").create(spec)
            await sb.start()
            os._exit(0)  # as a crash would: no stop, no remove

        asyncio.run(main())
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    assert qemu_of(vm_state) and overlays(vm_state), "setup: the VM should still run"
    r = subprocess.run([ALE, "cleanup", "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ale-left-behind" in r.stdout, r.stdout
    time.sleep(0.5)
    assert qemu_of(vm_state) == [] and overlays(vm_state) == [], "ale cleanup left the VM"
