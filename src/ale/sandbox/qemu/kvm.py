"""Whether KVM really runs a guest here, and which accelerator a VM gets.

``/dev/kvm`` existing is not enough: on a nested paravirtual host a standard guest
kernel hangs under KVM right after the boot loader. ``probe`` boots the guest's
kernel under ``-accel kvm`` with a short timeout, watching its serial console for the
kernel's first lines; the verdict is cached per host boot (``/proc/sys/kernel/random/boot_id``)
under the VM cache, so the probe runs once per host boot, never on a test's hot path.

``choose_accel("auto")``: KVM when the cached (or fresh) verdict says it works, else
TCG with the reason recorded; ``"kvm"`` refuses (``SandboxError``) naming why it cannot;
``"tcg"`` is TCG.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ale.sandbox.base import SandboxError

PROBE_TIMEOUT_S = 12.0
MARKERS = (b"Linux version", b"Command line:")


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _verdict_path() -> Path:
    from ale.sandbox.qemu.image import vm_root

    return vm_root() / f"kvm-verdict-{boot_id()}.json"


def probe(kernel: Path, *, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Boot ``kernel`` under KVM (no disk) and watch the console for its first lines."""
    t0 = time.monotonic()
    if not os.path.exists("/dev/kvm"):
        return {"works": False, "reason": "/dev/kvm does not exist", "probed_s": 0.0}
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return {"works": False, "reason": "/dev/kvm is not readable and writable by this user", "probed_s": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        console = Path(tmp) / "console.log"
        p = subprocess.Popen(["qemu-system-x86_64", "-accel", "kvm", "-nodefaults", "-nographic",
                              "-no-reboot", "-m", "256",
                              "-kernel", str(kernel), "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1",
                              "-serial", f"file:{console}", "-nic", "none"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seen = b""
        try:
            while time.monotonic() - t0 < timeout:
                if p.poll() is not None:
                    break
                seen = console.read_bytes() if console.exists() else b""
                if all(m in seen for m in MARKERS):
                    return {"works": True, "reason": "a guest kernel booted under KVM",
                            "probed_s": round(time.monotonic() - t0, 2)}
                time.sleep(0.2)
        finally:
            p.kill()
            _, err = p.communicate()
        seen = console.read_bytes() if console.exists() else seen
        tail = seen.decode(errors="replace").strip().splitlines()[-1:] or [""]
        if p.returncode not in (None, -9) and err:
            reason = f"qemu -accel kvm failed: {err.decode(errors='replace').strip()[-300:]}"
        else:
            reason = (f"a guest kernel under KVM printed no kernel line within {timeout:.0f}s "
                      f"(last console line: {tail[0][-160:]!r}); this host is likely a nested hypervisor "
                      "that does not run it")
        return {"works": False, "reason": reason, "probed_s": round(time.monotonic() - t0, 2)}


def verdict(*, fresh: bool = False) -> dict[str, Any]:
    """The cached verdict for this host boot, probing once when there is none."""
    path = _verdict_path()
    if not fresh and path.is_file():
        try:
            return dict(json.loads(path.read_text()))
        except ValueError:
            pass
    from ale.sandbox.qemu.image import resolve_vm_image

    kernel = resolve_vm_image("ale-vm:latest").kernel
    v = {**probe(kernel), "boot_id": boot_id(), "kernel": str(kernel),
         "probed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(v, indent=2))
    return v


def choose_accel(request: str = "auto") -> dict[str, Any]:
    """``{"accel": "kvm"|"tcg", "requested": ..., "why": ..., "kvm_probe": ...}``."""
    if request == "tcg":
        return {"accel": "tcg", "requested": "tcg", "why": "TCG was asked for", "kvm_probe": None}
    if request not in ("auto", "kvm"):
        raise SandboxError(f"unknown accelerator {request!r}: choose auto, kvm or tcg")
    v = verdict()
    if v.get("works"):
        return {"accel": "kvm", "requested": request, "why": v["reason"], "kvm_probe": v}
    if request == "kvm":
        raise SandboxError(f"--accel kvm: KVM does not run a guest on this host: {v.get('reason')}")
    return {"accel": "tcg", "requested": "auto", "why": f"KVM unusable, TCG instead: {v.get('reason')}",
            "warning": f"KVM does not run a guest here ({v.get('reason')}); using TCG (slower)", "kvm_probe": v}
