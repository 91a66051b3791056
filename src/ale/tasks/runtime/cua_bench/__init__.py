"""A small stand-in for the upstream `cua_bench` package, enough for task files.

Task modules written for ALE / cua-bench (`import cua_bench as cb`) load against
this module when the real package is absent; the loader installs it only then.
The decorators mark functions the way cua-bench does (`_td_type`), so the
loader finds them by mark, and by name for ALE files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, Union

__all__ = [
    "Task",
    "DesktopSession",
    "tasks_config",
    "setup_task",
    "evaluate_task",
    "solve_task",
    "interact",
    "Snapshot",
    "WindowSnapshot",
    "ClickAction",
    "RightClickAction",
    "DoubleClickAction",
    "MiddleClickAction",
    "DragAction",
    "MoveToAction",
    "ScrollAction",
    "TypeAction",
    "KeyAction",
    "HotkeyAction",
    "WaitAction",
    "DoneAction",
    "Action",
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
    async def launch_window(self, url: str | None = None, *, html: str | None = None, folder: str | None = None,
                            title: str = "Window", x: int | None = None, y: int | None = None,
                            width: int = 600, height: int = 400, engine: str | None = None) -> int:
        """A pywebview window on WebKitGTK, as cua-bench renders it; ``engine="chromium"``
        (ALE's) for a browser window instead."""
        ...
    async def execute_javascript(self, pid: int | str, javascript: str) -> Any: ...
    async def get_element_rect(self, pid: int | str, selector: str, *, space: str = "window",
                               timeout: float = 0.5) -> dict[str, Any] | None: ...
    async def click_element(self, pid: int | str, selector: str) -> None: ...
    async def right_click_element(self, pid: int | str, selector: str) -> None: ...
    async def execute_action(self, action: Any) -> None: ...
    async def get_snapshot(self) -> Snapshot: ...
    async def close_all_windows(self) -> None: ...


# -- cua-bench's action and snapshot types (cua_bench.types), same names and fields --
@dataclass
class WindowSnapshot:
    window_type: Literal["webview", "process", "desktop"]
    pid: str | None = None
    url: str | None = None
    html: str | None = None
    title: str = ""
    x: int = 0
    y: int = 0
    width: int = 0
    height: int = 0
    active: bool = False
    minimized: bool = False


@dataclass
class Snapshot:
    windows: list[WindowSnapshot]


@dataclass
class ClickAction:
    x: int
    y: int


@dataclass
class RightClickAction:
    x: int
    y: int


@dataclass
class DoubleClickAction:
    x: int
    y: int


@dataclass
class MiddleClickAction:
    x: int
    y: int


@dataclass
class DragAction:
    from_x: int
    from_y: int
    to_x: int
    to_y: int
    duration: float = 1.0


@dataclass
class MoveToAction:
    x: int
    y: int
    duration: float = 0.0


@dataclass
class ScrollAction:
    direction: Literal["up", "down"] = "up"
    amount: int = 100


@dataclass
class TypeAction:
    text: str


@dataclass
class KeyAction:
    key: str


@dataclass
class HotkeyAction:
    keys: list[str]


@dataclass
class DoneAction:
    pass


@dataclass
class WaitAction:
    seconds: float = 1.0


Action = Union[  # noqa: UP007 - cua-bench's spelling
    ClickAction, RightClickAction, DoubleClickAction, MiddleClickAction, DragAction, MoveToAction,
    ScrollAction, TypeAction, KeyAction, HotkeyAction, DoneAction, WaitAction,
]


def interact(env_path: str, task_id: int = 0) -> int:
    """cua-bench's ``cb.interact``: run a task folder's variant ``task_id`` end to
    end. Here it is ``ale run <env_path> --agent oracle --variant <task_id>`` (the
    harness's sealed run, its desktop included); returns the command's exit code."""
    import os
    import subprocess
    import sys

    folder = os.path.dirname(env_path) if os.path.isfile(env_path) else env_path
    argv = [sys.executable, "-m", "ale.cli", "run", folder, "--agent", "oracle", "--variant", str(task_id)]
    print("cua_bench.interact -> " + " ".join(argv), file=sys.stderr)
    return subprocess.call(argv)
