"""The seal of a VM run (``--provider qemu``, the ``vm`` run shape), judged by
``ale.isolation.vm_rules`` in place of the container's inspect and probe rules.

What the run planned (``expectation``: the read-only base and its sha256, the per-run
overlay, the two 9p shares, no network device, the memory and vCPUs QEMU was given,
the control and QMP sockets, the serial console's log, the candidate's uid and the
guest folders) is written once as ``evidence/vm-expectation.json``. Twice the VM is
read from QEMU itself (``capture_vm_at``: QMP, the qemu process's command line and open
files, the base's digest now) and probed from inside the guest: before the agent
(``before``), and after its turn while the VM still runs (``after``, the probes as a
uid the candidate never had, once no candidate process is left); the second capture
is also diffed with the first. ``ale verify`` re-judges the same files with the same
functions.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ale.isolation.probes import vm_probe_argv
from ale.isolation.registry import Check
from ale.isolation.vm_rules import VmExpectation, judge_vm_captures, judge_vm_probes, judge_vm_state
from ale.layout import Evidence
from ale.phases import CheckGroup
from ale.sandbox.qemu.capture import capture_vm_at
from ale.sandbox.qemu.image import base_digest

if TYPE_CHECKING:
    from ale.runs.state import RunState

_CHUNK = 1 << 20


def is_vm(state: RunState) -> bool:
    return state.plan.provider == "qemu"


def expectation(state: RunState) -> VmExpectation:
    """What the run planned for its VM: the image's record (read at preflight), the
    run's mounts, the policy; the provider's own choices (its overlay, sockets, the
    memory it gave QEMU) from the VM's record of its creation."""
    sb: Any = state.sandbox
    meta: dict[str, Any] = dict(getattr(sb, "meta", None) or {})
    img = state.live.image_record or state.prep.image_record or {}  # the guest the VM booted
    mounts = state.folder.mounts()
    shares = {f"ale{i}": (m.source, m.read_only) for i, m in enumerate(mounts)}
    state_dir = Path(str(getattr(sb, "state", "")))
    uid = state.plan.policy.user.split(":", 1)[0]
    # A foreign disk (``ale.sandbox.qemu.foreign``): restricted user-mode networking with
    # its one forward to computer-server, no share (the input is copied in, the workspace out).
    plan: dict[str, Any] = {"shares": shares, "network": "none"}
    if meta.get("foreign"):
        from ale.sandbox.qemu.foreign import expectation_fields

        plan = expectation_fields(meta)
    return VmExpectation(
        base_path=str(img.get("base") or meta.get("base")),
        base_sha256=str(img.get("sha256") or meta.get("base_sha256")),
        overlay_path=str(meta.get("overlay") or state_dir / "overlay.qcow2"),
        memory_mib=int(meta.get("memory_mb") or 0),
        vcpus=int(meta.get("vcpus") or 0),
        **plan,
        control_sockets=tuple(p for p in (meta.get("control_socket"), meta.get("qmp_socket")) if p),
        console_logs=(str(state_dir / "console.log"),),
        accel=None,  # either, recorded (vm.accel.recorded); --accel kvm refuses before a VM exists
        candidate_uid=int(uid) if uid.isdigit() else None,
        guest_input_dir=state.variant.public_root,
        guest_workspace_dir=state.variant.output_dir,
        # restored from a saved booted state: its disk sits between the overlay and the base
        layers=((str(meta["warm"]["disk"]), str(meta["warm"]["disk_sha256"])),) if meta.get("warm") else (),
        restored_from=dict(meta["warm"]) if meta.get("warm") else None,
    )


def probe_argv(state: RunState) -> list[str]:
    return vm_probe_argv(expectation(state))


def tell_probes(state: RunState, argv: list[str]) -> None:
    """A foreign disk's VM (no ale agent inside) runs the seal's probe command itself at
    the end of the turn, before it is paused, and knows the probes before the agent by it."""
    from ale.sandbox.qemu.foreign import ForeignQemuSandbox

    if isinstance(state.sandbox, ForeignQemuSandbox):
        state.sandbox.probes = list(argv)


async def _capture(state: RunState, exp: VmExpectation) -> dict[str, Any]:
    sb: Any = state.sandbox
    meta = dict(getattr(sb, "meta", None) or {})
    # The pid ale started (its pid file), which the capture compares with the process
    # answering QMP; not the whole inspect, whose QMP capture this one would repeat.
    pid = sb.pid()
    digest = await asyncio.to_thread(base_digest, exp.base_path)
    layers = {p: await asyncio.to_thread(base_digest, p) for p, _ in exp.layers} if exp.layers else None
    return await asyncio.to_thread(capture_vm_at, str(meta.get("qmp_socket")), base_sha256=digest,
                                   pid=pid or None, layer_sha256=layers)


async def judge_running(state: RunState, moment: Literal["before", "after"], probes_raw: str) -> None:
    """The VM at ``moment``: the guest's probes (``probes_raw``, already run) and QEMU's
    capture, judged and recorded (the evidence files and the check groups of the
    ``vm`` run shape)."""
    exp = expectation(state)
    store = state.record.store
    if moment == "before":
        store.write_json(Evidence.VM_EXPECTATION, exp.to_dict())
    store.write_text(Evidence.vm_probes(moment), probes_raw)
    probe_checks: list[Check] = judge_vm_probes(probes_raw, exp, moment)
    capture = await _capture(state, exp)
    if moment == "before":
        store.write_json(Evidence.VM_BEFORE, capture)
        state.record.vm_before = capture
        state_checks = judge_vm_state(capture, exp, "before")
    else:
        store.write_json(Evidence.VM_AFTER, capture)
        before = state.record.vm_before
        state_checks = judge_vm_state(capture, exp, "after") + judge_vm_captures(before, capture, exp)
    groups = ((CheckGroup.VM_BEFORE, CheckGroup.VM_PROBES_BEFORE) if moment == "before"
              else (CheckGroup.VM_AFTER, CheckGroup.VM_PROBES_AFTER))
    state.record.add_checks(groups[1], probe_checks)
    state.record.add_checks(groups[0], state_checks)
