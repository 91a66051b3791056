"""Shared by the qemu provider's tests: where the built guest is, and whether this
machine can boot it (``require``: skipped locally, a failure under ALE_CI=1)."""

from __future__ import annotations

import os
import shutil

from ale.sandbox.base import ImageMissing
from ale.sandbox.qemu.image import resolve_vm_image, vm_root

# Read at import, before conftest's autouse fixture points ALE_CACHE_DIR at a temp folder:
# the guest is built once per machine (`ale image build --vm`), not per test.
VM_DIR = str(vm_root())


def vm_ready() -> tuple[bool, str]:
    if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
        return False, "needs qemu-system-x86_64 and qemu-img (bash scripts/setup.sh)"
    try:
        resolve_vm_image("ale-vm:latest")
    except ImageMissing:
        if os.environ.get("ALE_CI") != "1":
            return False, "needs the VM guest: ale image build --vm"
        # CI has a fresh machine: build it (and the cua image under it) as the cua tests build theirs
        from ale.sandbox.qemu.image import build_vm_image

        build_vm_image(say=lambda _m: None)
    return True, ""


def qemu_processes() -> list[str]:
    """The command lines of live qemu processes of ale's VMs (their state folders)."""
    from pathlib import Path

    from ale.sandbox.qemu.sandbox import state_root

    root = str(state_root()).encode()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"qemu-system") and root in cmd:
            out.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
    return out
