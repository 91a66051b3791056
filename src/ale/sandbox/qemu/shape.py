"""The machine a VM of a policy gets: QEMU's binary, the guest's CPU model, its vCPUs
and memory. Shared by the provider (``sandbox``) and the saved booted guests
(``warm``), whose key is this shape."""

from __future__ import annotations

import math
import os

from ale.sandbox.policy import MIB, IsolationPolicy

QEMU = "qemu-system-x86_64"
# The guest's own kernel, init and agent on top of what the policy gives the candidate.
GUEST_OVERHEAD_BYTES = 384 * MIB


def cpu_model(accel: str) -> str:
    """The guest's CPU: the host's under KVM; under TCG ``max``, every feature QEMU
    emulates (SSE4.2, POPCNT, AVX2...). QEMU's default ``qemu64`` lacks what today's
    wheels assume (numpy 2 needs x86-64-v2: an import dies with SIGILL)."""
    return "host" if accel == "kvm" else "max"


def machine_size(policy: IsolationPolicy) -> tuple[int, int]:
    """(vCPUs, memory in MiB) for ``policy``: its CPUs rounded up, at most the host's."""
    vcpus = max(1, min(math.ceil(policy.cpus), os.cpu_count() or 1))
    return vcpus, (policy.memory_bytes + GUEST_OVERHEAD_BYTES) // MIB
