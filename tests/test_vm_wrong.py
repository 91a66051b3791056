"""Real QEMU processes, each built wrong in exactly one way, and the good ones.

The VM equivalent of test_isolation_real.py: every variant starts from the good command
line (a per-run overlay on a read-only base, the input shared read-only and the
workspace read-write over 9p, a control socket, no NIC) and changes one thing. Each
QEMU is launched paused (`-S`) with no kernel, so nothing boots and no guest code runs;
`capture_vm` reads it over QMP and /proc, and the VM rules must fail under exactly the
expected ids and pass everything else. No packet leaves: the user-mode networks have no
guest running behind them, and the one listener a guestfwd needs is on loopback.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ale.isolation.registry import Check, failures
from ale.isolation.vm_rules import VmExpectation, judge_vm_captures, judge_vm_state
from ale.sandbox.qemu.capture import capture_vm
from ale.sandbox.qemu.qmp import QmpClient
from tests.conftest import require

QEMU = shutil.which("qemu-system-x86_64")
QEMU_IMG = shutil.which("qemu-img")
MEMORY_MIB = 128


def failing(checks: list[Check]) -> set[str]:
    return {c.id for c in failures(checks)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Vm:
    name: str
    proc: subprocess.Popen[bytes]
    qmp_path: str
    expectation: VmExpectation
    capture: dict[str, Any]


class Rig:
    """A base disk, the shared folders and every QEMU started; `close` kills them all."""

    def __init__(self, root: Path):
        self.root = root
        self.base = root / "base.qcow2"
        subprocess.run([QEMU_IMG, "create", "-q", "-f", "qcow2", str(self.base), "16M"], check=True)
        self.base.chmod(0o444)
        self.base_sha = sha256(self.base)
        self.input, self.workspace, self.extra = root / "input", root / "workspace", root / "extra"
        for d in (self.input, self.workspace, self.extra):
            d.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.listeners: list[socket.socket] = []
        self.vms: dict[str, Vm] = {}

    def overlay(self, name: str, base: Path | None = None) -> Path:
        path = self.root / f"{name}.qcow2"
        subprocess.run([QEMU_IMG, "create", "-q", "-f", "qcow2", "-b", str(base or self.base), "-F", "qcow2",
                        str(path)], check=True)
        return path

    def good_args(self, name: str) -> tuple[list[str], VmExpectation]:
        overlay = self.overlay(name)
        qmp, ctl = str(self.root / f"{name}.qmp"), str(self.root / f"{name}.ctl")
        args = [
            QEMU or "qemu-system-x86_64", "-S", "-nodefaults", "-no-user-config", "-display", "none",
            "-accel", "tcg", "-m", str(MEMORY_MIB), "-smp", "1",
            "-qmp", f"unix:{qmp},server=on,wait=off",
            "-drive", f"file={overlay},format=qcow2,if=virtio",
            "-device", "virtio-serial-pci",
            "-chardev", f"socket,path={ctl},server=on,wait=off,id=ctl0",
            "-device", "virtserialport,chardev=ctl0,name=ale.0",
            "-fsdev", f"local,id=fsin,path={self.input},security_model=none,readonly=on",
            "-device", "virtio-9p-pci,fsdev=fsin,mount_tag=input",
            "-fsdev", f"local,id=fsws,path={self.workspace},security_model=mapped-xattr",
            "-device", "virtio-9p-pci,fsdev=fsws,mount_tag=workspace",
            "-nic", "none",
        ]
        exp = VmExpectation(
            base_path=str(self.base), base_sha256=self.base_sha, overlay_path=str(overlay),
            shares={"input": (str(self.input), True), "workspace": (str(self.workspace), False)},
            memory_mib=MEMORY_MIB, vcpus=1, control_sockets=(qmp, ctl), accel="tcg",
        )
        return args, exp

    def launch(self, name: str, change: Callable[[list[str], VmExpectation], tuple[list[str], VmExpectation]] | None = None,
               *, base_file: Path | None = None) -> Vm:
        if name in self.vms:
            return self.vms[name]
        args, exp = self.good_args(name)
        if change is not None:
            args, exp = change(args, exp)
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(proc)
        qmp_path = str(self.root / f"{name}.qmp")
        try:
            client = QmpClient(qmp_path, timeout=10).connect(wait=10)
        except Exception:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"qemu {name} did not start: {err.decode(errors='replace')}") from None
        with client:
            cap = capture_vm(client, proc.pid, base_sha256=sha256(base_file or Path(exp.base_path)))
        vm = Vm(name, proc, qmp_path, exp, cap)
        self.vms[name] = vm
        return vm

    def listener(self) -> int:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        self.listeners.append(s)
        return int(s.getsockname()[1])

    def stop(self, vm: Vm) -> None:
        """Kill a VM whose capture is all a test needs."""
        vm.proc.kill()
        vm.proc.wait(timeout=10)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
            if p.stderr is not None:
                p.stderr.close()
        for s in self.listeners:
            s.close()


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    require(QEMU and QEMU_IMG, "needs qemu-system-x86_64 and qemu-img (apt-get install qemu-system-x86 qemu-utils)")
    root = Path(tempfile.mkdtemp(prefix="alevm-"))  # short: unix socket paths are at most 107 bytes
    r = Rig(root)
    try:
        yield r
    finally:
        r.close()
        shutil.rmtree(root, ignore_errors=True)


# -- the changes ----------------------------------------------------------------------------
def _swap(args: list[str], old: str, new: list[str]) -> list[str]:
    """Replace the option `old` (and its argument) by `new`."""
    i = args.index(old)
    return args[:i] + new + args[i + 2:]


def _user_net(port: int, nic: str) -> Callable[[list[str], VmExpectation], tuple[list[str], VmExpectation]]:
    def change(args: list[str], exp: VmExpectation) -> tuple[list[str], VmExpectation]:
        return _swap(args, "-nic", ["-nic", nic]), replace(exp, network="user-restricted", hostfwd_port=port,
                                                           guest_port=8000)
    return change


def _add(*extra: str) -> Callable[[list[str], VmExpectation], tuple[list[str], VmExpectation]]:
    return lambda args, exp: (args + list(extra), exp)


def _writable_base(rig: Rig) -> Callable[[list[str], VmExpectation], tuple[list[str], VmExpectation]]:
    def change(args: list[str], exp: VmExpectation) -> tuple[list[str], VmExpectation]:
        copy = rig.root / "writable" / "base.qcow2"
        copy.parent.mkdir()
        shutil.copyfile(rig.base, copy)
        args[args.index("-drive") + 1] = f"file={copy},format=qcow2,if=virtio"
        return args, replace(exp, base_path=str(copy))
    return change


# -- the good ones ---------------------------------------------------------------------------
def test_a_good_vm_passes_every_rule(rig: Rig) -> None:
    vm = rig.launch("good")
    checks = judge_vm_state(vm.capture, vm.expectation, "before")
    assert failing(checks) == set(), [c for c in failures(checks)]
    ids = {c.id for c in checks}
    assert {"vm.network.none", "vm.disk.base_read_only", "vm.disk.base_digest", "vm.shares.exact",
            "vm.chardev.only_control", "vm.limits.memory", "vm.accel.recorded"} <= ids
    # What QEMU really holds: the base open read-only, the two shared folders, nothing else.
    base_fds = [f for f in vm.capture["fds"] if f["path"] == str(rig.base)]
    assert base_fds and all(int(f["flags"], 8) & 3 == 0 for f in base_fds)
    assert sorted(f["path"] for f in vm.capture["fds"] if f["kind"] == "dir") == sorted(
        [str(rig.input), str(rig.workspace)])
    # Captured twice without a change, it is unchanged.
    with QmpClient(vm.qmp_path).connect() as q:
        again = capture_vm(q, vm.proc.pid, base_sha256=rig.base_sha)
    assert failing(judge_vm_captures(vm.capture, again, vm.expectation)) == set()
    assert failing(judge_vm_state(again, vm.expectation, "after")) == set()


def test_a_good_vm_with_restricted_user_net_passes(rig: Rig) -> None:
    port = free_port()
    vm = rig.launch("gooduser", _user_net(port, f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:8000"))
    checks = judge_vm_state(vm.capture, vm.expectation, "before")
    assert failing(checks) == set(), failures(checks)
    assert {"vm.net.user_restricted", "vm.net.hostfwd", "vm.net.no_guestfwd"} <= {c.id for c in checks}
    assert "vm.network.none" not in {c.id for c in checks}


class BareMonitor:
    """A QMP client with only ``execute`` and its socket (the provider's own monitor's shape)."""

    def __init__(self, client: QmpClient):
        self.client = client
        self.sock = client._sock

    def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        return self.client.execute(command, arguments)


def test_the_providers_shape_passes_and_its_own_client_captures(rig: Rig) -> None:
    """The command line `ale.sandbox.qemu.sandbox` builds (less the kernel), judged against
    the expectation in the provider's spelling, captured through a client that has only
    ``execute``."""
    state = rig.root / "provider-state"
    state.mkdir()
    overlay = rig.overlay("provider")
    qmp, ctl, console = state / "qmp.sock", state / "ctl.sock", state / "console.log"
    argv = [QEMU or "qemu-system-x86_64", "-S", "-name", "ale-test", "-nodefaults", "-no-user-config", "-nographic",
            "-no-reboot", "-accel", "tcg", "-m", str(MEMORY_MIB), "-smp", "1",
            "-drive", f"file={overlay},if=virtio,format=qcow2,id=root0", "-nic", "none",
            "-serial", f"file:{console}", "-qmp", f"unix:{qmp},server=on,wait=off",
            "-device", "virtio-serial-pci,id=vser0", "-chardev", f"socket,id=ctl,path={ctl},server=on,wait=off",
            "-device", "virtserialport,bus=vser0.0,chardev=ctl,name=org.ale.ctl", "-pidfile", str(state / "qemu.pid"),
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "-fsdev", f"local,id=fs_ale0,path={rig.input},security_model=passthrough,readonly=on",
            "-device", "virtio-9p-pci,fsdev=fs_ale0,mount_tag=ale0",
            "-fsdev", f"local,id=fs_ale1,path={rig.workspace},security_model=passthrough",
            "-device", "virtio-9p-pci,fsdev=fs_ale1,mount_tag=ale1"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rig.procs.append(proc)
    theirs = {"provider": "qemu", "base": str(rig.base), "base_sha256": rig.base_sha, "overlay": str(overlay),
              "shares": {"ale0": {"host_path": str(rig.input), "read_only": True, "target": "/in"},
                         "ale1": {"host_path": str(rig.workspace), "read_only": False, "target": "/out"}},
              "network": "none", "memory_mb": MEMORY_MIB, "vcpus": 1, "candidate_user": "1000:1000",
              "control_sockets": {"control": str(ctl), "qmp": str(qmp)}, "console_log": str(console), "accel": "tcg"}
    with QmpClient(str(qmp)).connect(wait=10) as client:
        cap = capture_vm(BareMonitor(client), proc.pid, base_sha256=rig.base_sha)
    proc.kill()
    proc.wait(timeout=10)
    assert cap["qmp_peer"]["pid"] == proc.pid and "info_network" in cap and cap["errors"] == {}
    checks = judge_vm_state(cap, theirs, "before")
    assert failing(checks) == set(), failures(checks)
    # without the console log in the plan, its file chardev is a channel nobody planned
    assert failing(judge_vm_state(cap, {**theirs, "console_log": None}, "before")) == {"vm.chardev.only_control"}


def test_a_good_vm_with_harmless_devices_and_a_planned_vnc_socket_passes(rig: Rig) -> None:
    def change(args: list[str], exp: VmExpectation) -> tuple[list[str], VmExpectation]:
        vnc = str(rig.root / "harmless.vnc")
        return (args + ["-device", "virtio-rng-pci", "-device", "virtio-balloon-pci", "-device", "VGA",
                        "-vnc", f"unix:{vnc}"],
                replace(exp, control_sockets=(*exp.control_sockets, vnc)))

    vm = rig.launch("harmless", change)
    rig.stop(vm)
    checks = judge_vm_state(vm.capture, vm.expectation, "before")
    assert failing(checks) == set(), failures(checks)


def test_a_good_vm_with_named_block_nodes_and_a_monitor_chardev_passes(rig: Rig) -> None:
    """The other way to say the same VM: -blockdev nodes (the base's read-only), QMP on a
    named chardev (-mon)."""
    def change(args: list[str], exp: VmExpectation) -> tuple[list[str], VmExpectation]:
        i = args.index("-drive")
        overlay = exp.overlay_path
        blockdevs = [
            "-blockdev", f"driver=file,filename={rig.base},node-name=base-file,read-only=on",
            "-blockdev", "driver=qcow2,file=base-file,node-name=base,read-only=on",
            "-blockdev", f"driver=file,filename={overlay},node-name=overlay-file",
            "-blockdev", "driver=qcow2,file=overlay-file,backing=base,node-name=overlay",
            "-device", "virtio-blk-pci,drive=overlay,id=disk0",
        ]
        args = args[:i] + blockdevs + args[i + 2:]
        q = args.index("-qmp")
        qmp = args[q + 1].split(":", 1)[1].split(",", 1)[0]
        args = args[:q] + ["-chardev", f"socket,id=mon0,path={qmp},server=on,wait=off",
                           "-mon", "chardev=mon0,mode=control"] + args[q + 2:]
        return args, exp

    vm = rig.launch("blockdev", change)
    rig.stop(vm)
    checks = judge_vm_state(vm.capture, vm.expectation, "before")
    assert failing(checks) == set(), failures(checks)


def test_a_vm_that_ran_between_the_captures_is_unchanged(rig: Rig) -> None:
    """The firmware runs (no kernel: it programs the PCI devices, finds no boot disk):
    what it changes is not the seal."""
    import time

    vm = rig.launch("ran")
    with QmpClient(vm.qmp_path).connect() as q:
        q.execute("cont")
        time.sleep(1.5)
        after = capture_vm(q, vm.proc.pid, base_sha256=rig.base_sha)
    rig.stop(vm)
    assert after["status"]["running"] is True
    assert failing(judge_vm_captures(vm.capture, after, vm.expectation)) == set()
    assert failing(judge_vm_state(after, vm.expectation, "after")) == set()


def test_a_device_added_over_the_monitor_changes_the_capture(rig: Rig) -> None:
    vm = rig.launch("hotplug")
    with QmpClient(vm.qmp_path).connect() as q:
        q.execute("chardev-add", {"id": "late", "backend": {"type": "file", "data": {"out": str(rig.root / "late.log")}}})
        after = capture_vm(q, vm.proc.pid, base_sha256=rig.base_sha)
    assert failing(judge_vm_captures(vm.capture, after, vm.expectation)) == {"vm.capture.unchanged"}
    assert failing(judge_vm_state(after, vm.expectation, "after")) == {"vm.chardev.only_control"}


# -- each built wrong in one way ---------------------------------------------------------------
WRONG: dict[str, tuple[Callable[[Rig], Any], set[str]]] = {
    # user-mode networking without restrict=on: DNS and the outside answer
    "user_net_unrestricted": (lambda r: (port := free_port(), _user_net(
        port, f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{port}-:8000"))[1],
        {"vm.net.user_restricted"}),
    # restrict=on, but a guest-to-host forward (to a listener on the host's loopback)
    "guestfwd": (lambda r: (port := free_port(), _user_net(
        port, f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:8000,"
              f"guestfwd=tcp:10.0.2.100:1234-tcp:127.0.0.1:{r.listener()}"))[1],
        {"vm.net.no_guestfwd", "vm.chardev.only_control"}),
    # the forward bound to every address of the host, not loopback
    "hostfwd_any_address": (lambda r: (port := free_port(), _user_net(
        port, f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:0.0.0.0:{port}-:8000"))[1],
        {"vm.net.hostfwd"}),
    # a second forward
    "hostfwd_twice": (lambda r: (port := free_port(), _user_net(
        port, f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:8000,"
              f"hostfwd=tcp:127.0.0.1:{free_port()}-:22"))[1],
        {"vm.net.hostfwd"}),
    # a socket netdev (a wire to another process; a tap would need a real host interface)
    "socket_netdev": (lambda r: _add("-netdev", f"socket,id=s0,listen=127.0.0.1:{free_port()}",
                                     "-device", "virtio-net-pci,netdev=s0"),
                      {"vm.network.none"}),
    # a NIC on user-mode networking, where the plan has no network at all
    "nic_where_none_planned": (lambda r: _add("-nic", "user,model=virtio-net-pci,restrict=on"), {"vm.network.none"}),
    # restrict=on, but the user network's own TFTP server hands out a host folder
    "user_net_tftp": (lambda r: (port := free_port(), _user_net(
        port, f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:8000,tftp={r.extra}"))[1],
        {"vm.net.user_restricted"}),
    # shared memory with the host
    "ivshmem": (lambda r: _add("-object", f"memory-backend-file,id=hm,mem-path={r.root / 'shm'},size=1M,share=on",
                               "-device", "ivshmem-plain,memdev=hm"),
                {"vm.devices.known"}),
    # the guest's screen on a TCP port (loopback; display 99 is port 5999)
    "vnc_tcp": (lambda r: _add("-vnc", "127.0.0.1:99"), {"vm.display.no_listener"}),
    # the base opened directly, writable, without an overlay (a copy of the base: the
    # running VMs hold a lock on the shared one that refuses a writer)
    "writable_base": (lambda r: _writable_base(r),
                      {"vm.disk.overlay_top", "vm.disk.base_read_only", "vm.disk.only_overlay_writable"}),
    # a second disk (a host file, writable)
    "extra_disk": (lambda r: _add("-drive", f"file={r.overlay('extra-disk')},format=qcow2,if=virtio"),
                   {"vm.disk.overlay_top", "vm.disk.only_overlay_writable"}),
    # an extra 9p share of a host folder
    "extra_share": (lambda r: _add("-fsdev", f"local,id=fsx,path={r.extra},security_model=none,readonly=on",
                                   "-device", "virtio-9p-pci,fsdev=fsx,mount_tag=extra"),
                    {"vm.shares.exact"}),
    # the input exported writable
    "input_writable": (lambda r: lambda a, e: ([x.replace(",readonly=on", "") for x in a], e),
                       {"vm.shares.input_read_only"}),
    # a serial port writing to a host file
    "serial_to_file": (lambda r: _add("-serial", f"file:{r.root / 'leak.log'}"), {"vm.chardev.only_control"}),
    # a chardev to a host TCP port
    "chardev_tcp": (lambda r: _add("-chardev", f"socket,id=t0,host=127.0.0.1,port={free_port()},server=on,wait=off"),
                    {"vm.chardev.only_control"}),
    # more memory than planned
    "memory_above_plan": (lambda r: lambda a, e: (_swap(a, "-m", ["-m", str(2 * MEMORY_MIB)]), e),
                          {"vm.limits.memory"}),
    # more vCPUs than planned
    "vcpus_above_plan": (lambda r: lambda a, e: (_swap(a, "-smp", ["-smp", "2"]), e), {"vm.limits.vcpus"}),
    # a USB controller
    "usb_controller": (lambda r: _add("-device", "qemu-xhci"), {"vm.devices.no_usb"}),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_each_wrong_vm_is_rejected_by_its_check(rig: Rig, name: str) -> None:
    make, expected = WRONG[name]
    vm = rig.launch(name, make(rig))
    rig.stop(vm)
    checks = judge_vm_state(vm.capture, vm.expectation, "before")
    assert failing(checks) == expected, {c.id: c.detail for c in failures(checks)}


def test_a_swapped_base_is_rejected_by_its_digest(rig: Rig) -> None:
    """The file at the planned base path holds other bytes than the planned digest."""
    other = rig.root / "swapped"
    other.mkdir()
    base = other / "base.qcow2"
    subprocess.run([QEMU_IMG, "create", "-q", "-f", "qcow2", str(base), "32M"], check=True)

    def change(args: list[str], exp: VmExpectation) -> tuple[list[str], VmExpectation]:
        overlay = rig.overlay("swapped-overlay", base)
        i = args.index("-drive")
        args[i + 1] = f"file={overlay},format=qcow2,if=virtio"
        return args, replace(exp, base_path=str(base), overlay_path=str(overlay))  # the planned digest stays

    vm = rig.launch("swapped", change, base_file=base)
    assert failing(judge_vm_state(vm.capture, vm.expectation, "before")) == {"vm.disk.base_digest"}


def test_an_overlay_on_another_base_is_rejected_by_its_chain(rig: Rig) -> None:
    other = rig.root / "other-base.qcow2"
    subprocess.run([QEMU_IMG, "create", "-q", "-f", "qcow2", str(other), "16M"], check=True)
    def change(args: list[str], exp: VmExpectation) -> tuple[list[str], VmExpectation]:
        overlay = rig.overlay("other-chain-ovl", other)
        args[args.index("-drive") + 1] = f"file={overlay},format=qcow2,if=virtio"
        return args, replace(exp, overlay_path=str(overlay))

    vm = rig.launch("other-chain", change)
    assert failing(judge_vm_state(vm.capture, vm.expectation, "before")) == {
        "vm.disk.overlay_top", "vm.disk.base_read_only"}


# -- ale verify-vm: the same judge on a VM someone else started ----------------------------------------
def test_verify_vm_command(rig: Rig, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ale.cli.main import app

    vm = rig.launch("cli")
    exp_file = tmp_path / "vm-expectation.json"
    exp_file.write_text(json.dumps(replace(vm.expectation, memory_mib=2 * MEMORY_MIB).to_dict()))
    saved = tmp_path / "capture.json"
    res = CliRunner().invoke(app, ["verify-vm", "--qmp", vm.qmp_path, "--expectation", str(exp_file),
                                   "--save-capture", str(saved)])
    assert res.exit_code == 0, res.output
    assert "SEALED" in res.output and "stricter than planned: vm.limits.memory" in res.output
    assert json.loads(saved.read_text())["qmp_peer"]["pid"] == vm.proc.pid
    exp_file.write_text(json.dumps(replace(vm.expectation, vcpus=0, memory_mib=MEMORY_MIB).to_dict()))
    res = CliRunner().invoke(app, ["verify-vm", "--qmp", vm.qmp_path, "--expectation", str(exp_file), "--json"])
    assert res.exit_code == 1 and json.loads(res.output)["violations"][0].startswith("[vm] vm.limits.vcpus")
    res = CliRunner().invoke(app, ["verify-vm", "--qmp", str(tmp_path / "no.sock"), "--expectation", str(exp_file)])
    assert res.exit_code == 2
    rig.stop(vm)


def test_the_capture_is_of_the_process_answering_qmp(rig: Rig) -> None:
    """A pid that is not QEMU's (the harness's own, say) is caught by the socket's peer."""
    import os

    vm = rig.launch("peer")
    with QmpClient(vm.qmp_path).connect() as q:
        assert q.peer()["pid"] == vm.proc.pid
        wrong = capture_vm(q, os.getpid(), base_sha256=rig.base_sha)
    rig.stop(vm)
    assert "vm.capture.complete" in failing(judge_vm_state(wrong, vm.expectation, "before"))
