"""A booted guest, saved once and restored per run (``ALE_QEMU_BOOT=warm``): the boot
(about 16 s of a 22 s run under TCG) becomes a restore.

**The saved state.** Once per (guest, accelerator, CPU model, memory, vCPUs, number of
shares, QEMU's version): ale boots a *template* VM of the run's shape whose guest does
only what every run shares (``guest_agent.base_setup``: the kernel's file systems; no
share mounted, no /tmp, no limits, no computer-server), waits for its agent, pauses
it (QMP ``stop``) and migrates it to a file through a unix socket of ours (``migrate
unix:``; QEMU's seccomp forbids ``exec:``). Its overlay, now holding what the boot
wrote, becomes the state's disk. Both are kept read-only by content under
``<cache>/vm/warm/<key>/`` (``disk.qcow2``, ``state.bin``, ``warm.json`` with their
sha256s). Unmounted 9p devices migrate (QEMU blocks migration only while one is
mounted).

**A run from it.** The run's VM has the template's devices, its own overlay on the
state's disk (the chain overlay → disk.qcow2 → base, both below the overlay
read-only), and ``-incoming unix:STATE/in.sock``: ale streams ``state.bin`` in, checks
QMP says ``paused``, ``cont``s, and sends the guest agent the run's part
(``configure``: the clock, 64 bytes of fresh entropy, since every clone starts from
the same random state, then the shares, /tmp, the candidate's cgroup and limits, the
computer-server). The seal judges the same VM: the expectation names the state's disk
as a layer (``vm.disk.overlay_top``, ``vm.disk.base_read_only``, ``vm.disk.base_digest``
cover it) and the evidence records the state's digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from ale.sandbox.base import Mount, SandboxError, SandboxSpec
from ale.sandbox.qemu.image import VmImage, flock, sha256_file, vm_root
from ale.sandbox.qemu.monitor import MonitorError, qmp
from ale.sandbox.qemu.shape import QEMU, cpu_model, machine_size


class Vm(Protocol):
    """What this module needs of a VM (``QemuSandbox``): its state folder and QMP, start, stop."""

    name: str
    state: Path

    @property
    def qmp_path(self) -> str: ...

    @property
    def overlay(self) -> Path: ...

    def running(self) -> bool: ...

    def console_tail(self, n: int = 3000) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def remove(self) -> None: ...


Template = Callable[[SandboxSpec], Vm]  # makes the template VM of a spec's shape (not started)

WARM_VERSION = "w1"
SAVE_TIMEOUT_S = 300.0
RESTORE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class WarmState:
    """One saved guest: its disk (the template's overlay) and its machine state."""

    folder: Path

    @property
    def disk(self) -> Path:
        return self.folder / "disk.qcow2"

    @property
    def state(self) -> Path:
        return self.folder / "state.bin"

    @property
    def manifest(self) -> dict[str, Any]:
        return dict(json.loads((self.folder / "warm.json").read_text()))

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.disk, self.state, self.folder / "warm.json"))

    def record(self) -> dict[str, Any]:
        """What a run's VM records of the state it was restored from."""
        m = self.manifest
        return {"key": m["key"], "disk": str(self.disk), "disk_sha256": m["disk_sha256"], "state": str(self.state),
                "state_sha256": m["state_sha256"], "state_bytes": m["state_bytes"], "saved_at": m["saved_at"],
                "base_sha256": m["base_sha256"]}


def warm_root() -> Path:
    return vm_root() / "warm"


@functools.cache
def qemu_version() -> str:
    """QEMU's version line (asked once per process: every warm run's key names it)."""
    try:
        return subprocess.run([QEMU, "--version"], capture_output=True, text=True, timeout=20).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def warm_key(image: VmImage, accel: str, cpu: str, memory_mb: int, vcpus: int, n_shares: int) -> str:
    from ale.sandbox.image import _sha

    return _sha(image.sha256, accel, cpu, str(memory_mb), str(vcpus), str(n_shares), qemu_version(), WARM_VERSION)[:12]


def template_spec(spec: SandboxSpec, empty: Path) -> SandboxSpec:
    """The run's shape with nothing of the run: as many shares, each of an empty folder."""
    mounts = tuple(Mount(str(empty), f"/run/ale-warm/{i}", True) for i in range(len(spec.mounts)))
    return replace(spec, name=f"{spec.name}-template"[:120], mounts=mounts, environment={})


async def ensure_warm(spec: SandboxSpec, image: VmImage, accel: dict[str, Any], *, template: Template,
                      say: Any = None) -> WarmState:
    """The saved state for ``spec``'s shape, made now when missing (one boot of the VM
    ``template`` makes, and a save)."""
    vcpus, mem_mb = machine_size(spec.policy)
    key = await asyncio.to_thread(warm_key, image, accel["accel"], cpu_model(accel["accel"]), mem_mb, vcpus,
                                  len(spec.mounts))
    warm = WarmState(warm_root() / key)
    if warm.complete():
        return warm
    warm_root().mkdir(parents=True, exist_ok=True)
    lock = await asyncio.to_thread(_lock, key)
    try:
        if warm.complete():
            return warm
        (say or (lambda _m: None))(f"saving a booted guest for this shape (once): {warm.folder}")
        await _make(warm, spec, image, accel, key, mem_mb, vcpus, template)
    finally:
        lock.close()
    return warm


def _lock(key: str, *, wait: bool = True) -> Any:
    """The lock of a shape's save (held while it is made)."""
    return flock(warm_root() / f".{key}.lock", wait=wait)


def remove_unfinished() -> list[str]:
    """The work folders of saves that a crash stopped half way (``.KEY-*`` whose lock
    nobody holds): removed, as ``ale cleanup`` removes a crashed run's VM."""
    removed = []
    for work in sorted(warm_root().glob(".*-*")) if warm_root().is_dir() else []:
        if not work.is_dir():
            continue
        lock = _lock(work.name[1:].split("-", 1)[0], wait=False)
        if lock is None:  # being made now
            continue
        try:
            shutil.rmtree(work, ignore_errors=True)
            removed.append(f"unfinished saved guest {work}")
        finally:
            lock.close()
    return removed


async def _make(warm: WarmState, spec: SandboxSpec, image: VmImage, accel: dict[str, Any], key: str, mem_mb: int,
                vcpus: int, template: Template) -> None:
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=warm_root()))
    sb: Vm | None = None
    try:
        empty = work / "empty"
        empty.mkdir()
        sb = await asyncio.to_thread(template, template_spec(spec, empty))
        await sb.start()
        booted_s = time.monotonic() - t0
        out = sb.state / "out.sock"
        state_file = work / "state.bin"
        await asyncio.to_thread(_save, sb.qmp_path, out, state_file)
        await sb.stop()
        shutil.copyfile(sb.overlay, work / "disk.qcow2")
        # the disk's backing file is the base, named by path: the same for every run
        for name in ("disk.qcow2", "state.bin"):
            os.chmod(work / name, 0o444)
        doc = {"key": key, "base": str(image.base), "base_sha256": image.sha256, "accel": accel["accel"],
               "memory_mb": mem_mb, "vcpus": vcpus, "shares": len(spec.mounts), "qemu": qemu_version(),
               "disk_sha256": sha256_file(work / "disk.qcow2"), "state_sha256": sha256_file(state_file),
               "state_bytes": state_file.stat().st_size, "booted_s": round(booted_s, 3),
               "saved_s": round(time.monotonic() - t0, 3),
               "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (work / "warm.json").write_text(json.dumps(doc, indent=2) + "\n")
        shutil.rmtree(empty)
        if warm.folder.exists():
            shutil.rmtree(warm.folder, ignore_errors=True)
        work.rename(warm.folder)
    finally:
        if sb is not None:
            await sb.remove()
        shutil.rmtree(work, ignore_errors=True)


def _save(qmp_path: str, sock_path: Path, dest: Path) -> None:
    """Pause the VM and migrate its state into ``dest`` through a unix socket we listen on."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(sock_path))
    srv.listen(1)
    srv.settimeout(SAVE_TIMEOUT_S)
    got: dict[str, Any] = {}

    def receive() -> None:
        try:
            conn, _ = srv.accept()
            with conn, open(dest, "wb") as f:
                while chunk := conn.recv(1 << 20):
                    f.write(chunk)
        except OSError as e:
            got["error"] = e

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    try:
        qmp(qmp_path, "stop")
        qmp(qmp_path, "migrate", {"uri": f"unix:{sock_path}"})
        deadline = time.monotonic() + SAVE_TIMEOUT_S
        status = ""
        while time.monotonic() < deadline:
            status = str((qmp(qmp_path, "query-migrate") or {}).get("status"))
            if status in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.1)
        if status != "completed":
            raise SandboxError(f"saving the booted guest failed: migration {status or 'did not finish'}")
        t.join(SAVE_TIMEOUT_S)
        if "error" in got:
            raise SandboxError(f"saving the booted guest failed: {got['error']}")
    finally:
        srv.close()


async def restore(sb: Vm, warm: dict[str, Any]) -> None:
    """Stream the saved state into ``sb``'s waiting QEMU (``-incoming unix:``), then run it."""
    path = str(sb.state / "in.sock")
    state = Path(str(warm["state"]))

    def stream() -> str:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            if time.monotonic() > deadline or not sb.running():
                raise SandboxError(f"QEMU of {sb.name} did not wait for its saved state ({path})")
            time.sleep(0.02)
        h = hashlib.sha256()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c, open(state, "rb") as f:
            c.connect(path)
            while chunk := f.read(1 << 20):
                h.update(chunk)
                c.sendall(chunk)
        return h.hexdigest()

    streamed = await asyncio.to_thread(stream)
    if streamed != warm.get("state_sha256"):
        # the bytes the VM got are not the state that was saved: never run it; the state is made again
        with contextlib.suppress(OSError):
            shutil.rmtree(state.parent)
        raise SandboxError(f"the saved state {state} has sha256 {streamed}, not {warm.get('state_sha256')} as saved: "
                           "removed (the next warm run saves it again)")
    deadline = time.monotonic() + RESTORE_TIMEOUT_S
    status = ""
    while time.monotonic() < deadline:
        if not sb.running():
            raise SandboxError(f"QEMU of {sb.name} exited while restoring: {sb.console_tail(500)}")
        with contextlib.suppress(MonitorError):
            status = str((await asyncio.to_thread(qmp, sb.qmp_path, "query-status") or {}).get("status"))
        if status not in ("", "inmigrate"):
            break
        await asyncio.sleep(0.05)
    if status != "paused":
        raise SandboxError(f"restoring the saved guest into {sb.name} ended with QEMU {status or 'silent'}")
    await asyncio.to_thread(qmp, sb.qmp_path, "cont")
