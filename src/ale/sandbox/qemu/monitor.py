"""A small synchronous QMP client (QEMU's machine protocol on a unix socket): the
provider's own view of a VM, read from QEMU itself, never from inside the guest.

One connection per call (``Monitor(path).execute(...)`` or ``with Monitor(path) as m``):
QMP answers one client at a time, and a fresh connection never inherits a half-read
event stream.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any


class MonitorError(Exception):
    """QMP could not be reached, or answered with an error."""


class Monitor:
    def __init__(self, path: str, *, timeout: float = 5.0):
        self.path = path
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buf = b""
        self.greeting: dict[str, Any] = {}

    def __enter__(self) -> Monitor:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError as e:
            s.close()
            raise MonitorError(f"cannot connect to QMP at {self.path}: {e}") from e
        self.sock = s
        self.greeting = self._read()
        self.execute("qmp_capabilities")

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def _read(self) -> dict[str, Any]:
        assert self.sock is not None
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self.buf:
            if time.monotonic() > deadline:
                raise MonitorError("QMP did not answer in time")
            try:
                d = self.sock.recv(65536)
            except OSError as e:
                raise MonitorError(f"QMP read failed: {e}") from e
            if not d:
                raise MonitorError("QMP closed the connection")
            self.buf += d
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            return dict(json.loads(line))
        except ValueError as e:
            raise MonitorError(f"QMP sent a malformed line: {line[:200]!r}") from e

    def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run one command; its ``return`` value (events in between are skipped)."""
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        msg: dict[str, Any] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        try:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as e:
            raise MonitorError(f"QMP write failed: {e}") from e
        while True:
            r = self._read()
            if "event" in r:
                continue
            if "error" in r:
                raise MonitorError(f"QMP {command}: {r['error'].get('class')}: {r['error'].get('desc')}")
            return r.get("return")


def qmp(path: str, command: str, arguments: dict[str, Any] | None = None, *, timeout: float = 5.0) -> Any:
    """One command on a fresh connection."""
    with Monitor(path, timeout=timeout) as m:
        return m.execute(command, arguments)


def capture(path: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """The VM as QEMU describes it now: status, block devices, chardevs, version,
    PCI devices, the accelerator, the guest's memory size and CPUs."""
    with Monitor(path, timeout=timeout) as m:
        out: dict[str, Any] = {"greeting": m.greeting}
        for key, cmd in (("status", "query-status"), ("block", "query-block"), ("chardev", "query-chardev"),
                         ("version", "query-version"), ("kvm", "query-kvm"), ("cpus", "query-cpus-fast"),
                         ("memory", "query-memory-size-summary"), ("pci", "query-pci"),
                         ("named_block_nodes", "query-named-block-nodes")):
            try:
                out[key] = m.execute(cmd)
            except MonitorError as e:
                out[key] = {"error": str(e)}
        try:
            out["netdevs"] = m.execute("human-monitor-command", {"command-line": "info network"})
        except MonitorError as e:
            out["netdevs"] = {"error": str(e)}
        return out
