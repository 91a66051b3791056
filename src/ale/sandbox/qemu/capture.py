"""The VM's effective state, read from QEMU itself: the evidence the VM seal judges.

`capture_vm(qmp, pid, base_sha256=...)` asks the running QEMU (QMP, and HMP through QMP
where QMP has no query) and the host kernel (/proc/PID) what the VM really is, and returns
a plain JSON-able dict, stored as evidence (`evidence/vm-before.json`, `vm-after.json`)
and judged by `ale.isolation.vm_rules` at run time and again by `ale verify`, offline.

The capture stores what QEMU answered, raw; it judges and parses nothing, so a later
verifier re-reads the same answers with the same rules. A query that fails is recorded
under ``errors`` (its key absent), and the rules that read it are then *unknown*.

What it reads:

- ``qmp_peer``: the pid, uid and gid of the process at the other end of the QMP socket
  (SO_PEERCRED), which must be ``pid``: the /proc readings are of the process that answers;
- ``version``, ``status``, ``kvm`` (`query-version`, `query-status`, `query-kvm`) and
  ``accel`` (`qom-get /machine accel` where the machine has that property; else the
  rules read the accelerator from the command line and `query-kvm`);
- ``block_nodes`` (`query-named-block-nodes`, flat: each node's name, driver, file,
  ``ro`` flag, backing file), ``block_graph`` (`x-debug-query-block-graph`: which node is
  whose ``file`` and ``backing`` child) and ``block_devices`` (`query-block`);
- ``pci`` (`query-pci`, every device on every bus), ``chardevs`` (`query-chardev`);
- ``info_network`` and ``info_usernet`` (HMP: every netdev and NIC with its options, the
  user-mode network's forwarding rules and sockets);
- ``p9`` (every virtio-9p device's QOM path, ``fsdev`` and ``mount_tag``: the fsdev's
  host path and ``readonly`` flag exist only on the command line, which is stored too);
- ``vnc`` (`query-vnc`: whether a VNC server shows the guest's screen, and where it listens);
- ``memory`` (`query-memory-size-summary`), ``cpus`` (`query-cpus-fast`);
- ``cmdline`` (/proc/PID/cmdline) and ``fds`` (/proc/PID/fd and fdinfo: every host file
  and directory QEMU holds open, with its open flags: the kernel's record that the base
  disk is open read-only and which folders are shared);
- ``base_sha256``: the base disk's digest, computed by the caller (hashing gigabytes
  is the caller's to schedule: once per base, cached by its size and mtime).
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any, Protocol

from ale.sandbox.base import SandboxError
from ale.sandbox.qemu.qmp import QmpClient, QmpError

CAPTURE_SCHEMA = 1
# QOM containers where -device objects live: with an id, and without one.
_PERIPHERAL_PATHS = ("/machine/peripheral", "/machine/peripheral-anon")


def _reduce_node(n: dict[str, Any]) -> dict[str, Any]:
    """A block node without its statistics (which change while the VM runs)."""
    keep = ("node-name", "drv", "ro", "file", "backing_file", "backing_file_depth", "encrypted")
    out = {k: n[k] for k in keep if k in n}
    image = n.get("image")
    if isinstance(image, dict):
        out["image"] = {k: image[k] for k in ("filename", "format", "backing-filename", "full-backing-filename",
                                             "backing-filename-format") if k in image}
    return out


def _reduce_block_device(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: d[k] for k in ("device", "qdev", "type", "removable", "locked") if k in d}
    ins = d.get("inserted")
    if isinstance(ins, dict):
        out["inserted"] = {k: ins[k] for k in ("node-name", "ro", "drv", "file", "backing_file",
                                               "backing_file_depth") if k in ins}
    return out


def _p9_devices(qmp: QmpLike) -> list[dict[str, Any]]:
    out = []
    for base in _PERIPHERAL_PATHS:
        try:
            children = qmp.execute("qom-list", {"path": base})
        except Exception:  # noqa: BLE001 - no such container: no device of that kind
            continue
        for child in children:
            ctype = str(child.get("type", ""))
            if not (ctype.startswith("child<") and "9p" in ctype):
                continue
            path = f"{base}/{child['name']}"
            out.append({
                "path": path,
                "type": ctype[len("child<"):-1],
                "fsdev": qmp.execute("qom-get", {"path": path, "property": "fsdev"}),
                "mount_tag": qmp.execute("qom-get", {"path": path, "property": "mount_tag"}),
            })
    return out


def _vnc(qmp: QmpLike) -> Any:
    """`query-vnc`; a QEMU built without VNC has no such command, and no VNC server."""
    try:
        return qmp.execute("query-vnc")
    except Exception as e:
        if (isinstance(e, QmpError) and e.error_class == "CommandNotFound") or "CommandNotFound" in str(e):
            return {"enabled": False, "built": False}
        raise


def process_cmdline(pid: int) -> list[str]:
    """QEMU's argv, from the kernel (never from what the harness meant to pass)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        raw = f.read()
    return [a.decode("utf-8", errors="surrogateescape") for a in raw.split(b"\0")[:-1]]


def open_files(pid: int) -> list[dict[str, Any]]:
    """Every file and directory the process holds open: fd, path, kind, open flags (octal)."""
    out = []
    fd_dir = f"/proc/{pid}/fd"
    for name in sorted(os.listdir(fd_dir), key=lambda n: int(n) if n.isdigit() else -1):
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue  # closed meanwhile
        if not target.startswith("/"):
            continue  # sockets, pipes, eventfds: no host path
        entry: dict[str, Any] = {"fd": int(name), "path": target}
        try:
            mode = os.stat(f"{fd_dir}/{name}").st_mode
            entry["kind"] = ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode)
                             else "char" if stat.S_ISCHR(mode) else "block" if stat.S_ISBLK(mode) else "other")
            with open(f"/proc/{pid}/fdinfo/{name}") as f:
                for line in f:
                    if line.startswith("flags:"):
                        entry["flags"] = line.split(":", 1)[1].strip()
        except OSError:
            continue
        out.append(entry)
    return out


class QmpLike(Protocol):
    """What the capture needs of a QMP connection: `QmpClient`, or any client with the same
    ``execute`` (the provider's own monitor); ``hmp`` and ``peer`` are used where present,
    else done through ``execute`` and the connection's socket (``sock`` or ``_sock``)."""

    def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any: ...


def _hmp(qmp: QmpLike, command_line: str) -> str:
    hmp = getattr(qmp, "hmp", None)
    if callable(hmp):
        return str(hmp(command_line))
    out = qmp.execute("human-monitor-command", {"command-line": command_line})
    if not isinstance(out, str):
        raise SandboxError(f"HMP {command_line!r}: not text: {out!r}")
    return out.replace("\r\n", "\n")


def _peer(qmp: QmpLike) -> dict[str, int]:
    peer = getattr(qmp, "peer", None)
    if callable(peer):
        return dict(peer())
    sock = getattr(qmp, "sock", None) or getattr(qmp, "_sock", None)
    if not isinstance(sock, socket.socket):
        raise SandboxError("the QMP connection exposes no socket to read its peer from")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return {"pid": pid, "uid": uid, "gid": gid}


def capture_vm_at(qmp_path: str, *, base_sha256: str | None, pid: int | None = None,
                  timeout: float = 10.0, layer_sha256: dict[str, str] | None = None) -> dict[str, Any]:
    """`capture_vm` over a fresh connection to the QMP socket at ``qmp_path``; ``pid``
    defaults to the process answering it (the socket's peer). ``layer_sha256``: the
    read-only layers' digests (path: sha256) as the caller computed them, recorded."""
    with QmpClient(qmp_path, timeout=timeout).connect() as qmp:
        doc = capture_vm(qmp, qmp.peer()["pid"] if pid is None else pid, base_sha256=base_sha256)
    if layer_sha256 is not None:
        doc["layer_sha256"] = dict(layer_sha256)
    return doc


def capture_vm(qmp: QmpLike, pid: int, *, base_sha256: str | None) -> dict[str, Any]:
    """The VM's effective state, as QEMU and the host kernel report it (see the module doc).

    ``qmp``: a connected client (`QmpLike`); ``pid``: the qemu process; ``base_sha256``:
    the base disk's digest as the caller computed it (None: not computed, and the digest
    rule is unknown). Never raises for a query QEMU refuses: that key is absent and the
    reason is under ``errors``.
    """
    doc: dict[str, Any] = {"schema": CAPTURE_SCHEMA, "taken_at": datetime.now(UTC).isoformat(), "pid": pid,
                           "greeting": getattr(qmp, "greeting", None)}
    errors: dict[str, str] = {}

    def read(key: str, fn: Any) -> None:
        try:
            doc[key] = fn()
        except Exception as e:  # any client's error: recorded, and the rules reading it are unknown
            errors[key] = f"{type(e).__name__}: {e}"

    read("qmp_peer", lambda: _peer(qmp))  # the process that answers QMP is the one whose /proc is read
    read("version", lambda: qmp.execute("query-version"))
    read("status", lambda: qmp.execute("query-status"))
    read("kvm", lambda: qmp.execute("query-kvm"))
    with suppress(Exception):  # newer machines expose the accelerator; 7.2's pc machine does not
        doc["accel"] = qmp.execute("qom-get", {"path": "/machine", "property": "accel"})
    read("block_nodes", lambda: [_reduce_node(n) for n in qmp.execute("query-named-block-nodes", {"flat": True})])
    read("block_graph", lambda: qmp.execute("x-debug-query-block-graph"))
    read("block_devices", lambda: [_reduce_block_device(d) for d in qmp.execute("query-block")])
    read("pci", lambda: qmp.execute("query-pci"))
    read("chardevs", lambda: qmp.execute("query-chardev"))
    read("info_network", lambda: _hmp(qmp, "info network"))
    read("info_usernet", lambda: _hmp(qmp, "info usernet"))
    read("p9", lambda: _p9_devices(qmp))
    read("vnc", lambda: _vnc(qmp))
    read("memory", lambda: qmp.execute("query-memory-size-summary"))
    read("cpus", lambda: [{k: c[k] for k in ("cpu-index", "qom-path", "target", "props") if k in c}
                          for c in qmp.execute("query-cpus-fast")])
    read("cmdline", lambda: process_cmdline(pid))
    read("fds", lambda: open_files(pid))
    doc["base_sha256"] = base_sha256
    doc["errors"] = errors
    return doc
