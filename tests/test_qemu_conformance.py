"""The provider contract (tests/sandbox_conformance.py) against the qemu provider, as
far as it applies to a VM, plus the VM's own versions of the process checks.

Not run here, and why: the suite's process checks (``lifecycle_states``' empty fresh
sandbox, ``timeout_kills_*``, ``kill_user_processes``, ``halt_from_outside``,
``kill_count_is_honest``, ``kill_then_run``) count every process but PID 1 as the
sandbox's own; a VM's process table also holds its kernel's threads, ale's root init
and agent, and the candidate's computer-server, so they would fail on processes that
are not the candidate's. ``test_vm_*`` below check the same claims on the processes of
any uid but root (what a candidate can start), on one shared guest.
``kill_then_run_output_is_argvs`` expects another uid's processes to survive the kill (a
container's kill runs as the candidate); the VM's root agent kills every uid but root's,
so it reports 0 left, honestly (``test_vm_halt_kills_every_user_process_from_root``).
``remove_managed_selects_by_label`` runs without a foreign (unmanaged) sandbox: there is
no VM engine besides the provider to make one with.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from ale.sandbox.policy import MIB, IsolationPolicy
from ale.sandbox.qemu.provider import QemuProvider, kill_state
from ale.sandbox.qemu.sandbox import state_root
from tests.qemu_support import booted_guest, use_built_guest
from tests.sandbox_conformance import (
    _STUBBORN,
    INPUT_FILE,
    INPUT_TEXT,
    TEST_LABEL,
    ConformanceEnv,
    run_check,
)

APPLIES = [
    "vanished_via_engine", "vanished_via_second_handle", "vanished_during_exec", "attach_existing",
    "attach_unknown_raises_gone", "create_missing_image", "engine_record", "remove_managed_selects_by_label",
    "exit_codes_and_streams", "exec_user", "exec_env", "exec_workdir", "stdin", "stdin_with_echoed_output",
    "background_child_does_not_block", "stdout_cap", "stderr_cap", "output_cap_boundaries", "timed_out_semantics",
    "mounts",
]


@pytest.fixture(autouse=True)
def _vm(monkeypatch):
    use_built_guest(monkeypatch)


def _states_with(label: str) -> dict[str, str]:
    out = {}
    if state_root().is_dir():
        for p in state_root().glob("*/labels.json"):
            try:
                meta = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if (meta.get("labels") or {}).get(TEST_LABEL) == label:
                out[meta["name"]] = str(p.parent)
    return out


@pytest.fixture
def vm_env(tmp_path, label):
    inp = tmp_path / "input"
    inp.mkdir()
    (inp / INPUT_FILE).write_bytes(INPUT_TEXT)
    os.chmod(inp / INPUT_FILE, 0o666)
    os.chmod(inp, 0o777)

    def engine_names() -> set[str]:
        return set(_states_with(label))

    def engine_state(name: str) -> str | None:
        state = _states_with(label).get(name)
        if state is None:
            return None
        from pathlib import Path

        s = Path(state)
        pid = int((s / "qemu.pid").read_text()) if (s / "qemu.pid").exists() else 0
        if pid and os.path.exists(f"/proc/{pid}") and state.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return "running"
        return "exited" if (s / "started").exists() else "created"

    def vanish(name: str) -> None:
        from pathlib import Path

        state = _states_with(label).get(name)
        if state is not None:
            kill_state(Path(state))

    env = ConformanceEnv(image="ale-vm:latest", input_dir=inp, workspace_root=tmp_path / "workspaces", run_id=label,
                         policy=IsolationPolicy(memory_bytes=512 * MIB, cpus=1.0), engine_names=engine_names,
                         engine_state=engine_state, vanish=vanish, make_foreign=None)
    yield env
    left = engine_names()
    for name in left:
        vanish(name)
    assert left == set(), f"the test left VMs behind: {sorted(left)}"


@pytest.mark.parametrize("name", APPLIES)
def test_conformance(name, vm_env):
    run_check(name, QemuProvider(accel="tcg"), vm_env)


# -- the process claims, on one shared guest ------------------------------------------
_USER_PROCS = r"""
import json, os
me = set()
p = os.getpid()
while p > 1:
    me.add(p)
    with open(f"/proc/{p}/stat") as f:
        p = int(f.read().rsplit(")", 1)[1].split()[1])
out = []
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) in me:
        continue
    try:
        st = open(f"/proc/{d}/status").read()
        uid = int(st.split("Uid:")[1].split()[0])
        state = st.split("State:")[1].split()[0]
        cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError, ValueError):
        continue
    # the guest's screen and its server run as the candidate from boot, not from an exec
    if uid != 0 and state not in ("Z", "X") and not any(m in cmd for m in ("computer_server", "computer-server", "Xvfb")):
        out.append({"pid": int(d), "uid": uid, "cmd": cmd})
print(json.dumps(out))
"""


async def user_processes(sb) -> list[dict]:
    r = await sb.exec(["python3", "-c", _USER_PROCS], user="0:0", timeout=60)
    assert r.exit_code == 0, r
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    for loop, sb, _base in booted_guest(tmp_path_factory, name="test-vm"):
        yield loop, sb


def test_vm_timeout_kills_escaped_descendants(guest):
    loop, sb = guest

    async def go():
        t0 = time.monotonic()
        r = await sb.exec(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & (setsid sh -c 'sleep 301 & wait' &) ; "
                                       "env -i setsid sleep 302 >/dev/null 2>&1 & sleep 303"], timeout=2)
        took = time.monotonic() - t0
        assert r.timed_out and took < 2 + 7, (r, took)
        await asyncio.sleep(0.5)
        return await user_processes(sb)

    left = loop.run_until_complete(go())
    assert left == [], f"processes survived the timeout: {left}"


def test_vm_exit_codes(guest):
    loop, sb = guest

    async def go():
        r = await sb.exec(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=30)
        assert (r.exit_code, r.stdout, r.stderr) == (7, b"out\n", b"err\n"), r
        r = await sb.exec(["sh", "-c", "kill -9 $$"], timeout=30)
        assert r.exit_code == 137, r
        r = await sb.exec(["id", "-u"], timeout=30)
        assert r.stdout == b"1000\n", r
        r = await sb.exec(["sh", "-c", "ulimit -n; ulimit -Hn; ulimit -c"], timeout=30)
        assert r.stdout == b"65536\n65536\n0\n", r  # open files as in a container; no core files

    loop.run_until_complete(go())


def test_vm_halt_kills_every_user_process_from_root(guest):
    loop, sb = guest

    async def go():
        await sb.exec(["sh", "-c", _STUBBORN], timeout=30)
        await sb.exec(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &"], user="1234:1234", timeout=30)
        before = await user_processes(sb)
        assert len(before) >= 7, before
        out = await sb.halt(bound_s=15)
        assert out.method == "vm-agent-cgroup" and out.survivors == [] and out.killed >= 7 and out.within_bound, out
        assert not out.sandbox_stopped
        return await user_processes(sb)

    left = loop.run_until_complete(go())
    assert left == [], f"processes survived halt(): {left}"


def test_vm_hostile_workspace_comes_out_safe(guest, tmp_path):
    """What the candidate leaves in the 9p workspace (symlinks out of it, a fifo, a
    setuid file) is on the host as in a bind mount; the deliverables copy takes only
    regular files and never what a symlink points at outside the workspace."""
    from pathlib import Path

    from ale.grading.deliverables import extract_deliverables

    loop, sb = guest
    ws = Path(next(s["source"] for s in sb.meta["shares"] if s["target"] == "/workspace"))
    r = loop.run_until_complete(sb.exec(["sh", "-c", "ln -s /etc/shadow leak; ln -s / root; ln -s ../../../../../etc/passwd up; "
                                         "mkfifo fifo; echo ok > answer.txt; cp /bin/true suid; chmod 4755 suid; "
                                         "ln -s /workspace/answer.txt inside"], timeout=60))
    assert r.exit_code == 0, r
    assert os.path.islink(ws / "leak") and os.readlink(ws / "leak") == "/etc/shadow", "a real symlink on the host"
    m = extract_deliverables(ws, tmp_path / "out", max_files=100, max_bytes=1 << 20, mount_point="/workspace")
    copied = {f.path for f in m.files}
    assert "answer.txt" in copied, copied
    assert not copied & {"leak", "root", "up", "fifo", "suid"}, copied
    for p in (tmp_path / "out").rglob("*"):
        assert p.is_symlink() is False and b"root:" not in (p.read_bytes() if p.is_file() else b""), p


def test_vm_halt_falls_back_to_qmp_when_the_agent_is_gone(guest):
    """Last in the module: it stops the shared guest."""
    loop, sb = guest

    async def go():
        # stop the agent's answers: pause the guest's vCPUs behind the agent's back (QMP)
        from ale.sandbox.qemu.monitor import qmp

        qmp(sb.qmp_path, "stop")
        t0 = time.monotonic()
        out = await sb.halt(bound_s=6)
        return out, time.monotonic() - t0

    out, took = loop.run_until_complete(go())
    assert out.method == "qmp" and out.sandbox_stopped and took < 6 + 8, (out, took)
    assert sb.inspect()["State"]["Status"] == "exited"


def test_accel_kvm_refuses_where_the_probe_failed(monkeypatch):
    """``--accel kvm`` (``ALE_QEMU_ACCEL=kvm``) refuses, naming why, unless the KVM probe
    (cached per host boot) saw a guest kernel run; ``auto`` falls back to TCG with a warning."""
    from ale.sandbox.base import SandboxError
    from ale.sandbox.qemu import kvm

    v = kvm.verdict()
    if v["works"]:
        assert QemuProvider(accel="kvm").accel()["accel"] == "kvm"
        return
    with pytest.raises(SandboxError, match="KVM does not run a guest"):
        QemuProvider(accel="kvm").accel()
    auto = QemuProvider(accel="auto").accel()
    assert auto["accel"] == "tcg" and auto["warning"] and auto["kvm_probe"]["works"] is False
