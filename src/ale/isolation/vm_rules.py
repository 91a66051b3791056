"""The VM seal: the rules read from what QEMU reports of a running VM, and from the guest.

A VM gets the container's promises (ISOLATION.md, "The same seal for a VM"), each read
back from what runs, never from the flags ale passed alone:

- **the capture** (`ale.sandbox.qemu.capture.capture_vm`): QMP's block nodes and their
  graph, PCI devices, chardevs, HMP's netdevs and user-net forwards, the 9p devices, the
  memory and vCPUs, QEMU's version and accelerator, and from the host kernel QEMU's argv
  and the files it holds open (with their open flags). Judged at a moment by
  `judge_vm_state(capture, expectation, moment)`;
- **the two captures** before and after the agent: the sealed parts must not change
  (`judge_vm_captures(before, after, expectation)`);
- **the probes in the guest** (the container's probe script, its output format and its
  sections, run as the candidate): `judge_vm_probes(raw, expectation, moment)`.

What the run planned is a `VmExpectation` (stored as `evidence/vm-expectation.json`);
`ale verify` re-judges the stored captures with the same functions. A fsdev's host path
and ``readonly`` flag are not queryable over QMP: they are read from QEMU's argv as the
kernel reports it (/proc/PID/cmdline), cross-checked against the directories QEMU holds
open, and the guest's write test of the input is their effective proof.

Every rule's docstring is its documentation (`docs/isolation.md`, `make docs`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ale.defaults import PROBE_UID
from ale.isolation.probe_rules import (
    MALFORMED,
    parse_mountinfo,
    split_sections,
    status_fields,
    write_results,
)
from ale.isolation.registry import (
    VM_CAPTURE,
    VM_CAPTURES,
    VM_PROBES,
    Check,
    Fit,
    Missing,
    Moment,
    Rule,
    Verdict,
    as_moment,
    judge_subject,
    limit_fits,
    rule,
    rules_of,
)

MIB = 1024 * 1024
Network = Literal["none", "user-restricted"]
NETWORKS: tuple[Network, ...] = ("none", "user-restricted")
# QEMU options that take no argument (anything else takes exactly one).
_FLAGS = frozenset({
    "S", "nodefaults", "nographic", "no-user-config", "no-reboot", "no-shutdown", "daemonize", "enable-kvm",
    "snapshot", "no-hpet", "no-acpi", "full-screen", "version", "help", "s", "no-fd-bootchk", "no-quit",
    "only-migratable", "preconfig", "enable-fips", "usb", "alt-grab", "ctrl-grab", "singlestep",
    "win2k-hack", "no-kvm", "portrait", "sdl", "curses", "semihosting", "enable-sync-profile",
})  # fmt: skip
# Options that create a netdev (or a NIC with its netdev) and the implied key of their first word.
_NET_OPTIONS = {"netdev": "type", "nic": "type", "net": "type"}
# Block nodes whose driver reads a host file (the protocol layer).
_PROTOCOL_DRIVERS = frozenset({"file", "host_device", "host_cdrom"})
# The user network's own servers of host files (restrict=on does not stop them).
_SLIRP_HOST_SERVICES = frozenset({"tftp", "bootfile", "smb"})
# The PCI devices a sealed VM may have, by (vendor, device id): the emulated chipsets
# (i440FX/PIIX, Q35/ICH9), QEMU's bridges and standard VGA, and the virtio devices that
# carry nothing from the host (legacy and modern ids). Not here, so refused: vsock
# (0x1af4:0x1053), virtio-fs (0x105a), ivshmem (0x1110), any passed-through host device.
_KNOWN_PCI = frozenset({
    (0x8086, 0x1237), (0x8086, 0x7000), (0x8086, 0x7010), (0x8086, 0x7020), (0x8086, 0x7113),  # i440FX, PIIX3/4
    (0x8086, 0x29C0), (0x8086, 0x2918), (0x8086, 0x2922), (0x8086, 0x2930),  # Q35, ICH9 LPC, SATA, SMBus
    (0x8086, 0x100E), (0x8086, 0x10D3),  # e1000, e1000e (NICs: the network rules judge them)
    (0x1B36, 0x0001), (0x1B36, 0x000C), (0x1B36, 0x000E), (0x1B36, 0x0008),  # pci/pcie bridges, root ports, pxb
    (0x1B36, 0x000D),  # qemu-xhci (USB: vm.devices.no_usb judges it)
    (0x1234, 0x1111),  # standard VGA
    (0x1AF4, 0x1000), (0x1AF4, 0x1041),  # virtio-net (the network rules judge it)
    (0x1AF4, 0x1001), (0x1AF4, 0x1042),  # virtio-blk
    (0x1AF4, 0x1002), (0x1AF4, 0x1045),  # virtio-balloon
    (0x1AF4, 0x1003), (0x1AF4, 0x1043),  # virtio-serial
    (0x1AF4, 0x1004), (0x1AF4, 0x1048),  # virtio-scsi
    (0x1AF4, 0x1005), (0x1AF4, 0x1044),  # virtio-rng
    (0x1AF4, 0x1009), (0x1AF4, 0x1049),  # virtio-9p
    (0x1AF4, 0x1050), (0x1AF4, 0x1052),  # virtio-gpu, virtio-input
})  # fmt: skip
# PCI class codes (the base class, high byte) of network controllers and USB controllers.
_PCI_NETWORK, _PCI_USB = 0x02, 0x0C03


# -- what the run planned ---------------------------------------------------------------
@dataclass(frozen=True)
class VmExpectation:
    """What a run planned for its VM: the evidence `vm-expectation.json` and what every
    VM rule compares against. Host paths are compared as given (store realpaths)."""

    base_path: str  # the read-only base qcow2
    base_sha256: str
    overlay_path: str  # the per-run qcow2 overlay, the VM's one writable disk
    shares: dict[str, tuple[str, bool]]  # 9p mount tag -> (host path, read_only)
    memory_mib: int
    vcpus: int
    network: Network = "none"
    hostfwd_port: int | None = None  # user-restricted: the one host port forwarded, on 127.0.0.1
    guest_port: int | None = None  # ... to this guest port (None: any)
    control_sockets: tuple[str, ...] = ()  # unix socket chardevs allowed (QMP, the control port)
    console_logs: tuple[str, ...] = ()  # file chardevs allowed (a serial console's log)
    accel: str | None = None  # "kvm" or "tcg" when the run requires one; None: either, recorded
    candidate_uid: int | None = None  # the candidate's uid in the guest (None: any non-root)
    guest_input_dir: str | None = None  # where the guest mounts the input share (probes)
    guest_workspace_dir: str | None = None  # ... and the workspace share
    # Read-only disks between the overlay and the base, top first, with their sha256: a
    # VM restored from a saved booted state has that state's disk there (ale.sandbox.qemu.warm).
    layers: tuple[tuple[str, str], ...] = ()
    restored_from: dict[str, Any] | None = None  # that saved state (its key, digests, when it was saved): recorded
    # "share": the input and workspace are 9p shares; "copy": a foreign disk's guest (no
    # ale agent to mount a share) gets a copy of the input through its computer-server,
    # and its workspace is copied out: the host's input is never exposed to the guest.
    input_transfer: str = "share"

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise ValueError(f"network must be one of {NETWORKS}, not {self.network!r}")
        if self.input_transfer not in ("share", "copy"):
            raise ValueError(f"input_transfer must be share or copy, not {self.input_transfer!r}")
        if self.network == "user-restricted" and self.hostfwd_port is None:
            raise ValueError("user-restricted networking needs the one hostfwd port")

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_path": self.base_path, "base_sha256": self.base_sha256, "overlay_path": self.overlay_path,
            "shares": {tag: {"host_path": p, "read_only": ro} for tag, (p, ro) in sorted(self.shares.items())},
            "memory_mib": self.memory_mib, "vcpus": self.vcpus, "network": self.network,
            "hostfwd_port": self.hostfwd_port, "guest_port": self.guest_port,
            "control_sockets": list(self.control_sockets), "console_logs": list(self.console_logs),
            "accel": self.accel, "candidate_uid": self.candidate_uid,
            "guest_input_dir": self.guest_input_dir, "guest_workspace_dir": self.guest_workspace_dir,
            "layers": [{"path": p, "sha256": h} for p, h in self.layers],
            **({"restored_from": self.restored_from} if self.restored_from else {}),
            "input_transfer": self.input_transfer,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VmExpectation:
        """The stored expectation; a missing or mistyped field raises ValueError. Also reads
        the provider's spelling: ``base``, ``overlay``, ``memory_mb``, ``control_sockets``
        as a {name: path} map, ``console_log`` (one path), ``candidate_user`` ("uid:gid")."""
        if not isinstance(d, dict):
            raise ValueError(f"a VM expectation is a JSON object, not {type(d).__name__}")
        d = _canonical(d)
        try:
            shares = {str(tag): (str(s["host_path"]), bool(s["read_only"])) for tag, s in d["shares"].items()}
            return cls(
                base_path=str(d["base_path"]), base_sha256=str(d["base_sha256"]), overlay_path=str(d["overlay_path"]),
                shares=shares, memory_mib=int(d["memory_mib"]), vcpus=int(d["vcpus"]), network=d.get("network", "none"),
                hostfwd_port=None if d.get("hostfwd_port") is None else int(d["hostfwd_port"]),
                guest_port=None if d.get("guest_port") is None else int(d["guest_port"]),
                control_sockets=tuple(map(str, d.get("control_sockets", ()))),
                console_logs=tuple(map(str, d.get("console_logs", ()))),
                accel=d.get("accel"),
                candidate_uid=None if d.get("candidate_uid") is None else int(d["candidate_uid"]),
                guest_input_dir=d.get("guest_input_dir"), guest_workspace_dir=d.get("guest_workspace_dir"),
                layers=tuple((str(x["path"]), str(x["sha256"])) for x in d.get("layers") or ()),
                restored_from=d.get("restored_from"),
                input_transfer=str(d.get("input_transfer", "share")),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed VM expectation: {type(e).__name__}: {e}") from e

    @property
    def input_tags(self) -> list[str]:
        return sorted(t for t, (_, ro) in self.shares.items() if ro)


_ALIASES = {"base": "base_path", "overlay": "overlay_path", "memory_mb": "memory_mib"}


def _canonical(d: dict[str, Any]) -> dict[str, Any]:
    """A stored expectation in `VmExpectation.to_dict`'s spelling."""
    out = {_ALIASES.get(k, k): v for k, v in d.items() if not (k in _ALIASES and _ALIASES[k] in d)}
    if isinstance(out.get("control_sockets"), dict):
        out["control_sockets"] = [p for p in out["control_sockets"].values() if p]
    if out.get("console_log") and not out.get("console_logs"):
        out["console_logs"] = [out["console_log"]]
    user = out.get("candidate_user")
    if out.get("candidate_uid") is None and isinstance(user, str) and user.split(":", 1)[0].isdigit():
        out["candidate_uid"] = int(user.split(":", 1)[0])
    return out


def as_expectation(value: VmExpectation | dict[str, Any]) -> VmExpectation:
    """A `VmExpectation`, from itself or its stored dict (`VmExpectation.from_dict`)."""
    return value if isinstance(value, VmExpectation) else VmExpectation.from_dict(value)


@dataclass(frozen=True)
class VmSubject:
    """One capture at one moment, with what the run planned."""

    moment: Moment
    capture: Any  # the capture as stored (not always a dict)
    expectation: VmExpectation
    fit: Fit = "exact"

    def get(self, key: str) -> Any:
        """A capture section; an absent one (its query failed) raises Missing (unknown)."""
        if not isinstance(self.capture, dict) or key not in self.capture:
            why = self.capture.get("errors", {}).get(key) if isinstance(self.capture, dict) else None
            raise Missing(f"{key} ({why})" if why else key)
        return self.capture[key]


@dataclass(frozen=True)
class VmCapturesSubject:
    """The captures before and after the agent."""

    moment: Moment
    before: Any
    after: Any
    expectation: VmExpectation


# -- reading QEMU's words -------------------------------------------------------------------
def parse_opts(value: str, implied: str | None = None) -> list[tuple[str, str]]:
    """QEMU's ``key=value,key=value`` (``,,`` is a literal comma), as (key, value) pairs in
    order; a first word without ``=`` is the value of the ``implied`` key (``user`` in
    ``-netdev user,...``), and a later one a flag (``on``)."""
    parts, cur, i = [], "", 0
    while i < len(value):
        ch = value[i]
        if ch == "," and value[i + 1 : i + 2] == ",":
            cur += ","
            i += 2
            continue
        if ch == ",":
            parts.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    parts.append(cur)
    out: list[tuple[str, str]] = []
    for n, p in enumerate(parts):
        if not p:
            continue
        k, eq, v = p.partition("=")
        if eq:
            out.append((k, v))
        elif n == 0 and implied:
            out.append((implied, p))
        else:
            out.append((p, "on"))
    return out


def cmdline_options(argv: list[str]) -> list[tuple[str, str | None]]:
    """QEMU's argv as (option without dashes, its argument or None); a bare word is a disk (``hda``)."""
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise TypeError("cmdline is not a list of strings")
    out: list[tuple[str, str | None]] = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and len(a) > 1:
            name = a.lstrip("-")
            if name in _FLAGS:
                out.append((name, None))
            else:
                out.append((name, argv[i + 1] if i + 1 < len(argv) else ""))
                i += 1
        else:
            out.append(("hda", a))
        i += 1
    return out


def _opt(pairs: list[tuple[str, str]], key: str, default: str | None = None) -> str | None:
    return next((v for k, v in pairs if k == key), default)


def _on(v: str | None) -> bool:
    return str(v).lower() in ("on", "yes", "true", "1")


def info_network(text: str) -> list[dict[str, Any]]:
    """HMP ``info network``: every NIC and netdev, {name, type, options} (hubs skipped)."""
    if not isinstance(text, str):
        raise TypeError("info network is not text")
    out = []
    for line in text.splitlines():
        s = line.strip().lstrip("\\").strip()
        if not s or re.fullmatch(r"hub \d+", s):
            continue
        # "hub0port1: #net180: index=0,..." names the hub port, then the netdev
        fields = s.split(": ")
        name, info = fields[-2] if len(fields) >= 2 else "", fields[-1]
        opts = dict(parse_opts(info.rstrip(",")))
        out.append({"name": name, "type": opts.get("type", info.split(":", 1)[0].split(",", 1)[0]), "options": opts})
    return out


def usernet_forwards(text: str) -> list[dict[str, Any]]:
    """HMP ``info usernet``: the forwarding rules (state ``HOST_FORWARD``): proto, host addr/port, guest addr/port."""
    if not isinstance(text, str):
        raise TypeError("info usernet is not text")
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 6 and f[0].endswith("[HOST_FORWARD]"):
            out.append({"proto": f[0].split("[", 1)[0].lower(), "host_addr": f[2], "host_port": int(f[3]),
                        "guest_addr": f[4], "guest_port": int(f[5])})
    return out


def cmdline_forwards(argv: list[str]) -> dict[str, list[str]]:
    """Every ``hostfwd=`` and ``guestfwd=`` on QEMU's argv (netdev, nic and net options)."""
    out: dict[str, list[str]] = {"hostfwd": [], "guestfwd": []}
    for name, val in cmdline_options(argv):
        if name in _NET_OPTIONS and val:
            for k, v in parse_opts(val, _NET_OPTIONS[name]):
                if k in out:
                    out[k].append(v)
    return out


def cmdline_fsdevs(argv: list[str]) -> dict[str, dict[str, Any]]:
    """The fsdevs on QEMU's argv by id: driver, path, readonly, security model (``-fsdev``
    and ``-virtfs``, whose fsdev id is its ``id`` or else its mount tag)."""
    out: dict[str, dict[str, Any]] = {}
    for name, val in cmdline_options(argv):
        if name not in ("fsdev", "virtfs") or not val:
            continue
        p = parse_opts(val, "driver")
        fid = _opt(p, "id") or (_opt(p, "mount_tag") if name == "virtfs" else None) or "?"
        out[fid] = {"driver": _opt(p, "driver"), "path": _opt(p, "path"), "readonly": _on(_opt(p, "readonly", "off")),
                    "security_model": _opt(p, "security_model"), "option": name,
                    "mount_tag": _opt(p, "mount_tag") if name == "virtfs" else None}
    return out


def cmdline_file_chardevs(argv: list[str]) -> dict[str, str]:
    """Chardev label -> host file, for file chardevs on QEMU's argv (``-chardev file``, and
    ``-serial``/``-parallel``/``-monitor file:PATH``, labelled serial0.., parallel0.., compat_monitor0..)."""
    out: dict[str, str] = {}
    counts: dict[str, int] = {}
    for name, val in cmdline_options(argv):
        if not val:
            continue
        if name == "chardev":
            p = parse_opts(val, "backend")
            if _opt(p, "backend") == "file":
                out[str(_opt(p, "id"))] = str(_opt(p, "path"))
        elif name in ("serial", "parallel", "monitor"):
            n = counts.get(name, 0)
            counts[name] = n + 1
            label = f"compat_monitor{n}" if name == "monitor" else f"{name}{n}"
            if val.startswith("file:"):
                out[label] = val[len("file:"):]
    return out


def chardev_target(filename: str) -> tuple[str, str]:
    """query-chardev's ``filename`` as (kind, target): ("unix", path), ("file", ""), ("tcp", "host:port"), ..."""
    f = str(filename)
    if f.startswith("disconnected:"):
        f = f[len("disconnected:"):]
    kind, _, rest = f.partition(":")
    if kind == "unix":
        return "unix", rest.split(",", 1)[0]
    return kind, rest


def _norm(path: str) -> str:
    """A host path as compared: normalised (``a//b/../c``), never resolved (the verifying
    machine's filesystem is not the run's). Plan with realpaths; /proc reports realpaths."""
    return os.path.normpath(path)


class BlockView:
    """The block layer as QMP reports it: nodes by name, each node's children by role."""

    def __init__(self, nodes: Any, graph: Any, devices: Any):
        if not isinstance(nodes, list) or not isinstance(graph, dict) or not isinstance(devices, list):
            raise TypeError("block nodes, graph or devices malformed")
        self.nodes: dict[str, dict[str, Any]] = {str(n["node-name"]): n for n in nodes}
        ids = {g["id"]: str(g["name"]) for g in graph["nodes"]}
        self.children: dict[str, dict[str, str]] = {}
        for e in graph["edges"]:
            self.children.setdefault(ids[e["parent"]], {})[str(e["name"])] = ids[e["child"]]
        self.devices = devices

    def host_file(self, node: str) -> str | None:
        """The host file a node reads: its own (a protocol node) or its ``file`` child's."""
        n = self.nodes.get(node)
        if n is None:
            return None
        if n.get("drv") in _PROTOCOL_DRIVERS:
            return _norm(str(n.get("file")))
        child = self.children.get(node, {}).get("file")
        return self.host_file(child) if child else None

    def chain(self, node: str) -> list[str]:
        """The node, then its backing node, then that one's, ..."""
        out = [node]
        while (nxt := self.children.get(out[-1], {}).get("backing")) and nxt not in out:
            out.append(nxt)
        return out

    def disks(self) -> list[dict[str, Any]]:
        """The attached block devices that hold a medium: (device, qdev, top node)."""
        return [{"device": d.get("device"), "qdev": d.get("qdev"), "node": d["inserted"]["node-name"]}
                for d in self.devices if isinstance(d.get("inserted"), dict)]


def _block(s: VmSubject) -> BlockView:
    return BlockView(s.get("block_nodes"), s.get("block_graph"), s.get("block_devices"))


def _pci_devices(buses: Any) -> list[dict[str, Any]]:
    """Every PCI device on every bus, bridges' buses included."""
    if not isinstance(buses, list):
        raise TypeError("query-pci is not a list")
    out: list[dict[str, Any]] = []

    def walk(devs: list[dict[str, Any]]) -> None:
        for d in devs:
            ci = d.get("class_info", {})
            out.append({"slot": d.get("slot"), "function": d.get("function"), "class": ci.get("class"),
                        "desc": ci.get("desc"), "qdev_id": d.get("qdev_id"),
                        "vendor": d.get("id", {}).get("vendor"), "device": d.get("id", {}).get("device")})
            walk(d.get("pci_bridge", {}).get("devices", []) or [])

    for bus in buses:
        walk(bus["devices"])
    return out


# -- the rules on one capture ------------------------------------------------------------
def _vm_rule(check_id: str, *, area: str, expected: Any = None, **kw: Any) -> Callable[..., Any]:
    return rule(check_id, source=VM_CAPTURE, area=area, expected=expected, **kw)


def _is_document(s: VmSubject) -> bool:
    return isinstance(s.capture, dict)


@_vm_rule("vm.capture.complete", area="capture", expected="every query answered")
def capture_complete(s: VmSubject) -> Verdict:
    """The capture is a JSON object in which every query QEMU was asked was answered: its
    version, status, block layer, devices, chardevs, networks, shares, memory, vCPUs, its
    argv and open files (observed: the queries that failed); and the process answering QMP
    (the socket's peer, from the kernel) is the one whose argv and open files were read.

    A query QEMU refused is a part of the VM nobody looked at; the rules reading it are
    unknown too, and unknown is invalid.
    """
    if not _is_document(s):
        return None, type(s.capture).__name__, "the VM capture is not a JSON object"
    errors = s.capture.get("errors")
    if not isinstance(errors, dict):
        raise Missing("errors")
    need = ("qmp_peer", "version", "status", "kvm", "block_nodes", "block_graph", "block_devices", "pci",
            "chardevs", "info_network", "info_usernet", "p9", "vnc", "memory", "cpus", "cmdline", "fds")
    absent = [k for k in need if k not in s.capture]
    if errors or absent:
        return None, {"errors": errors, "absent": absent}, f"unanswered: {sorted(set(absent) | set(errors))}"
    peer, pid = s.capture["qmp_peer"].get("pid"), s.capture.get("pid")
    if peer != pid:
        return (False, {"pid": pid, "qmp_peer": peer},
                f"QMP is answered by pid {peer}, the argv and files read are pid {pid}'s")
    return True, {"errors": {}, "pid": pid}, ""


def _accel_observed(s: VmSubject) -> tuple[str | None, str]:
    kvm = s.get("kvm")
    if isinstance(s.capture.get("accel"), str):
        return s.capture["accel"], "qom /machine accel"
    named: list[str] = []  # in the order QEMU tries them (`-accel kvm -accel tcg`: kvm, else tcg)
    for name, val in cmdline_options(s.get("cmdline")):
        if name == "accel" and val:
            named.append(str(_opt(parse_opts(val, "accel"), "accel")))
        elif name == "machine" and val:
            named += [a for a in (_opt(parse_opts(val, "type"), "accel") or "").split(":") if a]
        elif name == "enable-kvm":
            named.append("kvm")
    if bool(kvm["enabled"]):
        return "kvm", "query-kvm enabled"
    others = [a for a in named if a != "kvm"]
    if named and not others:
        return None, "the command line asks for kvm alone, yet query-kvm says it is not enabled"
    if others:
        return others[0], f"query-kvm not enabled; the command line's accelerators {named}"
    return "tcg", "query-kvm not enabled; no accelerator named: tcg by default"


@_vm_rule("vm.accel.recorded", area="qemu", expected=lambda s: s.expectation.accel or "kvm or tcg, recorded",
          when=_is_document)
def accel_recorded(s: VmSubject) -> Verdict:
    """The accelerator QEMU really uses (`query-kvm`, the machine's `accel` property, the
    command line) is known, agrees between them, and is the one the run requires if it
    requires one; QEMU's version is recorded with it.

    Under TCG the guest's instructions are emulated and timing differs; an operator who
    requires KVM must not get TCG silently, and a reader of the evidence must know which ran.
    """
    accel, how = _accel_observed(s)
    version = s.get("version")
    obs = {"accel": accel, "how": how, "qemu": version.get("qemu"), "package": version.get("package")}
    if accel is None:
        return False, obs, how
    want = s.expectation.accel
    ok = accel in ("kvm", "tcg") and (want is None or accel == want)
    return ok, obs, "" if ok else f"accelerator {accel}, required {want or 'kvm or tcg'}"


# -- network ---------------------------------------------------------------------------------
def _plan(network: Network) -> Callable[[VmSubject], bool]:
    return lambda s: _is_document(s) and s.expectation.network == network


@_vm_rule("vm.network.none", area="network", expected="no NIC, no netdev", when=_plan("none"),
          when_doc="when the run plans no network (`-nic none`)")
def network_none(s: VmSubject) -> Verdict:
    """No netdev and no NIC in `info network`, and no network controller among the PCI
    devices (`query-pci`, class 0x02xx).

    No device, no packet: the strongest form of `--network none`, and the default plan.
    """
    nets = info_network(s.get("info_network"))
    nics = [d for d in _pci_devices(s.get("pci")) if isinstance(d["class"], int) and d["class"] >> 8 == _PCI_NETWORK]
    ok = not nets and not nics
    obs = {"netdevs": [f"{n['name']}:{n['type']}" for n in nets], "pci_network": [d["desc"] for d in nics]}
    return ok, obs, "" if ok else f"network devices present: {obs}"


@_vm_rule("vm.net.user_restricted", area="network", expected="one user netdev, restrict=on",
          when=_plan("user-restricted"), when_doc="when the run plans user-mode networking")
def net_user_restricted(s: VmSubject) -> Verdict:
    """The only netdev is one user-mode (slirp) network with `restrict=on`, at most one NIC
    is attached to it, and it serves no host folder (`tftp=`, `bootfile=`, `smb=` on the
    command line); tap, bridge, socket, stream, dgram, vde, vhost-user or any other backend
    fails.

    `restrict=on` isolates the guest from the host and the outside: no DNS, no connection
    out, only the forwards the host set up. Its built-in TFTP and SMB servers are not
    outside it: they hand the guest host files whatever `restrict` says. Every other
    backend is a wire to the host's network or another process.
    """
    nets = info_network(s.get("info_network"))
    backends = [n for n in nets if n["type"] != "nic"]
    nics = [n for n in nets if n["type"] == "nic"]
    obs = [f"{n['name']}:{n['type']}" + (f",restrict={n['options'].get('restrict')}" if n["type"] == "user" else "")
           for n in nets]
    problems = []
    if len(backends) != 1 or backends[0]["type"] != "user":
        names = [f"{n['name']}:{n['type']}" for n in backends]
        problems.append(f"netdevs {names}, planned one user netdev")
    elif backends[0]["options"].get("restrict") != "on":
        problems.append(f"user netdev {backends[0]['name']} has restrict={backends[0]['options'].get('restrict')}")
    if len(nics) > 1:
        problems.append(f"{len(nics)} NICs")
    services = sorted({f"{k}={v}" for name, val in cmdline_options(s.get("cmdline")) if name in _NET_OPTIONS and val
                       for k, v in parse_opts(val, _NET_OPTIONS[name]) if k in _SLIRP_HOST_SERVICES})
    if services:
        problems.append(f"the user network serves host files: {services}")
    return not problems, obs, "; ".join(problems)


@_vm_rule("vm.net.hostfwd", area="network",
          expected=lambda s: f"tcp 127.0.0.1:{s.expectation.hostfwd_port} only", when=_plan("user-restricted"),
          when_doc="when the run plans user-mode networking")
def net_hostfwd(s: VmSubject) -> Verdict:
    """The user network's forwarding rules (`info usernet`'s HOST_FORWARD entries) are
    exactly one: TCP from 127.0.0.1 at the planned port (to the planned guest port), and
    the command line names no other `hostfwd`.

    A forward bound to 0.0.0.0 (shown as `*`) lets any machine on the network reach the
    guest's control server; a second forward is a door nobody planned.
    """
    fwd = usernet_forwards(s.get("info_usernet"))
    e = s.expectation
    problems = []
    if len(fwd) != 1:
        problems.append(f"{len(fwd)} host forwards, planned 1")
    for f in fwd:
        if f["proto"] != "tcp" or f["host_addr"] != "127.0.0.1" or f["host_port"] != e.hostfwd_port or (
                e.guest_port is not None and f["guest_port"] != e.guest_port):
            problems.append(f"forward {f['proto']} {f['host_addr']}:{f['host_port']} -> "
                            f"{f['guest_addr']}:{f['guest_port']}")
    on_cmdline = cmdline_forwards(s.get("cmdline"))["hostfwd"]
    if len(on_cmdline) > 1:
        problems.append(f"{len(on_cmdline)} hostfwd options on the command line")
    return not problems, {"forwards": fwd, "cmdline": on_cmdline}, "; ".join(problems)


@_vm_rule("vm.net.no_guestfwd", area="network", expected=[], when=_is_document)
def net_no_guestfwd(s: VmSubject) -> Verdict:
    """No guest-to-host forward: no `guestfwd=` on any netdev of the command line, and no
    `guestfwd.*` chardev (the one QEMU opens for each) in `query-chardev`.

    A guestfwd connects the guest to a host address or a command even under
    `restrict=on`: a way out that restrict does not close.
    """
    on_cmdline = cmdline_forwards(s.get("cmdline"))["guestfwd"]
    chardevs = [str(c.get("label")) for c in s.get("chardevs") if str(c.get("label", "")).startswith("guestfwd")]
    ok = not on_cmdline and not chardevs
    return ok, {"cmdline": on_cmdline, "chardevs": chardevs}, "" if ok else "guest-to-host forwards present"


# -- disks ----------------------------------------------------------------------------------
@_vm_rule("vm.disk.overlay_top", area="disk",
          expected=lambda s: [s.expectation.overlay_path, *(p for p, _ in s.expectation.layers),
                              s.expectation.base_path],
          when=_is_document)
def disk_overlay_top(s: VmSubject) -> Verdict:
    """Exactly one disk is attached, its top node reads the run's overlay, and its backing
    chain is exactly the overlay then the base (`query-block`, the block graph's `backing`
    and `file` edges, each node's host file).

    The guest writes only into the per-run overlay, discarded after the run; a second disk
    or another chain is storage or data the run did not plan.
    """
    b = _block(s)
    disks = b.disks()
    chains = [[b.host_file(n) for n in b.chain(d["node"])] for d in disks]
    want = [_norm(s.expectation.overlay_path), *(_norm(p) for p, _ in s.expectation.layers),
            _norm(s.expectation.base_path)]
    ok = len(chains) == 1 and chains[0] == want
    return ok, chains, "" if ok else f"disks and their chains {chains}, planned one: {want}"


@_vm_rule("vm.disk.base_read_only", area="disk", expected=True, when=_is_document)
def disk_base_read_only(s: VmSubject) -> Verdict:
    """Every block node reading the base disk has QEMU's read-only flag (`ro`), and every
    descriptor QEMU holds on the base file is open read-only (`/proc/PID/fdinfo` flags).

    The base is shared by every run: a VM that could write it could leave something for
    the next run. The kernel's open flags prove QEMU itself cannot write it.
    """
    b = _block(s)
    base = _norm(s.expectation.base_path)
    below = {base, *(_norm(p) for p, _ in s.expectation.layers)}  # a saved state's disk is shared as the base is
    nodes = {name: bool(n.get("ro")) for name, n in b.nodes.items() if b.host_file(name) in below}
    fds = {str(f["fd"]): f.get("flags") for f in s.get("fds") if _norm(str(f.get("path"))) in below}
    writable_fds = [fd for fd, flags in fds.items() if flags is None or int(str(flags), 8) & 0o3 != os.O_RDONLY]
    problems = []
    if not nodes:
        problems.append("no block node reads the base")
    if not all(nodes.values()):
        problems.append(f"writable nodes on the base: {sorted(n for n, ro in nodes.items() if not ro)}")
    if writable_fds:
        problems.append(f"the base is open for writing (fd {writable_fds})")
    return not problems, {"nodes": nodes, "fds": fds}, "; ".join(problems)


@_vm_rule("vm.disk.only_overlay_writable", area="disk", expected=lambda s: [s.expectation.overlay_path],
          when=_is_document)
def disk_only_overlay_writable(s: VmSubject) -> Verdict:
    """Every block node without the read-only flag reads the overlay: no other writable
    block device.

    A writable node on any other host file (an extra drive, the base opened directly, a
    host device) lets the guest change a host file that outlives the run.
    """
    b = _block(s)
    writable = {name: b.host_file(name) for name, n in b.nodes.items() if not n.get("ro")}
    bad = {n: f for n, f in writable.items() if f != _norm(s.expectation.overlay_path)}
    return not bad, sorted({str(f) for f in writable.values()}), f"writable block nodes on {bad}" if bad else ""


@_vm_rule("vm.disk.base_digest", area="disk", expected=lambda s: s.expectation.base_sha256, when=_is_document)
def disk_base_digest(s: VmSubject) -> Verdict:
    """The base disk's sha256, computed when the capture was taken, is the planned one
    (and so is each read-only layer's, for a VM restored from a saved booted state).

    The base is the VM's image: its digest pins it as an image id pins a container's. A
    swapped or modified base (same path, other bytes) shows here.
    """
    got = s.get("base_sha256")
    if got is None:
        raise Missing("base_sha256")
    if not s.expectation.layers:
        return (got == s.expectation.base_sha256, got,
                "" if got == s.expectation.base_sha256 else "the base disk differs")
    layers = s.get("layer_sha256")
    if not isinstance(layers, dict):
        raise Missing("layer_sha256")
    want = {p: h for p, h in s.expectation.layers}
    bad = [p for p, h in want.items() if layers.get(p) != h]
    ok = got == s.expectation.base_sha256 and not bad
    why = "" if ok else "; ".join((["the base disk differs"] if got != s.expectation.base_sha256 else []) +
                                  [f"the layer {p} differs" for p in bad])
    return ok, {"base": got, "layers": layers}, why


# -- shares -----------------------------------------------------------------------------------
def _shares(s: VmSubject) -> dict[str, dict[str, Any]]:
    """Mount tag -> the fsdev behind it (QOM's 9p devices, the argv's fsdevs)."""
    fsdevs = cmdline_fsdevs(s.get("cmdline"))
    out: dict[str, dict[str, Any]] = {}
    for dev in s.get("p9"):
        tag = str(dev["mount_tag"])
        fs = fsdevs.get(str(dev["fsdev"]))
        out[tag if tag not in out else f"{tag} (again)"] = {"fsdev": dev["fsdev"], **(fs or {"path": None})}
    return out


@_vm_rule("vm.shares.exact", area="shares", expected=lambda s: {t: p for t, (p, _) in s.expectation.shares.items()},
          when=_is_document)
def shares_exact(s: VmSubject) -> Verdict:
    """The 9p shares (each virtio-9p device's mount tag in QOM, and its fsdev's host path)
    are exactly the planned ones, no fsdev is unused, and the directories QEMU holds open
    (`/proc/PID/fd`) are the planned share folders, each of them, and folders inside them.

    Like the container's exactly-two-mounts: the input and the workspace, nothing else of
    the host's filesystem.
    """
    shares = _shares(s)
    got = {t: _norm(v["path"]) if v.get("path") else None for t, v in shares.items()}
    want = {t: _norm(p) for t, (p, _) in s.expectation.shares.items()}
    used = {str(v.get("fsdev")) for v in shares.values()}
    unused = sorted(set(cmdline_fsdevs(s.get("cmdline"))) - used)
    dirs = sorted({_norm(str(f["path"])) for f in s.get("fds") if f.get("kind") == "dir"})
    roots = set(want.values())
    # 9p opens what the guest walks into: folders inside a share are the share's
    stray = [d for d in dirs if not any(d == r or d.startswith(r.rstrip("/") + "/") for r in roots)]
    problems = []
    if got != want:
        problems.append(f"shares {got}, planned {want}")
    if unused:
        problems.append(f"fsdevs without a device: {unused}")
    if stray or not roots <= set(dirs):
        problems.append(f"QEMU holds open the folders {dirs}, planned {sorted(roots)} (and what is inside them)")
    return not problems, {"shares": got, "open_dirs": dirs}, "; ".join(problems)


@_vm_rule("vm.shares.input_read_only", area="shares", expected=lambda s: {t: True for t in s.expectation.input_tags},
          when=_is_document)
def shares_input_read_only(s: VmSubject) -> Verdict:
    """Each share the run plans read-only (the public input) is exported with
    `readonly=on`, and each planned read-write share (the workspace) without it.

    QEMU refuses every write through a read-only export; the guest's write test of the
    input (`vm.probe.input_read_only`) is the effective proof, this the configuration.
    """
    shares = _shares(s)
    obs = {t: v.get("readonly") for t, v in shares.items()}
    bad = [t for t, (_, ro) in s.expectation.shares.items() if t not in shares or shares[t].get("readonly") is not ro]
    return not bad, obs, f"shares not as planned read-only/read-write: {bad}" if bad else ""


# -- chardevs and devices ------------------------------------------------------------------------
@_vm_rule("vm.chardev.only_control", area="channels",
          expected=lambda s: sorted(s.expectation.control_sockets) + sorted(s.expectation.console_logs),
          when=_is_document)
def chardev_only_control(s: VmSubject) -> Verdict:
    """Every chardev (`query-chardev`) is a unix socket at a planned control path (QMP, the
    control port), or a file the run planned as a console log (its path from the command
    line); no pty, stdio, tcp, udp, pipe, serial port, guest forward or other file.

    A chardev is a byte stream between the guest (or the monitor) and the host: each one
    not planned is a channel out of the sandbox, or into QEMU's monitor.
    """
    files = cmdline_file_chardevs(s.get("cmdline"))
    bad, obs = [], []
    for c in s.get("chardevs"):
        kind, target = chardev_target(c["filename"])
        label = str(c["label"])
        if kind == "file":
            target = files.get(label, "")
        obs.append(f"{label}={kind}:{target}")
        ok = (kind == "unix" and target in s.expectation.control_sockets) or (
            kind == "file" and target in s.expectation.console_logs)
        if not ok:
            bad.append(f"{label}={kind}:{target}")
    return not bad, obs, f"chardevs not planned: {bad}" if bad else ""


@_vm_rule("vm.devices.no_usb", area="channels", expected=[], when=_is_document)
def devices_no_usb(s: VmSubject) -> Verdict:
    """No USB controller among the PCI devices (`query-pci`, class 0x0c03).

    A USB controller is how host devices are passed to a guest; the plan has none.
    """
    usb = [d["desc"] for d in _pci_devices(s.get("pci")) if d["class"] == _PCI_USB]
    return not usb, usb, f"USB controllers: {usb}" if usb else ""


@_vm_rule("vm.devices.known", area="channels", expected="emulated chipset, bridges, VGA, virtio without host access",
          when=_is_document)
def devices_known(s: VmSubject) -> Verdict:
    """Every PCI device is one a sealed VM may have: the emulated chipset, QEMU's bridges,
    the standard VGA, or a virtio device that carries nothing from the host (block,
    serial, 9p, net, rng, balloon, SCSI, GPU, input), by vendor and device id.

    An allowlist, not a denylist: vsock (a socket to the host), virtio-fs and ivshmem (host
    folders and host memory) and a passed-through host device each reach the host, and so
    would any device nobody thought of.
    """
    bad = sorted({f"{d['vendor']:04x}:{d['device']:04x} {d['desc']}" for d in _pci_devices(s.get("pci"))
                  if (d["vendor"], d["device"]) not in _KNOWN_PCI})
    return not bad, len(_pci_devices(s.get("pci"))), f"devices not allowed: {bad}" if bad else ""


@_vm_rule("vm.display.no_listener", area="channels", expected="no VNC server, or one on a planned unix socket",
          when=_is_document)
def display_no_listener(s: VmSubject) -> Verdict:
    """No VNC server shows the guest (`query-vnc`), unless it listens on a unix socket the run
    planned as a control path.

    A VNC server on a TCP port hands the guest's screen and keyboard to whoever connects;
    on a planned socket it is the harness's own screenshot channel.
    """
    vnc = s.get("vnc")
    if not vnc.get("enabled"):
        return True, {"enabled": False}, ""
    obs = {k: vnc.get(k) for k in ("enabled", "family", "host", "service", "auth")}
    ok = vnc.get("family") == "unix" and str(vnc.get("service")) in s.expectation.control_sockets
    return ok, obs, "" if ok else f"a VNC server listens on {vnc.get('family')} {vnc.get('host')}:{vnc.get('service')}"


# -- limits ----------------------------------------------------------------------------------------
@_vm_rule("vm.limits.memory", area="resources", expected=lambda s: s.expectation.memory_mib * MIB, when=_is_document)
def limits_memory(s: VmSubject) -> Verdict:
    """The guest's memory (`query-memory-size-summary`: base plus hot-plugged) is the planned size.

    The VM's memory is its cgroup limit: more than planned is a run with other resources.
    """
    m = s.get("memory")
    total = int(m["base-memory"]) + int(m.get("plugged-memory", 0))
    ok, detail = limit_fits(s.fit, total, s.expectation.memory_mib * MIB, what="memory",
                            show=lambda v: f"{v / MIB:g} MiB")
    return ok, total, detail


@_vm_rule("vm.limits.vcpus", area="resources", expected=lambda s: s.expectation.vcpus, when=_is_document)
def limits_vcpus(s: VmSubject) -> Verdict:
    """The guest has the planned number of vCPUs (`query-cpus-fast`).

    The VM's CPU limit, as `--cpus` is the container's.
    """
    n = len(s.get("cpus"))
    ok, detail = limit_fits(s.fit, n, s.expectation.vcpus, what="vCPUs")
    return ok, n, detail


# -- the two captures --------------------------------------------------------------------------
def sealed_view(capture: dict[str, Any]) -> dict[str, Any]:
    """The parts of a capture that must not change while the agent runs (what QEMU or the
    guest changes by itself is left out: times, statistics, file sizes, connection states,
    which chardev has a client, the PCI addresses and IRQs the firmware assigns, the files
    9p opens as the guest walks its shares)."""
    usernet = capture.get("info_usernet")
    pci = capture.get("pci")
    return {
        "pid": capture.get("pid"),
        "version": capture.get("version"),
        "cmdline": capture.get("cmdline"),
        "kvm": capture.get("kvm"),
        "accel": capture.get("accel"),
        "block_nodes": sorted(({k: n.get(k) for k in ("node-name", "drv", "ro", "file", "backing_file")}
                               for n in capture.get("block_nodes") or []), key=lambda n: str(n.get("node-name"))),
        "block_graph": capture.get("block_graph"),
        "block_devices": capture.get("block_devices"),
        # the devices, not their BARs and IRQs (which the guest's firmware assigns)
        "pci": _pci_devices(pci) if isinstance(pci, list) else pci,
        "chardevs": sorted((str(c.get("label")), chardev_target(c.get("filename", "")))
                           for c in capture.get("chardevs") or []),
        "info_network": capture.get("info_network"),
        "forwards": usernet_forwards(usernet) if isinstance(usernet, str) else usernet,
        "p9": capture.get("p9"),
        "vnc": {k: v for k, v in capture["vnc"].items() if k != "clients"} if isinstance(capture.get("vnc"), dict)
        else capture.get("vnc"),
        "memory": capture.get("memory"),
        "cpus": capture.get("cpus"),
        "base_sha256": capture.get("base_sha256"),
    }


@rule("vm.capture.unchanged", source=VM_CAPTURES, area="captures", expected="identical sealed state",
      moments=("after",))
def capture_unchanged(s: VmCapturesSubject) -> Verdict:
    """The VM's sealed state is the same before and after the agent: the same QEMU process
    and argv, block nodes, graph and disks, PCI devices, chardevs, netdevs and forwards,
    shares, memory, vCPUs and base digest.

    What was judged before the agent must be what it ran under: a device hot-plugged, a
    netdev or chardev added over the monitor, a disk swapped in between shows here.
    """
    missing = [name for name, doc in (("before", s.before), ("after", s.after)) if not isinstance(doc, dict)]
    if missing:
        raise Missing(", ".join(missing))
    a, b = sealed_view(s.before), sealed_view(s.after)
    absent = [k for k, v in a.items() if v is None and k not in ("accel",)]
    if absent:
        raise Missing(f"before.{absent[0]}")
    differing = sorted(k for k in a if a[k] != b[k])
    return not differing, differing, f"changed: {differing}" if differing else ""


# -- the probes in the guest ----------------------------------------------------------------------
@dataclass(frozen=True)
class VmProbeSubject:
    """The guest's probe output at one moment (`probe_rules.split_sections`)."""

    moment: Moment
    sections: dict[str, list[str]]
    expectation: VmExpectation
    input_dir: str
    workspace_dir: str = ""

    def section(self, name: str) -> list[str]:
        if name not in self.sections:
            raise KeyError(name)
        return self.sections[name]

    def status(self) -> dict[str, str]:
        return status_fields(self.section("status"))

    def writes(self) -> dict[str, str]:
        return write_results(self.section("writes"))


def _probe(check_id: str, *, area: str, expected: Any = None, **kw: Any) -> Callable[..., Any]:
    return rule(check_id, source=VM_PROBES, area=area, expected=expected, **kw)


@_probe("vm.probe.complete", area="probe run", expected="end marker, each section once")
def vm_probe_complete(s: VmProbeSubject) -> Verdict:
    """The guest's probe output reaches the script's end marker, holds each section once
    and nothing before the first, and (when recorded) the script exited 0.

    Output cut short or written into by something else proves nothing.
    """

    if not s.sections:
        raise KeyError("no section")
    problems = list(s.sections.get(MALFORMED, []))
    if "end" not in s.sections:
        return None, sorted(k for k in s.sections if k != MALFORMED), "probe output lacks its end marker"
    if "exit" in s.sections:
        fields = dict(i.split("=", 1) for i in " ".join(s.sections["exit"]).split() if "=" in i)
        if fields.get("exit_code") != "0" or fields.get("timed_out") not in (None, "False"):
            problems.append(f"the probe script failed: {fields}")
    return not problems, sorted(k for k in s.sections if k != MALFORMED), "; ".join(problems)


@_probe("vm.probe.uid_not_root", area="privileges",
        expected=lambda s: s.expectation.candidate_uid if s.expectation.candidate_uid is not None else "non-zero")
def vm_probe_uid(s: VmProbeSubject) -> Verdict:
    """The probe has a non-zero uid and gid and root's group 0 is not among its groups;
    before the agent it runs as the candidate (the planned uid when the run names one),
    after the turn as the probe's own uid (`ale.defaults.PROBE_USER`, one the candidate
    never had: nothing it left can signal or write into the probe) or the candidate's.

    Root in the guest owns the guest kernel: every other guest-side check would be moot.
    """
    line = next((ln for ln in s.section("id") if ln.startswith("numeric uid=")), None)
    if line is None:
        raise KeyError("numeric uid line")
    fields = dict(p.split("=", 1) for p in line.removeprefix("numeric ").split(" ", 2))
    uid, gid, groups = int(fields["uid"]), int(fields["gid"]), fields["groups"].split()
    want = s.expectation.candidate_uid
    allowed = {want} | ({PROBE_UID} if s.moment == "after" else set())
    ok = uid != 0 and gid != 0 and "0" not in groups and (want is None or uid in allowed)
    return (ok, {"uid": uid, "gid": gid, "groups": groups},
            "" if ok else f"the candidate is uid {uid} gid {gid} groups {groups}")


@_probe("vm.probe.caps_zero", area="privileges", expected=0)
def vm_probe_caps_zero(s: VmProbeSubject) -> Verdict:
    """`CapEff` and `CapPrm` of the candidate's process are 0 (`/proc/self/status`).

    The guest kernel's record that the candidate holds no root power.
    """
    st = s.status()
    vals = {k: st[k] for k in ("CapEff", "CapPrm")}
    ok = all(int(v, 16) == 0 for v in vals.values())
    return ok, vals, "" if ok else f"capabilities present: {vals}"


@_probe("vm.probe.no_new_privs", area="privileges", expected="1")
def vm_probe_no_new_privs(s: VmProbeSubject) -> Verdict:
    """`NoNewPrivs` is 1 for the candidate's process.

    No setuid binary in the guest can raise the candidate back to root.
    """
    got = s.status()["NoNewPrivs"]
    return got == "1", got, "" if got == "1" else f"NoNewPrivs is {got}"


@_probe("vm.probe.interfaces_lo_only", area="network",
        expected=lambda s: ["lo"] if s.expectation.network == "none" else ["lo", "one NIC"])
def vm_probe_interfaces(s: VmProbeSubject) -> Verdict:
    """The guest's `/proc/net/dev` lists only `lo` (with user-mode networking planned: `lo`
    and one NIC, the forward's end).

    The guest kernel's own view of its interfaces, read without sending a packet.
    """
    names = sorted(ln.split(":", 1)[0].strip() for ln in s.section("netdev")[2:] if ":" in ln)
    others = [n for n in names if n != "lo"]
    ok = "lo" in names and (not others if s.expectation.network == "none" else len(others) <= 1)
    return ok, names, "" if ok else f"interfaces: {names}"


# QEMU's user-mode network: the host (and gateway) and the DNS it offers a guest.
USER_NET_GATEWAY = "10.0.2.2"


def egress_attempts(s: VmProbeSubject) -> list[tuple[str, str, str]]:
    """The probe's TCP connects off `lo` as (result, address, port); a missing section
    (evidence from before the probe had it) raises KeyError."""
    return [tuple(ln.split()[:3]) for ln in s.section("egress") if len(ln.split()) >= 3]  # type: ignore[misc]


def _default_routes(s: VmProbeSubject) -> tuple[list[list[str]], list[list[str]]]:
    v4 = [ln.split() for ln in s.section("route")[1:] if ln.strip()]
    v6 = [ln.split() for ln in s.section("ipv6_route") if ln.strip()]
    return ([r for r in v4 if r[1] == "00000000"],
            [r for r in v6 if r[0] == "0" * 32 and r[1] == "00" and r[-1] != "lo"])


def _gateway(route: list[str]) -> str:
    h = route[2]
    return ".".join(str(int(h[i:i + 2], 16)) for i in (6, 4, 2, 0)) if len(h) == 8 else h


@_probe("vm.probe.no_default_route", area="network",
        expected="no default route (under restricted user-net: none, or QEMU's gateway with every connect refused)")
def vm_probe_no_default_route(s: VmProbeSubject) -> Verdict:
    """No default route in the guest (`/proc/net/route` destination 0, `/proc/net/ipv6_route`
    `::/0` off `lo`); with no network planned, no route off `lo` at all. Under restricted
    user-mode networking one IPv4 default route is accepted when its gateway is QEMU's own
    (10.0.2.2) and the probe's every TCP connect to it
    failed (`vm.probe.no_egress`).

    A route in the guest is the guest's word; what carries a packet out is QEMU's netdev,
    read from QEMU itself (`vm.net.user_restricted`: restrict=on drops every connection the
    guest starts). Under restrict=on QEMU's DHCP offers no router; a disk configured with a
    static gateway 10.0.2.2 has that route all the same.
    """
    v4 = [ln.split() for ln in s.section("route")[1:] if ln.strip()]
    v6 = [ln.split() for ln in s.section("ipv6_route") if ln.strip()]
    if s.expectation.network == "none":
        bad = [" ".join(r) for r in v4 if r[0] != "lo"] + [" ".join(r) for r in v6 if r[-1] != "lo"]
        return not bad, {"ipv4": len(v4), "ipv6": len(v6), "bad": bad}, f"routes out: {bad}" if bad else ""
    d4, d6 = _default_routes(s)
    accepted: list[str] = []
    if s.expectation.network == "user-restricted" and len(d4) == 1 and _gateway(d4[0]) == USER_NET_GATEWAY:
        try:
            tried = egress_attempts(s)
        except KeyError:
            tried = []
        to_gw = [t for t in tried if t[1] == USER_NET_GATEWAY]
        if to_gw and all(t[0] == "closed" for t in tried):
            accepted = [" ".join(d4[0])]
    bad = [" ".join(r) for r in d4 if " ".join(r) not in accepted] + [" ".join(r) for r in d6]
    observed = {"ipv4": len(v4), "ipv6": len(v6), "bad": bad, **({"accepted": accepted} if accepted else {})}
    return not bad, observed, f"routes out: {bad}" if bad else ""


@_probe("vm.probe.no_egress", area="network", expected="every TCP connect off lo fails",
        when=lambda s: s.expectation.network != "none" or "egress" in s.sections,
        when_doc="when the guest has a network planned, or the probe tried one")
def vm_probe_no_egress(s: VmProbeSubject) -> Verdict:
    """Where the guest has an IPv4 route off `lo`, the probe's TCP connects to the default
    gateway and to QEMU's user-net host and DNS addresses (ports 22, 53, 80 and 443) all
    fail; one that could not be tried (no bash or python3 in the guest) is unknown.

    The guest's own test of what QEMU's netdev rule promises: under restrict=on the
    gateway answers nothing the guest starts.
    """
    try:
        tried = egress_attempts(s)
    except KeyError:
        _, d6 = _default_routes(s)
        d4, _ = _default_routes(s)
        if d4 or d6:
            raise
        return True, "not probed (evidence without the section, and no default route)", ""
    opened = [f"{a}:{p}" for r, a, p in tried if r == "open"]
    untested = [f"{a}:{p}" for r, a, p in tried if r not in ("open", "closed")]
    if opened:
        return False, {"open": opened}, f"connected out of the guest: {opened}"
    if untested:
        return None, {"untested": untested}, f"could not try (no bash or python3 in the guest): {untested}"
    return True, {"closed": len(tried)}, ""


@_probe("vm.probe.input_read_only", area="filesystem", expected="read-only mount, write fails",
        when=lambda s: s.expectation.input_transfer == "share",
        when_doc="when the input is a share (a foreign disk's guest gets a copy: the host's input is hashed instead)")
def vm_probe_input_read_only(s: VmProbeSubject) -> Verdict:
    """The input is mounted read-only in the guest (`/proc/self/mountinfo`) and creating a
    file in it fails.

    The candidate must not change its own input, which is hashed before and after.
    """

    mounts = {m["mount_point"]: m for m in parse_mountinfo(s.section("mountinfo"))}
    m = mounts.get(s.input_dir)
    write = s.writes().get(s.input_dir)
    if write is None:
        raise KeyError(f"write test of {s.input_dir}")
    ro = m is not None and "ro" in m["options"]
    ok = ro and write == "fail"
    obs = {"mounted": m is not None, "options": m["options"] if m else None, "write": write}
    return ok, obs, "" if ok else f"the input at {s.input_dir} is not read-only: {obs}"


@_probe("vm.probe.root_not_writable", area="filesystem", expected="fail")
def vm_probe_root_not_writable(s: VmProbeSubject) -> Verdict:
    """Creating a file in the guest's `/` fails for the candidate (the root is read-only,
    or not writable by the candidate).

    The root is the overlay: a candidate able to write it could plant what a grader or a
    later step runs. (The overlay is discarded after the run either way.)
    """
    got = s.writes().get("/")
    if got is None:
        raise KeyError("write test of /")
    return got == "fail", got, "" if got == "fail" else "the candidate can write the guest's /"


# -- the entry points --------------------------------------------------------------------------
def all_vm_rules() -> list[Rule]:
    """Every VM rule, in the order the judges return their checks."""
    from ale.isolation.registry import VM_SOURCES

    return [r for source in VM_SOURCES for r in rules_of(source)]


def judge_vm_state(capture: Any, expectation: VmExpectation | dict[str, Any], moment: Moment | str, *,
                   fit: Fit = "exact") -> list[Check]:
    """Every VM rule that applies to one capture (`capture_vm`'s) at `moment`: "before"
    (the guest booted, before the agent's first step), "running", or "after" (the agent's
    turn over, QEMU still running). None (a capture that was not taken) is judged as
    missing: unknown. ``expectation``: a `VmExpectation` or its dict."""
    return judge_subject(VM_CAPTURE, VmSubject(as_moment(moment), capture, as_expectation(expectation), fit))


def judge_vm_captures(before: Any, after: Any, expectation: VmExpectation | dict[str, Any]) -> list[Check]:
    """The two captures together (`vm.capture.unchanged`), judged "after"."""
    return judge_subject(VM_CAPTURES, VmCapturesSubject("after", before, after, as_expectation(expectation)))


def judge_vm_probes(raw: str | dict[str, list[str]] | None, expectation: VmExpectation | dict[str, Any],
                    moment: Moment | str, *, input_dir: str | None = None) -> list[Check]:
    """The guest's probe output (`probes.vm_probe_argv(expectation)` run as the candidate),
    judged at `moment`; ``input_dir`` defaults to the expectation's."""

    expectation = as_expectation(expectation)
    sections = raw if isinstance(raw, dict) else split_sections(raw or "")
    in_dir = input_dir or expectation.guest_input_dir
    if not in_dir:
        raise ValueError("judging the guest's probes needs the guest's input folder")
    return judge_subject(VM_PROBES, VmProbeSubject(as_moment(moment), sections, expectation, in_dir,
                                                  expectation.guest_workspace_dir or ""))


def vm_check_ids() -> set[str]:
    """Every check id a VM rule can produce."""
    return {cid for r in all_vm_rules() for cid in r.ids()}

