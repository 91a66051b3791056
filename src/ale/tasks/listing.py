"""``ale task list``: every task folder under a path, and whether this harness can run it.

A task folder is a folder holding ``main.py`` (its subfolders are not searched
further: a task's own ``scripts/`` may hold other ``main.py`` files). Each one is
``ok`` (loads in a task process; its variants counted), ``unsupported`` (its card
asks for something the provider cannot give, e.g. a Windows VM) or ``error``
(the message says what failed, with the file).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ale.tasks.card import load_card
from ale.tasks.environment import EnvironmentBuildError, TaskEnvironment, resolve_environment
from ale.tasks.errors import TaskError
from ale.tasks.process import TaskCallFailed, TaskProcessError, inspect_task_sync

SKIP_DIRS = frozenset({"__pycache__", "scripts", "node_modules", ".git", "_shared"})


@dataclass
class TaskListing:
    path: str
    status: str  # ok | unsupported | error
    reason: str | None
    variants: int
    snapshot: str | None = None
    # {"declared", "provisioned", "missing"}: filled in by the caller (ale.provision is a layer above)
    software: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_task_dirs(root: Path) -> list[Path]:
    """Folders under ``root`` (``root`` itself included) that hold a ``main.py``."""
    root = root.resolve()
    if (root / "main.py").is_file():
        return [root]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if "main.py" in filenames and Path(dirpath) != root:
            found.append(Path(dirpath))
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
    return sorted(found)


def list_one(task_dir: Path, provider: str = "docker") -> TaskListing:
    try:
        card = load_card(task_dir)
    except TaskError as e:
        return TaskListing(str(task_dir), "error", str(e), 0)
    reason = card.unsupported_reason(provider)
    if reason is not None:
        return TaskListing(str(task_dir), "unsupported", reason, 0, card.snapshot)
    hint = ""
    try:
        env = resolve_environment(task_dir, build=False)
    except TaskError as e:
        env, hint = TaskEnvironment(), f" ({e})"
    try:
        info = inspect_task_sync(task_dir, environment=env)
    except (TaskError, TaskProcessError, TaskCallFailed, EnvironmentBuildError) as e:
        return TaskListing(str(task_dir), "error", f"{e}{hint}", 0, card.snapshot)
    oses = {((v.computer or {}).get("setup_config") or {}).get("os_type") for v in info.variants} - {None}
    for os_type in sorted(str(o) for o in oses):
        reason = card.unsupported_reason(provider, variant_os=os_type)
        if reason is not None:
            return TaskListing(str(task_dir), "unsupported", reason, len(info.variants), card.snapshot)
    return TaskListing(str(task_dir), "ok", None, len(info.variants), card.snapshot)


def list_tasks(root: Path, *, provider: str = "docker", workers: int = 4) -> list[TaskListing]:
    dirs = find_task_dirs(root)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(lambda d: list_one(d, provider), dirs))
