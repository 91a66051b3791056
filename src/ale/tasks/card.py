"""The task card (`task_card.json`): the few fields the harness reads, plus the raw card.

ALE cards put the run limits under ``vm`` (``timeout_s``, ``vcpus``, ``memory_gb``);
other cards state ``timeout_s`` at the top level or a ``resources`` block. The card
is optional: a task folder without one gets the defaults (no timeout, no resource
hints, no data source).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ale.sandbox.policy import HOST_MEMORY_SHARE, IsolationPolicy, host_memory_bytes
from ale.tasks.errors import TaskError

CARD_FILE = "task_card.json"
LINUX_SNAPSHOTS = frozenset({"cpu-free-ubuntu", "ubuntu", "linux"})
# desktop.screen: the screen is cua's computer-server's (ale's VM guest serves it), not
# ale's desktop image's.
SERVER_SCREEN = "computer-server"
# GCE machine families: memory per vCPU in GB (ALE's own table).
_GB_PER_VCPU = {"standard": 3.75, "highmem": 7.75, "highcpu": 2.0}
_GB_PER_VCPU_FAMILY = {("g2", "standard"): 4.0, ("n2", "standard"): 4.0, ("e2", "standard"): 4.0,
                       ("n2", "highmem"): 8.0}
_MACHINE_RE = re.compile(r"^([a-z][a-z0-9]*)-(standard|highmem|highcpu)-([0-9]+)$")

_MEMORY_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}
_MEMORY_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")

MIB = 1024 * 1024


class TaskCard(BaseModel):
    """What the harness takes from a task card.

    - ``timeout_s``: the agent's wall time for this task, in seconds (None: not stated).
    - ``resources``: hints for the sandbox, keys ``cpus`` (float) and ``memory``
      (int, bytes), each present only when the card states it; ALE's
      ``vm.machineType`` (``c4-standard-4``: 4 vCPU, 15 GB) counts as stating both
      (``machine_type`` then names it).
    - ``data_source``: where the task's data lives (``local:`` paths resolved
      against the task folder, so the value works from any working directory).
    - ``raw``: the whole card as parsed, for reports.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float | None = None
    resources: dict[str, Any] = Field(default_factory=dict)
    data_source: str | None = None
    raw: dict[str, Any] = Field(default_factory=dict)

    @property
    def _vm(self) -> dict[str, Any]:
        vm = self.raw.get("vm")
        return vm if isinstance(vm, dict) else {}

    @property
    def snapshot(self) -> str | None:
        vm = self._vm
        value = vm.get("snapshot") or self.raw.get("snapshot")
        return value if isinstance(value, str) else None

    @property
    def desktop_screen(self) -> str | None:
        """Who serves the desktop the card asks for (``desktop.screen``): None for ale's
        desktop image (the default), ``computer-server`` for a screen only cua's
        computer-server serves (ale's VM guest)."""
        desktop = self.raw.get("desktop")
        screen = desktop.get("screen") if isinstance(desktop, dict) else None
        return screen if isinstance(screen, str) else None

    @property
    def os_type(self) -> str | None:
        vm = self._vm
        for value in (vm.get("os"), vm.get("osType"), vm.get("os_type"), self.raw.get("os_type")):
            if isinstance(value, str) and value:
                return value.lower()
        return None

    def unsupported_reason(self, provider: str = "docker", variant_os: str | None = None,
                           vm_images: Collection[str] = ()) -> str | None:
        """Why ``provider`` cannot run this task (None: it can). ALE's Windows VMs
        (``vm.snapshot`` cpu-free, gpu-*, *-license; ``os_type`` windows) cannot be
        a container; the qemu provider runs one when the operator maps its snapshot
        to a disk (``vm_images``: the snapshots an ``environment.vm_images`` maps)."""
        snap = self.snapshot
        os_type = (variant_os or self.os_type or "").lower()
        if provider != "qemu" and self.desktop_screen == SERVER_SCREEN:
            return (f"its desktop is computer-server's screen (desktop.screen: {SERVER_SCREEN}), which the {provider} "
                    "provider's desktop image does not serve: run it with --provider qemu (ale's guest serves one)")
        if snap is not None and snap not in LINUX_SNAPSHOTS:
            what = f"a Windows VM (vm.snapshot={snap})"
        elif os_type and os_type not in ("linux", "ubuntu"):
            what = f"a {os_type.capitalize()} VM (os_type={os_type})"
        else:
            return None
        if provider == "qemu" and snap is not None and snap in vm_images:
            return None
        key = snap or os_type
        fix = (f"map it to a disk: environment.vm_images: {{{key}: PATH-or-URL}} in the experiment, "
               f"or ale run --vm-image {key}=PATH-or-URL")
        if provider == "qemu":
            return f"needs {what}: no disk is mapped to {key!r}; {fix}"
        return f"needs {what}: not supported by the {provider} provider; run it with --provider qemu and {fix}"


class _CardError(ValueError):
    pass


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _positive_number(value: Any, where: str) -> float:
    if _is_number(value):
        num = float(value)
    elif isinstance(value, str):
        try:
            num = float(value.strip())
        except ValueError:
            raise _CardError(f"{where} must be a number of seconds, got {value!r}") from None
    else:
        raise _CardError(f"{where} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(num) or num <= 0:
        raise _CardError(f"{where} must be a positive finite number, got {value!r}")
    return num


def _memory_bytes(value: Any, where: str, default_unit: str = "") -> int:
    """Numbers are taken in ``default_unit``; strings may carry a unit ("512m", "8GiB")."""
    if _is_number(value):
        amount, unit = float(value), default_unit
    elif isinstance(value, str):
        m = _MEMORY_RE.match(value)
        if not m or m.group(2).lower() not in _MEMORY_UNITS:
            raise _CardError(f"{where} must be a size like 8g, 512m or 1073741824, got {value!r}")
        amount, unit = float(m.group(1)), (m.group(2).lower() or default_unit)
    else:
        raise _CardError(f"{where} must be a size, got {type(value).__name__} {value!r}")
    out = int(amount * _MEMORY_UNITS[unit])
    if out <= 0:
        raise _CardError(f"{where} must be positive, got {value!r}")
    return out


def _parse_timeout(card: dict[str, Any], vm: dict[str, Any]) -> float | None:
    # The vm block is where ALE cards state it; it wins over a top-level value.
    for where, block, key in (
        ("vm.timeout_s", vm, "timeout_s"),
        ("vm.timeout", vm, "timeout"),
        ("timeout_s", card, "timeout_s"),
    ):
        if block.get(key) is not None:
            return _positive_number(block[key], where)
    return None


def _parse_resources(card: dict[str, Any], vm: dict[str, Any]) -> dict[str, Any]:
    res = card.get("resources")
    if res is None:
        res = {}
    if not isinstance(res, dict):
        raise _CardError(f"resources must be an object, got {type(res).__name__}")
    out: dict[str, Any] = {}
    for where, block, key in (
        ("resources.cpus", res, "cpus"),
        ("vm.cpus", vm, "cpus"),
        ("vm.vcpus", vm, "vcpus"),
    ):
        if block.get(key) is not None:
            out["cpus"] = _positive_number(block[key], where)
            break
    machine = vm.get("machineType") or card.get("machineType")
    if isinstance(machine, str) and "cpus" not in out:
        m = _MACHINE_RE.match(machine.strip())
        if m:
            family, kind, n = m.group(1), m.group(2), int(m.group(3))
            out["cpus"] = float(n)
            per = _GB_PER_VCPU_FAMILY.get((family, kind), _GB_PER_VCPU[kind])
            out.setdefault("machine_memory", int(n * per * 1024**3))
            out["machine_type"] = machine
    for where, block, key, unit in (
        ("resources.memory", res, "memory", ""),
        ("vm.memory", vm, "memory", ""),
        ("vm.memory_gb", vm, "memory_gb", "g"),
    ):
        if block.get(key) is not None:
            out["memory"] = _memory_bytes(block[key], where, unit)
            break
    machine_memory = out.pop("machine_memory", None)
    if machine_memory is not None and "memory" not in out:
        out["memory"] = machine_memory
    return out


def _parse_data_source(card: dict[str, Any], task_dir: Path) -> str | None:
    for key in ("data_source", "task_data_source"):
        value = card.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise _CardError(f"{key} must be a non-empty string, got {value!r}")
        value = value.strip()
        if value.startswith("local:"):
            p = Path(value[len("local:") :])
            if not p.is_absolute():
                p = (task_dir / p).resolve()
            return f"local:{p}"
        return value
    return None


def load_card(task_dir: str | Path) -> TaskCard:
    """Read ``task_dir/task_card.json``; an absent card gives the defaults.

    Raises ``TaskError`` naming the file (and the line, for malformed JSON).
    """

    task_dir = Path(task_dir).resolve()
    path = task_dir / CARD_FILE
    if not path.exists():
        return TaskCard()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read the task card: {e}") from e
    try:
        card = json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskError(
            f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from e
    if not isinstance(card, dict):
        raise TaskError(f"{path}: the task card must be a JSON object, got {type(card).__name__}")
    vm = card.get("vm")
    if vm is None:
        vm = {}
    if not isinstance(vm, dict):
        raise TaskError(f"{path}: vm must be an object, got {type(vm).__name__}")
    desktop = card.get("desktop")
    if isinstance(desktop, dict) and desktop.get("screen", SERVER_SCREEN) != SERVER_SCREEN:
        raise TaskError(f"{path}: desktop.screen must be {SERVER_SCREEN!r} (or absent: ale's desktop image), "
                        f"not {desktop['screen']!r}")
    try:
        return TaskCard(
            timeout_s=_parse_timeout(card, vm),
            resources=_parse_resources(card, vm),
            data_source=_parse_data_source(card, task_dir),
            raw=card,
        )
    except _CardError as e:
        raise TaskError(f"{path}: {e}") from e


def fit_resources(card: TaskCard, host_cpus: int, host_memory: int) -> tuple[dict[str, Any], list[str]]:
    """The card's cpus/memory capped to what this host can give (Docker refuses
    ``--cpus`` above the host's count), and a note for each cap."""
    out, notes = _fit(card, host_cpus, host_memory)
    return out, list(notes.values())


def _fit(card: TaskCard, host_cpus: int, host_memory: int) -> tuple[dict[str, Any], dict[str, str]]:
    out: dict[str, Any] = {}
    notes: dict[str, str] = {}
    what = card.resources.get("machine_type") or "the task card"
    cpus = card.resources.get("cpus")
    if cpus is not None:
        out["cpus"] = min(float(cpus), float(host_cpus))
        if out["cpus"] < cpus:
            notes["cpus"] = f"{what} asks for {cpus:g} CPUs; capped to the host's {host_cpus}"
    mem = card.resources.get("memory")
    if mem is not None:
        # Whole MiB: the kernel keeps a memory limit in pages, and the seal checks
        # compare the limit the container got with the one asked for.
        cap = int(host_memory * HOST_MEMORY_SHARE) // MIB * MIB
        out["memory_bytes"] = max(MIB, min(int(mem), cap) // MIB * MIB)
        if out["memory_bytes"] < int(mem) // MIB * MIB:
            notes["memory_bytes"] = (f"{what} asks for {mem / 1024**3:.1f} GiB of memory; "
                                     f"capped to {cap / 1024**3:.1f} GiB (75% of the host)")
    return out, notes


def policy_for_card(policy: IsolationPolicy, card: TaskCard) -> tuple[IsolationPolicy, list[str]]:
    """The card's cpus and memory as the run's limits where the operator's policy
    does not set them itself, capped to the host (see ``fit_resources``); a note
    for each cap applied (none for what the policy sets itself)."""
    fitted, notes = _fit(card, os.cpu_count() or 1, host_memory_bytes())
    update = {k: v for k, v in fitted.items() if k not in policy.model_fields_set}
    if not update:
        return policy, []
    return policy.model_copy(update=update).fit_tmpfs(), [n for k, n in notes.items() if k in update]
