"""A small stand-in for the upstream `cua_bench` package, enough for task files.

Task modules written for ALE / cua-bench (`import cua_bench as cb`) load against
this module when the real package is absent; the loader installs it only then.
The decorators mark functions the way cua-bench does (`_td_type`), so the
loader finds them by mark, and by name for ALE files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

__all__ = [
    "Task",
    "DesktopSession",
    "tasks_config",
    "setup_task",
    "evaluate_task",
    "solve_task",
]

ALE_COMPAT = True

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Task:
    """One variant of a task: the prompt, an id, and free-form metadata."""

    description: str = ""
    task_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    computer: dict[str, Any] | None = None


def _mark(kind: str, split: str | None = None) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        fn._td_type = kind  # type: ignore[attr-defined]
        if split is not None:
            fn._td_split = split  # type: ignore[attr-defined]
        return fn

    return deco


def _decorator(kind: str) -> Callable[..., Any]:
    """Usable bare (`@cb.setup_task`) or called (`@cb.setup_task(split="train")`)."""

    def outer(fn: Any = None, *, split: str | None = None, **_: Any) -> Any:
        if callable(fn):
            return _mark(kind, split)(fn)
        return _mark(kind, split)

    outer.__name__ = kind
    return outer


tasks_config = _decorator("tasks_config")
setup_task = _decorator("setup_task")
evaluate_task = _decorator("evaluate_task")
solve_task = _decorator("solve_task")


class DesktopSession(Protocol):
    """The session a task's functions receive (the methods ALE tasks use)."""

    async def run_command(self, command: str, timeout: float | None = None, check: bool = False) -> dict[str, Any]: ...
    async def read_file(self, path: str) -> str: ...
    async def read_bytes(self, path: str) -> bytes: ...
    async def write_file(self, path: str, content: str) -> None: ...
    async def write_bytes(self, path: str, content: bytes) -> None: ...
    async def file_exists(self, path: str) -> bool: ...
    async def directory_exists(self, path: str) -> bool: ...
    async def list_dir(self, path: str) -> list[str]: ...
    async def screenshot(self) -> bytes: ...
