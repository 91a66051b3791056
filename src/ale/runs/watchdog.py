"""The workspace watchdog: a run's workspace cannot fill the host's disk.

While the agent works, the workspace (a plain host folder unless the plan caps it
with a size-limited tmpfs) is measured every ``interval_s``: the bytes it really
occupies (allocated blocks: a sparse file counts for what it stores), how many
entries it holds, and how much room the host's file system has left. The first
limit crossed ends the agent's turn; the run goes on to its checks and grading
as usual, and the reason is recorded (``agent.ended`` event, ``result.error``).

Defaults fit the host: at most ``DEFAULT_MAX_BYTES`` or half of the disk free
when the run starts, whichever is less; a reserve of ``DEFAULT_RESERVE_BYTES``
free on the host; ``DEFAULT_MAX_ENTRIES`` entries. ``limits.workspace_max_bytes``
sets the byte limit.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 20 * 1024**3
DEFAULT_RESERVE_BYTES = 2 * 1024**3
DEFAULT_MAX_ENTRIES = 2_000_000


@dataclass(frozen=True)
class WorkspaceLimits:
    max_bytes: int
    max_entries: int = DEFAULT_MAX_ENTRIES
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    interval_s: float = 2.0

    host: Path | None = None  # the host folder whose file system keeps the reserve

    @classmethod
    def for_host(cls, workspace: Path, max_bytes: int | None = None) -> WorkspaceLimits:
        """Limits for a workspace folder; the reserve is kept on the file system of
        its parent (the host's, also when the workspace is a size-capped tmpfs)."""
        host = workspace.parent
        free = shutil.disk_usage(host).free
        default = min(DEFAULT_MAX_BYTES, max(free // 2, 1))
        reserve = min(DEFAULT_RESERVE_BYTES, free // 4)
        return cls(max_bytes=max_bytes or default, reserve_bytes=reserve, host=host)

    def to_dict(self) -> dict[str, int | float | str | None]:
        return {"max_bytes": self.max_bytes, "max_entries": self.max_entries,
                "reserve_bytes": self.reserve_bytes, "interval_s": self.interval_s,
                "host": None if self.host is None else str(self.host)}


def measure(root: Path, *, stop_after_entries: int) -> tuple[int, int]:
    """(allocated bytes, entries) under ``root``; links are not followed, and the
    walk stops counting once ``stop_after_entries`` is passed. Unreadable folders
    count as one entry each (the candidate may chmod its own folders)."""
    used, entries = 0, 0
    stack = [str(root)]
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as it:
                for entry in it:
                    entries += 1
                    if entries > stop_after_entries:
                        return used, entries
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return used, entries


async def watch(workspace: Path, limits: WorkspaceLimits) -> str:
    """Return (a sentence saying which) once a limit is crossed; runs until cancelled."""
    while True:
        await asyncio.sleep(limits.interval_s)
        used, entries = await asyncio.to_thread(measure, workspace, stop_after_entries=limits.max_entries)
        if used > limits.max_bytes:
            return f"the workspace occupies {used} bytes, over its limit of {limits.max_bytes}"
        if entries > limits.max_entries:
            return f"the workspace holds more than {limits.max_entries} entries"
        free = shutil.disk_usage(limits.host or workspace.parent).free
        if free < limits.reserve_bytes:
            return f"the host's disk has {free} bytes free, under the reserve of {limits.reserve_bytes}"
