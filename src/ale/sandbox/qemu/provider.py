"""The qemu provider (``ale.sandbox.providers``' ``qemu``): creates and finds ale's VMs,
the ale-guest ones (``sandbox.QemuSandbox``, ``QemuCuaSandbox``), those restored from a
saved booted guest (``warm``) and foreign disks (``foreign.ForeignQemuSandbox``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from ale.sandbox.base import (
    LABEL_EXPERIMENT,
    LABEL_MANAGED,
    LABEL_RUN,
    EngineUnreachable,
    SandboxError,
    SandboxGone,
    SandboxSpec,
)
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.qemu import kvm
from ale.sandbox.qemu.channel import drop_channel
from ale.sandbox.qemu.foreign import (
    FOREIGN_KIND,
    ForeignQemuSandbox,
    foreign_inspect,
    is_foreign_disk,
)
from ale.sandbox.qemu.image import DEFAULT_VM_IMAGE, resolve_vm_image
from ale.sandbox.qemu.sandbox import (
    QEMU_SECCOMP,
    QemuCuaSandbox,
    QemuSandbox,
    _pid_alive,
    state_root,
)
from ale.sandbox.qemu.shape import QEMU


def _sandbox_class(meta: dict[str, Any]) -> type[QemuSandbox]:
    if meta.get("foreign"):
        from ale.sandbox.qemu.foreign import ForeignQemuSandbox

        return ForeignQemuSandbox
    return QemuCuaSandbox if meta.get("session") == "cua" else QemuSandbox


def _states() -> list[Path]:
    root = state_root()
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if (p / "labels.json").is_file()]


def kill_state(state: Path) -> None:
    """Kill a VM's qemu (if it is one of this folder) and delete its folder."""
    try:
        pid = int((state / "qemu.pid").read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if _pid_alive(pid, state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not _pid_alive(pid, state):
                break
            time.sleep(0.05)
    shutil.rmtree(state, ignore_errors=True)


def windows_refusal(computer: dict[str, Any] | None) -> str | None:
    """Why a variant's desktop cannot be the VM guest's screen, whatever the guest: cua-bench's
    ``simulated`` desktop is HTML windows (``launch_window``, ``execute_javascript``, element
    rectangles) that ale's desktop image's helper serves, not computer-server."""
    if (computer or {}).get("provider") == "simulated":
        return ("asks for cua-bench's simulated desktop (HTML windows: launch_window, execute_javascript), which "
                "ale's desktop image serves and the qemu guest's computer-server does not: run it with "
                "--provider docker")
    return None


def no_display_reason(image: str, record: dict[str, Any] | None, width: int, height: int) -> str | None:
    """Why a desktop task cannot run on ``image`` (its ``image_inspect`` record), or None:
    ale's guest offers its computer-server's screen (Xvfb, ``display`` in its manifest) at
    that screen's size; a foreign disk's screen is not offered yet."""
    manifest = (record or {}).get("manifest") or {}
    if manifest.get("kind") == FOREIGN_KIND:
        return (f"{image} is a foreign disk: its screen is not driven by the qemu provider yet (only ale's own guest's "
                "is): run it with --provider docker or on ale's guest")
    screen = str((manifest.get("display") or {}).get("screen") or "")
    if not screen:
        return (f"the VM guest {image} ({manifest.get('ref', '?')}) has no display (built without Xvfb and cua's "
                "entrypoint in its root): rebuild it with `ale image build --vm` from a root that has "
                "them (ale-cua's), or run it with --provider docker")
    w, _, rest = screen.partition("x")
    h = rest.partition("x")[0]
    if (w, h) != (str(width), str(height)):
        return f"the VM guest {image}'s screen is {w}x{h}, not the {width}x{height} the task asks for"
    return None


class QemuProvider:
    """Creates VMs (``QemuSandbox``) from ``ale image build --vm`` guests."""

    name = "qemu"

    def __init__(self, accel: str | None = None, session: str | None = None, boot: str | None = None):
        self.accel_request = (accel or os.environ.get("ALE_QEMU_ACCEL") or "auto").lower()
        self.session = (session or os.environ.get("ALE_QEMU_SESSION") or "exec").lower()
        if self.session not in ("exec", "cua"):
            raise SandboxError(f"unknown qemu session {self.session!r}: exec or cua")
        # cold: every VM boots; warm: restored from a booted state saved once per shape (ale.sandbox.qemu.warm)
        self.boot = (boot or os.environ.get("ALE_QEMU_BOOT") or "cold").lower()
        if self.boot not in ("cold", "warm"):
            raise SandboxError(f"ALE_QEMU_BOOT={self.boot!r}: cold (boot every VM) or warm (restore a booted state)")
        self._accel: dict[str, Any] | None = None

    def ping(self) -> None:
        if shutil.which(QEMU) is None or shutil.which("qemu-img") is None:
            raise EngineUnreachable(f"{QEMU} or qemu-img is missing: apt-get install qemu-system-x86 qemu-utils "
                                    "(bash scripts/setup.sh does)")

    def accel(self) -> dict[str, Any]:
        if self._accel is None:
            self._accel = kvm.choose_accel(self.accel_request)
        return self._accel

    def engine_record(self) -> dict[str, Any]:
        self.ping()
        version = subprocess.run([QEMU, "--version"], stdout=subprocess.PIPE, text=True).stdout.splitlines()[0]
        return {"provider": "qemu", "version": version, "qemu": shutil.which(QEMU), "qemu_version": version,
                **self.accel(),
                # what confines QEMU itself on the host: its own seccomp filter, as every VM is started
                "security_options": [f"qemu -sandbox {QEMU_SECCOMP}"], "boot": self.boot,
                "host_kernel": os.uname().release, "host_cpus": os.cpu_count(), "state_root": str(state_root())}

    def image_inspect(self, image: str) -> dict[str, Any]:

        if is_foreign_disk(image):  # a whole bootable disk of its own (ale.sandbox.qemu.foreign)
            return foreign_inspect(image)
        img = resolve_vm_image(image)
        manifest = img.manifest
        return {"Id": f"sha256:{img.sha256}", "RepoTags": [image, manifest.get("ref", DEFAULT_VM_IMAGE)],
                # the root's own labels (an environment image's record digest), as an engine would give them
                "Config": {"Labels": dict(manifest.get("root_labels") or {})},
                "base": str(img.base), "sha256": img.sha256, "size": img.base.stat().st_size,
                "kernel": str(img.kernel), "initrd": str(img.initrd), "manifest": manifest}

    async def create(self, spec: SandboxSpec) -> QemuSandbox:

        self.ping()
        if is_foreign_disk(spec.image):
            disk = await asyncio.to_thread(foreign_inspect, spec.image)
            accel = await asyncio.to_thread(self.accel)
            return await asyncio.to_thread(ForeignQemuSandbox.create_foreign, spec, disk, accel)
        img = resolve_vm_image(spec.image)
        accel = await asyncio.to_thread(self.accel)
        warm = None
        if self.boot == "warm":
            from ale.sandbox.qemu.warm import ensure_warm

            warm = await ensure_warm(spec, img, accel, template=lambda tspec: QemuSandbox.create(
                tspec, img, accel, "exec", template=True))
        sb = await asyncio.to_thread(QemuSandbox.create, spec, img, accel, self.session, warm=warm)
        return _sandbox_class(sb.meta)(sb.state, spec.policy) if self.session == "cua" else sb

    def attach(self, name_or_id: str, policy: IsolationPolicy) -> QemuSandbox:
        for state in _states():
            try:
                meta = json.loads((state / "labels.json").read_text())
            except (OSError, ValueError):
                continue
            if name_or_id in (meta.get("id"), meta.get("name")):
                return _sandbox_class(meta)(state, policy)
        raise SandboxGone(f"no VM named {name_or_id!r}")

    def image_store(self) -> None:
        return None

    def remove_managed(self, *, run_id: str | None = None, experiment: str | None = None) -> list[str]:
        removed = []
        for state in _states():
            try:
                meta = json.loads((state / "labels.json").read_text())
            except (OSError, ValueError):
                continue
            labels = meta.get("labels") or {}
            if labels.get(LABEL_MANAGED) != "1":
                continue
            if run_id is not None and labels.get(LABEL_RUN) != run_id:
                continue
            if experiment is not None and labels.get(LABEL_EXPERIMENT) != experiment:
                continue
            drop_channel(str(state / "ctl.sock"))
            kill_state(state)
            removed.append(str(meta.get("name")))
        if run_id is None and experiment is None:  # a whole cleanup: saves a crash left half made
            from ale.sandbox.qemu.warm import remove_unfinished

            removed += remove_unfinished()
        return removed



__all__ = ["QemuProvider", "kill_state"]
