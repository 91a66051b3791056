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


def use_built_guest(monkeypatch) -> None:
    """A test's environment for the built guest under TCG; skipped locally (failed under
    ALE_CI=1) where it cannot boot."""
    from tests.conftest import require

    monkeypatch.setenv("ALE_VM_DIR", VM_DIR)
    monkeypatch.setenv("ALE_QEMU_ACCEL", "tcg")
    ok, why = vm_ready()
    require(ok, why)


def booted_guest(tmp_path_factory, *, name: str, session: str = "exec", memory_mib: int = 512):
    """A module's one booted guest (a generator for a module-scoped fixture): yields
    ``(loop, sandbox, base)`` with ``base/in`` shared read-only at /input and ``base/ws``
    read-write at /workspace; removed after, and neither its qemu nor its overlay left."""
    import asyncio

    from ale.sandbox.base import Mount, SandboxSpec
    from ale.sandbox.policy import MIB, IsolationPolicy
    from ale.sandbox.qemu.provider import QemuProvider
    from tests.conftest import require

    os.environ["ALE_VM_DIR"] = VM_DIR
    ok, why = vm_ready()
    require(ok, why)
    base = tmp_path_factory.mktemp("vm")
    (base / "in").mkdir()
    (base / "in" / "data.txt").write_text("x\n")
    (base / "ws").mkdir()
    os.chown(base / "ws", 1000, 1000)
    loop = asyncio.new_event_loop()
    provider = QemuProvider(accel="tcg", session=session)
    spec = SandboxSpec(name=f"ale-{name}-{os.getpid()}", image="ale-vm:latest",
                       policy=IsolationPolicy(memory_bytes=memory_mib * MIB, cpus=1.0),
                       mounts=(Mount(str(base / "in"), "/input", True), Mount(str(base / "ws"), "/workspace", False)),
                       workdir="/workspace", labels={"ale.run_id": f"{name}-{os.getpid()}"}, environment={"HOME": "/tmp"})
    sb = loop.run_until_complete(provider.create(spec))
    try:
        loop.run_until_complete(sb.start())
        yield loop, sb, base
    finally:
        loop.run_until_complete(sb.remove())
        loop.close()
        os.environ.pop("ALE_VM_DIR", None)
    assert not any(sb.state.name in p for p in qemu_processes()), "the shared guest's qemu outlived the module"
    assert not sb.state.exists(), "the overlay outlived remove()"
