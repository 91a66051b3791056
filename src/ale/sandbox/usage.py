"""What a running sandbox uses of its limits: processes (pids), memory and each
tmpfs, read on the host from the sandbox's cgroup and its mount namespace.

``UsageMonitor(init_pid, tmpfs=("/tmp",))`` finds the cgroup of the sandbox's init
(``/proc/<pid>/cgroup``: cgroup v1's ``pids`` and ``memory`` hierarchies, or v2's
unified one), samples while the agent works, and ``record()`` gives, for each limit,
the limit, the peak and how often the limit was hit:

- pids: ``pids.max``; the peak from ``pids.peak`` where the kernel has it, else the
  largest sampled ``pids.current``; ``pids.events``'s ``max``: forks refused (EAGAIN);
- memory: ``memory.limit_in_bytes`` / ``memory.max``; the peak from
  ``memory.max_usage_in_bytes`` / ``memory.peak`` (since the sandbox started: it
  counts tmpfs pages and page cache), else the largest sample; ``oom_kill``
  from ``memory.oom_control`` / ``memory.events``;
- each tmpfs: its size and the largest use seen (``statvfs`` through
  ``/proc/<pid>/root``, which needs the rights to enter the sandbox's root: root on
  the host); a tmpfs found full is named as such (the candidate saw ENOSPC there).

Where the host does not expose them (a remote engine, another provider, no rights)
the record says ``unavailable`` and why; nothing is guessed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
SAMPLE_S = 0.2
FULL_SHARE = 0.98  # a tmpfs this full was, for a candidate's write, full (ENOSPC)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    if text is None or text == "max":
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _keyed(path: Path, key: str) -> int | None:
    """The value of ``key`` in a flat keyed file (``pids.events``, ``memory.events``)."""
    for line in (_read(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return None


def cgroup_dirs(pid: int, root: Path = CGROUP_ROOT) -> dict[str, Path]:
    """The ``pids`` and ``memory`` cgroup folders of process ``pid`` (v1), or both the
    unified folder (v2). Raises OSError when they cannot be found."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    v1: dict[str, Path] = {}
    unified: Path | None = None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        for c in controllers.split(","):
            if c in ("pids", "memory"):
                v1[c] = root / c / rel.lstrip("/")
        if controllers == "" and (root / "cgroup.controllers").exists():
            unified = root / rel.lstrip("/")
    if set(v1) == {"pids", "memory"} and all(p.is_dir() for p in v1.values()):
        return v1
    if unified is not None and unified.is_dir():
        return {"pids": unified, "memory": unified}
    raise OSError(f"no pids and memory cgroup for process {pid} under {root} (found {sorted(v1)})")


class UsageMonitor:
    """Samples a sandbox's pids, memory and tmpfs use from the host (see the module)."""

    def __init__(self, init_pid: int | None, tmpfs: tuple[str, ...] = ("/tmp",), *, root: Path = CGROUP_ROOT,
                 reason: str | None = None):
        self.pid = init_pid
        self.tmpfs = tmpfs
        self.reason: str | None = reason
        self.dirs: dict[str, Path] = {}
        self.v2 = False
        self.samples = 0
        self.pids_seen = 0
        self.memory_seen = 0
        self.tmpfs_seen: dict[str, int] = {}
        self.tmpfs_size: dict[str, int] = {}
        if reason is not None:
            return
        if not init_pid:
            self.reason = "the sandbox's init process is not known on this host (no State.Pid in its inspect)"
            return
        try:
            self.dirs = cgroup_dirs(init_pid, root)
        except (OSError, ValueError) as e:
            self.reason = f"its cgroup is not readable here: {e}"
            return
        self.v2 = self.dirs["pids"] == self.dirs["memory"] and (self.dirs["pids"] / "memory.max").exists()
        self.sample()

    @property
    def available(self) -> bool:
        return self.reason is None

    def _mem_file(self, v1: str, v2: str) -> Path:
        return self.dirs["memory"] / (v2 if self.v2 else v1)

    def sample(self) -> None:
        if not self.available:
            return
        self.samples += 1
        self.pids_seen = max(self.pids_seen, _int(self.dirs["pids"] / "pids.current") or 0)
        self.memory_seen = max(self.memory_seen, _int(self._mem_file("memory.usage_in_bytes", "memory.current")) or 0)
        for path in self.tmpfs:
            try:
                st = os.statvfs(f"/proc/{self.pid}/root{path}")
            except OSError:
                continue
            self.tmpfs_size[path] = st.f_blocks * st.f_frsize
            self.tmpfs_seen[path] = max(self.tmpfs_seen.get(path, 0), (st.f_blocks - st.f_bfree) * st.f_frsize)

    @contextlib.asynccontextmanager
    async def watching(self, every_s: float = SAMPLE_S) -> AsyncIterator[UsageMonitor]:
        """Sample every ``every_s`` seconds while the block runs, once more at its end."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(every_s)
                self.sample()

        task = asyncio.ensure_future(loop()) if self.available else None
        try:
            yield self
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            self.sample()

    def record(self) -> dict[str, Any]:
        """Each limit, its peak, how often it was hit (JSON)."""
        if not self.available:
            return {"available": False, "reason": self.reason}
        p, m = self.dirs["pids"], self.dirs["memory"]
        pids_peak = _int(p / "pids.peak")
        mem_peak = _int(self._mem_file("memory.max_usage_in_bytes", "memory.peak"))
        oom = _keyed(m / "memory.events", "oom_kill") if self.v2 else _keyed(m / "memory.oom_control", "oom_kill")
        tmpfs = {path: {"size_bytes": size, "peak_bytes": self.tmpfs_seen.get(path, 0),
                        "full": size > 0 and self.tmpfs_seen.get(path, 0) >= size * FULL_SHARE}
                 for path, size in self.tmpfs_size.items()}
        return {
            "available": True, "cgroup": "v2" if self.v2 else "v1", "samples": self.samples, "sample_every_s": SAMPLE_S,
            "pids": {"limit": _int(p / "pids.max"), "peak": max(pids_peak or 0, self.pids_seen),
                     "peak_from": "pids.peak" if pids_peak is not None else "sampled pids.current",
                     "refused_forks": _keyed(p / "pids.events", "max")},
            "memory": {"limit_bytes": _int(self._mem_file("memory.limit_in_bytes", "memory.max")),
                       "peak_bytes": max(mem_peak or 0, self.memory_seen),
                       "peak_from": (("memory.peak" if self.v2 else "memory.max_usage_in_bytes") if mem_peak is not None
                                     else "sampled usage"),
                       "oom_kills": oom},
            "tmpfs": tmpfs,
        }


def limit_reached(record: dict[str, Any]) -> list[str]:
    """The limits a sandbox hit, each in words an operator acts on ([] for none or unknown)."""
    if not record.get("available"):
        return []
    out = []
    pids, mem = record["pids"], record["memory"]
    if pids.get("refused_forks"):
        out.append(f"the sandbox's pids limit ({pids['limit']}) was reached: {pids['refused_forks']} "
                   "fork(s) or thread(s) refused (EAGAIN); raise the policy's pids_limit")
    if mem.get("oom_kills"):
        limit = mem.get("limit_bytes")
        out.append(f"the sandbox's memory limit ({(limit or 0) // 2**20} MiB) was reached: "
                   f"{mem['oom_kills']} process(es) killed by the kernel (OOM); raise the policy's memory_bytes")
    for path, t in record.get("tmpfs", {}).items():
        if t.get("full"):
            out.append(f"{path} (a tmpfs of {t['size_bytes'] // 2**20} MiB) was full: writes there failed with ENOSPC; "
                       f"raise its size= in the policy's tmpfs (and memory_bytes: tmpfs must fit in half of it)")
    return out
