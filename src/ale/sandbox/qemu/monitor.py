"""The qemu provider's own QMP calls (its status, the quit, the description its
``inspect`` returns), on ale's one QMP client (``qmp.QmpClient``, which the seal's
capture uses too): one connection per call, since QMP answers one client at a time and
a fresh connection never inherits a half-read event stream.
"""

from __future__ import annotations

from typing import Any

from ale.sandbox.base import SandboxError
from ale.sandbox.qemu.qmp import QmpClient

# Every failure of a QMP call (unreachable, refused, an error answer): the client's.
MonitorError = SandboxError


def qmp(path: str, command: str, arguments: dict[str, Any] | None = None, *, timeout: float = 5.0) -> Any:
    """One command on a fresh connection; its ``return`` value."""
    with QmpClient(path, timeout=timeout) as m:
        return m.execute(command, arguments)


def capture(path: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """The VM as QEMU describes it now: status, block devices, chardevs, version,
    PCI devices, the accelerator, the guest's memory size and CPUs (each query that
    fails is kept as its error)."""
    with QmpClient(path, timeout=timeout) as m:
        out: dict[str, Any] = {"greeting": {"QMP": m.greeting}}
        for key, cmd in (("status", "query-status"), ("block", "query-block"), ("chardev", "query-chardev"),
                         ("version", "query-version"), ("kvm", "query-kvm"), ("cpus", "query-cpus-fast"),
                         ("memory", "query-memory-size-summary"), ("pci", "query-pci"),
                         ("named_block_nodes", "query-named-block-nodes")):
            try:
                out[key] = m.execute(cmd)
            except MonitorError as e:
                out[key] = {"error": str(e)}
        try:
            out["netdevs"] = m.hmp("info network")
        except MonitorError as e:
            out["netdevs"] = {"error": str(e)}
        return out
