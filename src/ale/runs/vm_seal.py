"""The seal checks of a VM run (``--provider qemu``), in place of the container's.

At each moment the lifecycle captures the VM as QEMU describes it (``QemuSandbox.inspect``:
the state folder's record, and while it runs QMP's ``query-status``, ``query-block``,
``query-chardev``, ``query-version``, ``query-pci``..., the qemu process's pid and
command line), plus, while it runs, the in-guest probes' raw output; it writes the
capture as evidence (``evidence/vm-<moment>.json``) and hands it, with what the run
planned (``expectation``), to ``ale.isolation.vm_rules.judge_vm_state(capture,
expectation, moment)``, which returns the checks.

The moments: ``created`` (the VM made, not started: no QEMU process yet), ``before``
(booted, before the agent: with the probes), ``after`` (the candidate's processes
killed by the stop step, the VM still running: with the probes, as the probe uid),
``stopped`` (QEMU quit: its recorded exit).

Where ``vm_rules`` is not in this build, nothing is judged: one check
``vm.rules_available`` is recorded as unknown (``ok=None``: a failure), so the run is
invalid; the raw captures stay in the evidence for a later ``ale verify``.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from ale.isolation.registry import Check

if TYPE_CHECKING:
    from ale.runs.state import RunState

VM_RULES_MODULE = "ale.isolation.vm_rules"


def is_vm(state: RunState) -> bool:
    return getattr(state.prep.provider, "name", "docker") == "qemu"


def capture_name(moment: str) -> str:
    return f"vm-{moment}.json"


def expectation(state: RunState) -> dict[str, Any]:
    """What the run planned for its VM, from the plan and the run's folders (never from
    the VM's own description), for ``judge_vm_state``."""
    sb: Any = state.sandbox
    meta = getattr(sb, "meta", {}) or {}
    policy = state.plan.policy
    img = state.prep.image_record or {}
    shares = {}
    for i, m in enumerate(state.folder.mounts()):
        shares[f"ale{i}"] = {"host_path": m.source, "target": m.target, "read_only": m.read_only,
                             "inode": os.stat(m.source).st_ino if os.path.exists(m.source) else None}
    return {
        "provider": "qemu",
        "base": img.get("base"),
        "base_sha256": img.get("sha256"),
        "overlay": meta.get("overlay"),
        "kernel": img.get("kernel"),
        "initrd": img.get("initrd"),
        "shares": shares,
        "network": "none",
        "memory_bytes": policy.memory_bytes,
        "memory_mb": meta.get("memory_mb"),
        "vcpus": meta.get("vcpus"),
        "candidate_user": policy.user,
        "pids_limit": policy.pids_limit,
        "control_sockets": {"control": meta.get("control_socket"), "qmp": meta.get("qmp_socket")},
        "state_dir": str(getattr(sb, "state", "")) or None,
        "accel": (meta.get("accel") or {}).get("accel"),
    }


def judge(state: RunState, capture: dict[str, Any], moment: str) -> list[Check]:
    """The checks of one moment: ``vm_rules.judge_vm_state``'s, or one unknown check."""
    state.record.store.write_json(capture_name(moment), capture)
    try:
        rules = importlib.import_module(VM_RULES_MODULE)
        judge_vm_state = rules.judge_vm_state
    except (ImportError, AttributeError) as e:
        return [Check("vm.rules_available", None, f"{VM_RULES_MODULE}.judge_vm_state", None,
                      f"the VM seal rules are not in this build ({e}): the capture is recorded "
                      f"(evidence/{capture_name(moment)}), the seal is unknown")]
    return list(judge_vm_state(capture, expectation(state), moment))
