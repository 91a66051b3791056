"""The VM seal's rules, each in both directions, on captures (no QEMU needed).

The good capture is a real one (`fixtures/make_vm_capture.py`: a paused QEMU in the
provider's shape, with restricted user-mode networking); each test changes it in one
way and names the check that must reject it. The guest's probe output is the probe
script's format, as a Debian guest prints it for uid 1000.
"""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ale import layout
from ale.isolation.registry import (
    MOMENTS,
    VM_CAPTURE,
    VM_CAPTURES,
    VM_PROBES,
    Moment,
    Rule,
    failures,
)
from ale.isolation.rules import markdown, rule_for
from ale.isolation.vm_rules import (
    VmCapturesSubject,
    VmExpectation,
    VmProbeSubject,
    VmSubject,
    all_vm_rules,
    chardev_target,
    cmdline_fsdevs,
    info_network,
    judge_vm_captures,
    judge_vm_probes,
    judge_vm_state,
    parse_opts,
    usernet_forwards,
    vm_check_ids,
)
from ale.layout import Evidence
from ale.phases import CheckGroup
from ale.record.verify import _Verifier
from ale.sandbox.base import SandboxError
from ale.sandbox.qemu.qmp import QmpClient
from tests.conftest import committed

FIX = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[1]
CAPTURE_FILE, EXPECTATION_FILE = FIX / "vm_capture_good.json", FIX / "vm_expectation_good.json"
IN, WS = "/media/user/data/task/input", "/media/user/data/task/output"

GUEST_PROBES = f"""=== ale-probe:id ===
uid=1000(user) gid=1000(user) groups=1000(user)
numeric uid=1000 gid=1000 groups=1000
=== ale-probe:status ===
CapInh:\t0000000000000000
CapPrm:\t0000000000000000
CapEff:\t0000000000000000
CapBnd:\t000001ffffffffff
CapAmb:\t0000000000000000
NoNewPrivs:\t1
Seccomp:\t0
=== ale-probe:netdev ===
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0:    1200      10    0    0    0     0          0         0      900       8    0    0    0     0       0          0
=== ale-probe:route ===
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
=== ale-probe:ipv6_route ===
00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000001 00000000 80200001       lo
=== ale-probe:mountinfo ===
20 1 254:0 / / ro,relatime - ext4 /dev/vda rw
21 20 0:5 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
22 20 0:30 / {IN} ro,relatime - 9p input ro,trans=virtio
23 20 0:31 / {WS} rw,relatime - 9p workspace rw,trans=virtio
24 20 0:32 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw
=== ale-probe:writes ===
fail /
fail /var/tmp
fail /home/user
fail {IN}
ok {WS}
ok /tmp
=== ale-probe:end ===
=== ale-probe:exit ===
exit_code=0 timed_out=False
"""


def good() -> tuple[dict[str, Any], VmExpectation]:
    committed(CAPTURE_FILE, EXPECTATION_FILE)
    return json.loads(CAPTURE_FILE.read_text()), VmExpectation.from_dict(json.loads(EXPECTATION_FILE.read_text()))


def failing(checks: list[Any]) -> set[str]:
    return {c.id for c in failures(checks)}


def probes_with(old: str, new: str) -> str:
    assert old in GUEST_PROBES
    return GUEST_PROBES.replace(old, new)


# -- the good evidence passes every rule, alone and together ------------------------------
def good_subject(r: Rule, moment: Moment) -> Any:
    cap, exp = good()
    if r.source is VM_CAPTURE:
        return VmSubject(moment, cap, exp)
    if r.source is VM_CAPTURES:
        return VmCapturesSubject(moment, cap, copy.deepcopy(cap), exp)
    if r.source is VM_PROBES:
        from ale.isolation.probe_rules import split_sections
        return VmProbeSubject(moment, split_sections(GUEST_PROBES), exp, IN, WS)
    raise AssertionError(r.source.name)


def empty_subject(r: Rule, moment: Moment) -> Any:
    _, exp = good()
    if r.source is VM_CAPTURE:
        return VmSubject(moment, {"errors": {}}, exp)
    if r.source is VM_CAPTURES:
        return VmCapturesSubject(moment, {}, None, exp)
    return VmProbeSubject(moment, {}, exp, IN, WS)


RULE_MOMENTS = [(r, m) for r in all_vm_rules() for m in r.moments]


@pytest.mark.parametrize("r,moment", RULE_MOMENTS, ids=[f"{r.id}@{m}" for r, m in RULE_MOMENTS])
def test_each_vm_rule_passes_the_good_evidence(r: Rule, moment: Moment) -> None:
    s = good_subject(r, moment)
    if not r.applies(s):
        assert r.when is not None  # a rule for the other network plan
        return
    c = r.check(s)
    assert c.ok is True, c


@pytest.mark.parametrize("r", all_vm_rules(), ids=[r.id for r in all_vm_rules()])
def test_each_vm_rule_on_missing_evidence_is_unknown(r: Rule) -> None:
    c = r.check(empty_subject(r, r.moments[-1]))
    assert c.ok is None, c


def test_the_judges_pass_the_good_evidence() -> None:
    cap, exp = good()
    for m in MOMENTS:
        assert failing(judge_vm_state(cap, exp, m)) == set()
        assert failing(judge_vm_probes(GUEST_PROBES, exp, m)) == set()
    assert failing(judge_vm_captures(cap, copy.deepcopy(cap), exp)) == set()
    none_planned = replace(exp, network="none")
    assert "vm.network.none" in {c.id for c in judge_vm_state(cap, none_planned, "before")}
    assert "vm.net.hostfwd" not in {c.id for c in judge_vm_state(cap, none_planned, "before")}


def test_registry_docs_and_ids() -> None:
    ids = vm_check_ids()
    assert {"vm.network.none", "vm.disk.base_read_only", "vm.disk.base_digest", "vm.shares.exact",
            "vm.shares.input_read_only", "vm.chardev.only_control", "vm.net.no_guestfwd", "vm.limits.memory",
            "vm.limits.vcpus", "vm.accel.recorded", "vm.capture.unchanged"} <= ids
    doc = (ROOT / "docs" / "isolation.md").read_text()
    for r in all_vm_rules():
        assert r.summary and r.why
        assert f"`{r.id}`" in doc and rule_for(r.id) is r
    assert doc == markdown()


def test_judging_nothing_is_unknown_not_a_pass() -> None:
    _, exp = good()
    assert all(c.ok is None for c in judge_vm_state(None, exp, "before"))
    assert [c.ok for c in judge_vm_captures(None, {}, exp)] == [None]
    assert all(c.ok is not True for c in judge_vm_probes("", exp, "after"))


# -- each rule rejects what it is for ------------------------------------------------------------
def _set_restrict(c: dict[str, Any]) -> None:
    c["info_network"] = c["info_network"].replace("restrict=on", "restrict=off")


def _hostfwd_any(c: dict[str, Any]) -> None:
    c["info_usernet"] = c["info_usernet"].replace("      127.0.0.1 ", "              * ")


def _guestfwd(c: dict[str, Any]) -> None:
    c["chardevs"].append({"label": "guestfwd.tcp.1234", "filename": "tcp:127.0.0.1:22", "frontend-open": True})


def _tap(c: dict[str, Any]) -> None:
    c["info_network"] += "t0: index=0,type=tap,ifname=tap0,script=no,downscript=no\n"


def _node(c: dict[str, Any], drv: str) -> dict[str, Any]:
    return next(n for n in c["block_nodes"] if n["drv"] == drv and "base" in str(n.get("file")))


def _base_node_rw(c: dict[str, Any]) -> None:
    _node(c, "file")["ro"] = False


def _base_fd_rw(c: dict[str, Any]) -> None:
    next(f for f in c["fds"] if f["path"].endswith("base.qcow2"))["flags"] = "02100002"


def _two_disks(c: dict[str, Any]) -> None:
    c["block_devices"].append(copy.deepcopy(c["block_devices"][0]))


def _extra_writable_node(c: dict[str, Any]) -> None:
    c["block_nodes"].append({"node-name": "stray", "drv": "file", "ro": False, "file": "/etc/passwd"})


def _extra_share(c: dict[str, Any]) -> None:
    c["p9"].append({"path": "/machine/peripheral-anon/device[9]", "type": "virtio-9p-pci", "fsdev": "fsx",
                    "mount_tag": "extra"})
    c["cmdline"] += ["-fsdev", "local,id=fsx,path=/home,security_model=none,readonly=on"]


def _unused_fsdev(c: dict[str, Any]) -> None:
    c["cmdline"] += ["-fsdev", "local,id=fsx,path=/home,security_model=none"]


def _open_dir(c: dict[str, Any]) -> None:
    c["fds"].append({"fd": 40, "path": "/root", "kind": "dir", "flags": "0300000"})
    share = next(f["path"] for f in c["fds"] if f["kind"] == "dir")
    c["fds"].append({"fd": 41, "path": f"{share}/sub", "kind": "dir", "flags": "0300000"})  # inside a share: fine


def _input_rw(c: dict[str, Any]) -> None:
    c["cmdline"] = [a.replace(",readonly=on", "") for a in c["cmdline"]]


def _file_chardev(c: dict[str, Any]) -> None:
    c["chardevs"].append({"label": "serial0", "filename": "file", "frontend-open": True})
    c["cmdline"] += ["-serial", "file:/tmp/leak.log"]


def _usb(c: dict[str, Any]) -> None:
    c["pci"][0]["devices"].append({"slot": 9, "function": 0, "class_info": {"class": 0x0C03, "desc": "USB controller"},
                                   "id": {"vendor": 0x1B36, "device": 0xD}, "qdev_id": ""})


def _memory(c: dict[str, Any]) -> None:
    c["memory"]["base-memory"] *= 2


def _vcpus(c: dict[str, Any]) -> None:
    c["cpus"].append(dict(c["cpus"][0], **{"cpu-index": 2}))


def _digest(c: dict[str, Any]) -> None:
    c["base_sha256"] = "0" * 64


def _kvm_claimed(c: dict[str, Any]) -> None:
    c["cmdline"] = [("kvm" if a == "tcg" else a) for a in c["cmdline"]]


def _tftp(c: dict[str, Any]) -> None:
    c["cmdline"] = [a + ",tftp=/etc" if a.startswith("user,") else a for a in c["cmdline"]]


def _vsock(c: dict[str, Any]) -> None:
    c["pci"][0]["devices"].append({"slot": 10, "function": 0, "class_info": {"class": 0x0780, "desc": "Communication"},
                                   "id": {"vendor": 0x1AF4, "device": 0x1053}, "qdev_id": ""})


def _vnc_tcp(c: dict[str, Any]) -> None:
    c["vnc"] = {"enabled": True, "family": "ipv4", "host": "0.0.0.0", "service": "5900", "auth": "none", "clients": []}


WRONG = {
    "tftp": (_tftp, {"vm.net.user_restricted"}),
    "vsock": (_vsock, {"vm.devices.known"}),
    "vnc_tcp": (_vnc_tcp, {"vm.display.no_listener"}),
    "restrict_off": (_set_restrict, {"vm.net.user_restricted"}),
    "hostfwd_any": (_hostfwd_any, {"vm.net.hostfwd"}),
    "guestfwd": (_guestfwd, {"vm.net.no_guestfwd", "vm.chardev.only_control"}),
    "tap": (_tap, {"vm.net.user_restricted"}),
    "base_node_writable": (_base_node_rw, {"vm.disk.base_read_only", "vm.disk.only_overlay_writable"}),
    "base_fd_writable": (_base_fd_rw, {"vm.disk.base_read_only"}),
    "two_disks": (_two_disks, {"vm.disk.overlay_top"}),
    "extra_writable_node": (_extra_writable_node, {"vm.disk.only_overlay_writable"}),
    "digest": (_digest, {"vm.disk.base_digest"}),
    "extra_share": (_extra_share, {"vm.shares.exact"}),
    "unused_fsdev": (_unused_fsdev, {"vm.shares.exact"}),
    "open_dir": (_open_dir, {"vm.shares.exact"}),
    "input_writable": (_input_rw, {"vm.shares.input_read_only"}),
    "file_chardev": (_file_chardev, {"vm.chardev.only_control"}),
    "usb": (_usb, {"vm.devices.no_usb"}),
    "memory": (_memory, {"vm.limits.memory"}),
    "vcpus": (_vcpus, {"vm.limits.vcpus"}),
    "kvm_asked_tcg_ran": (_kvm_claimed, {"vm.accel.recorded"}),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_each_wrong_capture_is_rejected_by_its_check(name: str) -> None:
    change, expected = WRONG[name]
    cap, exp = good()
    change(cap)
    checks = judge_vm_state(cap, exp, "before")
    assert failing(checks) == expected, {c.id: c.detail for c in failures(checks)}
    # ... and the same change between the two captures is caught as a change
    # ... and the same change between the two captures is caught as a change (open files
    # change as the guest walks its shares: they are judged at each moment, not diffed)
    if name not in ("open_dir", "base_fd_writable"):
        before, _ = good()
        assert "vm.capture.unchanged" in failing(judge_vm_captures(before, cap, exp))


def test_the_plans_differ_on_the_network() -> None:
    cap, exp = good()
    assert failing(judge_vm_state(cap, replace(exp, network="none", hostfwd_port=None), "before")) == {"vm.network.none"}
    assert failing(judge_vm_state(cap, replace(exp, hostfwd_port=1), "before")) == {"vm.net.hostfwd"}
    assert failing(judge_vm_state(cap, replace(exp, accel="kvm"), "before")) == {"vm.accel.recorded"}


def test_a_failed_query_is_unknown() -> None:
    cap, exp = good()
    del cap["pci"]
    cap["errors"]["pci"] = "QmpError: QMP query-pci: GenericError: nope"
    checks = {c.id: c for c in judge_vm_state(cap, exp, "before")}
    assert checks["vm.capture.complete"].ok is None and checks["vm.devices.no_usb"].ok is None
    assert "nope" in checks["vm.devices.no_usb"].detail


def test_the_accelerator_is_read_from_qemu_and_its_argv() -> None:
    cap, exp = good()

    def accel(argv_tail: list[str], kvm: bool = False) -> Any:
        c = copy.deepcopy(cap)
        c["cmdline"] = [a for a in c["cmdline"] if a not in ("-accel", "tcg")] + argv_tail
        c["kvm"]["enabled"] = kvm
        return next(x for x in judge_vm_state(c, replace(exp, accel=None), "before") if x.id == "vm.accel.recorded")

    assert accel([]).observed["accel"] == "tcg"
    assert accel(["-accel", "kvm", "-accel", "tcg"]).observed["accel"] == "tcg"
    assert accel(["-machine", "q35,accel=kvm:tcg"]).ok is True
    assert accel(["-accel", "kvm"], kvm=True).observed["accel"] == "kvm"
    assert accel(["-accel", "kvm"]).ok is False
    assert accel(["-enable-kvm"]).ok is False


def test_limits_at_least() -> None:
    cap, exp = good()
    smaller = {c.id: c for c in judge_vm_state(cap, replace(exp, memory_mib=512, vcpus=4), "before", fit="at_least")}
    assert smaller["vm.limits.memory"].ok and smaller["vm.limits.memory"].stricter
    assert smaller["vm.limits.vcpus"].ok and smaller["vm.limits.vcpus"].stricter
    assert failing(judge_vm_state(cap, replace(exp, memory_mib=512), "before")) == {"vm.limits.memory"}


# -- the guest's probes ---------------------------------------------------------------------------
PROBES_WRONG = {
    "root": (("numeric uid=1000 gid=1000", "numeric uid=0 gid=0"), {"vm.probe.uid_not_root"}),
    "other_uid": (("numeric uid=1000 gid=1000", "numeric uid=1001 gid=1000"), {"vm.probe.uid_not_root"}),
    "caps": (("CapEff:\t0000000000000000", "CapEff:\t000001ffffffffff"), {"vm.probe.caps_zero"}),
    "nnp": (("NoNewPrivs:\t1", "NoNewPrivs:\t0"), {"vm.probe.no_new_privs"}),
    "second_nic": (("  eth0:", "  eth1:    0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n  eth0:"), {"vm.probe.interfaces_lo_only"}),
    "default_route": (("eth0\t0002000A", "eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\neth0\t0002000A"),
                      {"vm.probe.no_default_route", "vm.probe.no_egress"}),  # and no connect tried through it
    "input_mount_rw": ((f"/ {IN} ro,relatime", f"/ {IN} rw,relatime"), {"vm.probe.input_read_only"}),
    "input_writes": ((f"fail {IN}", f"ok {IN}"), {"vm.probe.input_read_only"}),
    "root_writable": (("fail /\n", "ok /\n"), {"vm.probe.root_not_writable"}),
    "failed_script": (("exit_code=0", "exit_code=1"), {"vm.probe.complete"}),
}


@pytest.mark.parametrize("name", sorted(PROBES_WRONG))
def test_each_wrong_guest_is_rejected_by_its_probe(name: str) -> None:
    (old, new), expected = PROBES_WRONG[name]
    _, exp = good()
    checks = judge_vm_probes(probes_with(old, new), exp, "before")
    assert failing(checks) == expected, {c.id: c.detail for c in failures(checks)}


def test_the_probes_with_no_network_planned() -> None:
    _, exp = good()
    none = replace(exp, network="none", hostfwd_port=None)
    assert failing(judge_vm_probes(GUEST_PROBES, none, "before")) == {"vm.probe.interfaces_lo_only",
                                                                      "vm.probe.no_default_route"}
    cut = GUEST_PROBES.split("=== ale-probe:end ===")[0]
    assert {c.id: c.ok for c in judge_vm_probes(cut, exp, "after")}["vm.probe.complete"] is None


# -- reading QEMU's words ----------------------------------------------------------------------------
def test_parsers() -> None:
    assert parse_opts("user,id=n0,hostfwd=tcp::1-:2,restrict=on", "type") == [
        ("type", "user"), ("id", "n0"), ("hostfwd", "tcp::1-:2"), ("restrict", "on")]
    assert parse_opts("local,path=/a,,b,readonly", "driver") == [("driver", "local"), ("path", "/a,b"), ("readonly", "on")]
    assert chardev_target("disconnected:unix:/x/y.sock,server=on") == ("unix", "/x/y.sock")
    assert chardev_target("tcp:127.0.0.1:5,server=on")[0] == "tcp"
    nets = info_network("hub 0\n \\ hub0port1: #net1: index=0,type=user,net=10.0.2.0,restrict=off\n"
                        " \\ hub0port0: e1000.0: index=0,type=nic,model=e1000,macaddr=52:54:00:12:34:56\n"
                        "s0: index=0,type=socket,\n")
    assert [(n["name"], n["type"]) for n in nets] == [("#net1", "user"), ("e1000.0", "nic"), ("s0", "socket")]
    assert usernet_forwards("  TCP[HOST_FORWARD]  8   *  5556   10.0.2.15  8000  0 0\n") == [
        {"proto": "tcp", "host_addr": "*", "host_port": 5556, "guest_addr": "10.0.2.15", "guest_port": 8000}]
    fs = cmdline_fsdevs(["qemu", "-virtfs", "local,path=/p,mount_tag=t,security_model=none,readonly=on", "-S"])
    assert fs == {"t": {"driver": "local", "path": "/p", "readonly": True, "security_model": "none",
                        "option": "virtfs", "mount_tag": "t"}}


def test_the_guest_runs_the_containers_probe_script() -> None:
    from ale.isolation.probes import PROBE_SCRIPT, vm_probe_argv

    _, exp = good()
    argv = vm_probe_argv(exp)
    assert argv[2] == PROBE_SCRIPT and argv[4:6] == [IN, WS]
    with pytest.raises(ValueError):
        vm_probe_argv(replace(exp, guest_input_dir=None))


def test_the_providers_spelling_of_the_expectation() -> None:
    cap, exp = good()
    d = exp.to_dict()
    theirs = {**{k: v for k, v in d.items() if k not in ("base_path", "overlay_path", "memory_mib", "control_sockets",
                                                         "candidate_uid")},
              "base": d["base_path"], "overlay": d["overlay_path"], "memory_mb": d["memory_mib"],
              "control_sockets": {"qmp": d["control_sockets"][0], "control": d["control_sockets"][1]},
              "candidate_user": "1000:1000", "console_log": "/state/console.log", "state_dir": "/state"}
    read = VmExpectation.from_dict(theirs)
    assert read == replace(exp, console_logs=("/state/console.log",))
    assert failing(judge_vm_state(cap, theirs, "before")) == set()


def test_expectation_round_trip() -> None:
    _, exp = good()
    assert VmExpectation.from_dict(json.loads(json.dumps(exp.to_dict()))) == exp
    with pytest.raises(ValueError):
        VmExpectation.from_dict({"base_path": "/b"})
    with pytest.raises(ValueError):
        VmExpectation.from_dict([])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        replace(exp, network="bridge")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        replace(exp, hostfwd_port=None)


# -- the QMP client's failures are SandboxErrors ---------------------------------------------------------
def test_qmp_client_errors(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="cannot connect"):
        QmpClient(str(tmp_path / "none.sock")).connect()
    import socket
    import threading

    path = str(tmp_path / "q.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        f = conn.makefile("rwb")
        f.write(b'{"QMP": {"version": {}, "capabilities": []}}\n')
        f.flush()
        for reply in (b'{"return": {}}\n', b'{"event": "X"}\n{"error": {"class": "GenericError", "desc": "no"}}\n'):
            f.readline()
            f.write(reply)
            f.flush()
        f.readline()  # then silence: a timeout
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    q = QmpClient(path, timeout=0.5).connect()
    with pytest.raises(SandboxError, match="GenericError: no"):
        q.execute("query-x")
    assert q.events == [{"event": "X"}]
    with pytest.raises(SandboxError):
        q.execute("query-y")
    q.close()
    t.join(timeout=5)
    srv.close()


# -- ale verify re-judges a VM run's evidence ----------------------------------------------------------
def _run_dir(tmp_path: Path, after: dict[str, Any] | None) -> Path:
    cap, exp = good()
    ev = tmp_path / layout.EVIDENCE_DIR
    ev.mkdir(parents=True)
    (ev / Evidence.VM_EXPECTATION).write_text(json.dumps(exp.to_dict()))
    (ev / Evidence.VM_BEFORE).write_text(json.dumps(cap))
    if after is not None:
        (ev / Evidence.VM_AFTER).write_text(json.dumps(after))
    (ev / Evidence.vm_probes("before")).write_text(GUEST_PROBES)
    return tmp_path


def test_verify_rejudges_the_vm_evidence(tmp_path: Path) -> None:
    cap, _ = good()
    v = _Verifier(_run_dir(tmp_path / "good", cap))
    v.verify_vm()
    groups = {c["phase"] for c in v.checks}
    assert groups == {CheckGroup.VM_BEFORE, CheckGroup.VM_AFTER, CheckGroup.VM_PROBES_BEFORE}
    assert v.violations == [] and v.reasons == []

    changed = copy.deepcopy(cap)
    _file_chardev(changed)
    v = _Verifier(_run_dir(tmp_path / "changed", changed))
    v.verify_vm()
    assert any(line.startswith(f"[{CheckGroup.VM_AFTER}] vm.capture.unchanged") for line in v.violations)
    assert any(line.startswith(f"[{CheckGroup.VM_AFTER}] vm.chardev.only_control") for line in v.violations)

    bad = tmp_path / "bad"
    _run_dir(bad, None)
    (bad / layout.evidence_path(Evidence.VM_EXPECTATION)).write_text("{}")
    v = _Verifier(bad)
    v.verify_vm()
    assert any(r.startswith("vm.expectation") for r in v.reasons)


def test_verify_ignores_a_container_run(tmp_path: Path) -> None:
    v = _Verifier(tmp_path)
    v.verify_vm()
    assert v.checks == [] and v.violations == []


def test_verify_wants_the_vm_evidence_of_a_graded_qemu_run(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from ale.status import RunStatus

    scored = SimpleNamespace(status=RunStatus.SCORED)
    (tmp_path / layout.PLAN).write_text(json.dumps({"provider": "qemu"}))
    v = _Verifier(tmp_path)
    v.verify_vm(scored)
    assert any(r.startswith("vm.evidence") for r in v.reasons)
    cap, _ = good()
    full = _run_dir(tmp_path / "full", cap)
    (full / layout.PLAN).write_text(json.dumps({"provider": "qemu"}))
    (full / layout.evidence_path(Evidence.vm_probes("after"))).write_text(GUEST_PROBES)
    v = _Verifier(full)
    v.verify_vm(scored)
    assert v.reasons == [] and v.violations == []


# -- a foreign guest whose DHCP took QEMU's gateway --------------------------------------------------
DHCP_ROUTE = ("eth0\t0002000A", "eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\neth0\t0002000A")


def with_egress(raw: str, lines: str) -> str:
    return raw.replace("=== ale-probe:ipv6_route ===", f"=== ale-probe:egress ===\n{lines}=== ale-probe:ipv6_route ===")


def test_a_dhcp_default_route_to_qemus_gateway_is_accepted_when_every_connect_fails() -> None:
    _, exp = good()
    assert exp.network == "user-restricted"
    closed = "".join(f"closed {a} {p}\n" for a in ("10.0.2.2", "10.0.2.3") for p in (22, 53, 80, 443))
    checks = {c.id: c for c in judge_vm_probes(with_egress(probes_with(*DHCP_ROUTE), closed), exp, "before")}
    assert checks["vm.probe.no_default_route"].ok, checks["vm.probe.no_default_route"].detail
    assert checks["vm.probe.no_egress"].ok
    # one connect that got through: both rules refuse the route
    opened = closed.replace("closed 10.0.2.2 80", "open 10.0.2.2 80")
    checks = {c.id: c for c in judge_vm_probes(with_egress(probes_with(*DHCP_ROUTE), opened), exp, "before")}
    assert checks["vm.probe.no_egress"].ok is False and "10.0.2.2:80" in checks["vm.probe.no_egress"].detail
    assert checks["vm.probe.no_default_route"].ok is False
    # a guest with neither bash nor python3 could not try: unknown, and the route is not accepted
    untested = closed.replace("closed", "untested")
    checks = {c.id: c for c in judge_vm_probes(with_egress(probes_with(*DHCP_ROUTE), untested), exp, "before")}
    assert checks["vm.probe.no_egress"].ok is None
    assert checks["vm.probe.no_default_route"].ok is False
    # another gateway than QEMU's, or no network planned: never accepted
    other = (DHCP_ROUTE[0], DHCP_ROUTE[1].replace("0202000A", "0102A8C0"))
    checks = {c.id: c for c in judge_vm_probes(with_egress(probes_with(*other), closed), exp, "before")}
    assert checks["vm.probe.no_default_route"].ok is False
    none = replace(exp, network="none", hostfwd_port=None)
    checks = {c.id: c for c in judge_vm_probes(with_egress(probes_with(*DHCP_ROUTE), closed), none, "before")}
    assert checks["vm.probe.no_default_route"].ok is False


def test_the_probe_script_tries_only_routes_off_lo() -> None:
    """The script's egress section, run on this host's shell against route tables we write."""
    import subprocess

    from ale.isolation.probes import PROBE_SCRIPT

    body = PROBE_SCRIPT[PROBE_SCRIPT.index("hexip()"):PROBE_SCRIPT.index("try_tcp()")]
    table = Path(tempfile.mkdtemp()) / "route"
    for rows, want in ((["lo\t00000000\t0100007F"], ""),
                       (["eth0\t00000000\t0202000A", "eth0\t0002000A\t00000000"], "10.0.2.2 10.0.2.2 10.0.2.3"),
                       (["eth0\t00000000\t0102A8C0"], "192.168.2.1")):
        table.write_text("Iface\tDestination\tGateway\tFlags\n" + "".join(f"{r}\t0003\n" for r in rows))
        out = subprocess.run(["sh", "-c", body.replace("/proc/net/route", str(table)) + 'echo "$targets"'],
                             capture_output=True, text=True, check=True).stdout.split()
        assert out == want.split(), rows
