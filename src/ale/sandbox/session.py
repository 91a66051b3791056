"""The session object task code receives (cua-bench method names), in three roles.

- ``ContainerSession``: every call goes through a ToolBox into a container (the
  oracle's ``solve`` gets this one: the same constrained interface an agent has).
- ``RoutedSession``: file calls under given container paths are served from
  host folders (the staged input, the private reference store, the deliverables
  copy); everything else, commands included, goes to a container session.
  ``start()`` gets one over the candidate container; ``evaluate()`` gets one over
  a fresh grading container, created only if the grader runs a command.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.sandbox.base import SandboxError
from ale.sandbox.computer import ComputerError
from ale.sandbox.tools import TRUNCATION_MARKER, ToolBox, ToolRefused

# cua-bench's action classes (by name, as the task process sends them) -> the
# computer tool's actions. Coordinates are screen pixels (``screen: True``).
# click_element()'s wait for its element to be visible and stable (Playwright's
# actionability; its default is 30 s), and how often it looks.
ACTIONABLE_TIMEOUT_S = 5.0
ACTIONABLE_POLL_S = 0.05
# Scroll an element into the window's view when it is not wholly inside it (an
# element below the fold has screen coordinates off the window, or the screen).
SCROLL_INTO_VIEW_JS = """(() => { const e = document.querySelector(%s); if (!e) return false;
  const r = e.getBoundingClientRect();
  if (r.top >= 0 && r.left >= 0 && r.bottom <= window.innerHeight && r.right <= window.innerWidth) return false;
  e.scrollIntoView({block: 'center', inline: 'center'}); return true; })()"""

_ACTION_MAP = {
    "ClickAction": "left_click", "RightClickAction": "right_click", "DoubleClickAction": "double_click",
    "MiddleClickAction": "middle_click", "TripleClickAction": "triple_click", "MoveToAction": "mouse_move",
}


def action_to_tool_args(action: Any, width: int, height: int) -> dict[str, Any] | None:
    """The computer tool's arguments for one cua-bench action (a dict with ``type``
    and the action's fields); None for ``DoneAction``. Raises ``ValueError``."""
    if not isinstance(action, dict) or not isinstance(action.get("type"), str):
        raise ValueError(f"execute_action needs a cua-bench action, got {action!r}")
    kind = action["type"]
    if kind in _ACTION_MAP:
        return {"action": _ACTION_MAP[kind], "coordinate": [action["x"], action["y"]], "screen": True}
    if kind == "DragAction":
        return {"action": "left_click_drag", "start_coordinate": [action["from_x"], action["from_y"]],
                "coordinate": [action["to_x"], action["to_y"]], "duration": action.get("duration", 1.0), "screen": True}
    if kind == "ScrollAction":  # cua-bench: amount in pixels, 100 per click, at the screen's centre
        clicks = max(1, int(action.get("amount", 100)) // 100)
        return {"action": "scroll", "scroll_direction": action.get("direction", "up"), "scroll_amount": clicks,
                "coordinate": [width // 2, height // 2], "screen": True}
    if kind == "TypeAction":
        return {"action": "type", "text": action["text"]}
    if kind == "KeyAction":
        return {"action": "key", "text": action["key"]}
    if kind == "HotkeyAction":
        return {"action": "key", "text": "+".join(str(k) for k in action["keys"])}
    if kind == "WaitAction":
        return {"action": "wait", "duration": action.get("seconds", 1.0)}
    if kind == "DoneAction":
        return None
    raise ValueError(f"unsupported action type {kind!r}")


class GuiMethods:
    """cua-bench's GUI session calls, over two primitives a session provides:
    ``_gui_action`` (one computer-tool action) and ``_gui_task`` (task-only calls:
    windows, JavaScript, element rectangles, snapshots)."""

    async def _gui_action(self, args: dict[str, Any]) -> Any:
        raise NotImplementedError("this sandbox has no desktop")

    async def _gui_task(self, op: str, args: dict[str, Any]) -> Any:
        raise NotImplementedError("this sandbox has no desktop: " + op + "() is not available")

    def _gui_size(self) -> tuple[int, int]:
        return (1024, 768)

    async def screenshot(self) -> bytes:
        out = await self._gui_action({"action": "screenshot"})
        return bytes(out)

    async def launch_window(
        self, url: str | None = None, *, html: str | None = None, folder: str | None = None, title: str = "Window",
        x: int | None = None, y: int | None = None, width: int = 600, height: int = 400,
        files: dict[str, str] | None = None, engine: str | None = None, **_: Any,
    ) -> int:
        """A window as cua-bench renders it (pywebview on WebKitGTK); ``engine="chromium"``
        (ALE's) opens a browser window instead."""
        if folder is not None and not files:
            raise ValueError("launch_window(folder=...): the folder's files did not reach the harness")
        args = {"url": url, "html": html, "files": files, "title": title, "x": x, "y": y, "width": width,
                "height": height, "engine": engine}
        return int(await self._gui_task("launch_window", {k: v for k, v in args.items() if v is not None}))

    async def execute_javascript(self, pid: int | str, javascript: str) -> Any:
        return await self._gui_task("execute_javascript", {"pid": pid, "javascript": javascript})

    async def get_element_rect(self, pid: int | str, selector: str, *, space: str = "window",
                               timeout: float = 0.5) -> Any:
        import asyncio
        import time

        deadline = time.monotonic() + max(0.0, float(timeout))
        while True:
            rect = await self._gui_task("get_element_rect", {"pid": pid, "selector": selector, "space": space})
            if rect is not None or time.monotonic() >= deadline:
                return rect
            await asyncio.sleep(max(0.1, float(timeout) / 2))

    async def _actionable_rect(self, pid: int | str, selector: str, timeout: float | None = None) -> Any:
        """The element's screen rectangle once it is visible (a box of some size) and
        stable (the same on two reads in a row), as Playwright waits before a click.
        When it never is within ``timeout``: the last rectangle the page gave (an
        ``<option>`` of a closed drop-down has a 0x0 box at the page's corner in every
        engine, and cua-bench's Playwright click clicks its centre all the same), or
        None when the element was not found.

        The page learns of an earlier click or key through the display (X events via
        the window's UI process), while this reads it through another channel (a
        JavaScript evaluation): the two are not ordered, so an element an earlier
        action shows (a context menu) may still be hidden here, its rectangle all
        zeros, and a click at its centre would land in the window's corner. Under
        load that gap grows (issue 27, item 8)."""
        import asyncio
        import time

        deadline = time.monotonic() + (ACTIONABLE_TIMEOUT_S if timeout is None else timeout)
        last = None
        while True:
            rect = await self._gui_task("get_element_rect", {"pid": pid, "selector": selector, "space": "screen"})
            visible = isinstance(rect, dict) and float(rect.get("width") or 0) > 0 \
                and float(rect.get("height") or 0) > 0
            if visible and rect == last:
                return rect
            last = rect if visible else None
            if time.monotonic() >= deadline:
                return rect
            await asyncio.sleep(ACTIONABLE_POLL_S)

    async def _click_element(self, pid: int | str, selector: str, kind: str) -> None:
        # Playwright's click, as cua-bench's "Playwright-like" API says: an element
        # outside the window's viewport is scrolled into view first, and the click
        # waits until the element is visible and stable.
        await self._gui_task("execute_javascript",
                             {"pid": pid, "javascript": SCROLL_INTO_VIEW_JS % json.dumps(selector)})
        rect = await self._actionable_rect(pid, selector)
        if not rect:
            raise RuntimeError(f"Element not found for selector: {selector}")
        x, y = int(rect["x"] + rect["width"] / 2), int(rect["y"] + rect["height"] / 2)
        await self.execute_action({"type": kind, "x": x, "y": y})

    async def click_element(self, pid: int | str, selector: str) -> None:
        await self._click_element(pid, selector, "ClickAction")

    async def right_click_element(self, pid: int | str, selector: str) -> None:
        await self._click_element(pid, selector, "RightClickAction")

    async def execute_action(self, action: Any) -> None:
        w, h = self._gui_size()
        args = action_to_tool_args(action, w, h)
        if args is not None:
            await self._gui_action(args)

    async def get_snapshot(self) -> Any:
        return await self._gui_task("get_snapshot", {})

    async def close_all_windows(self) -> None:
        await self._gui_task("close_all_windows", {})


class CommandFailed(RuntimeError):
    """``run_command(..., check=True)`` saw a non-zero exit or a timeout. A
    ``RuntimeError``, as cua-bench raises, with its message shape."""


class CommandResult(dict):
    """cua-bench's result shape (``success``, ``stdout``, ``stderr``, ``return_code``)
    with the real exit code, plus the names tasks fall back to (``returncode``,
    ``exit_code``, ``output``) and ``timed_out``."""


def _result(exit_code: int, stdout: str, stderr: str, timed_out: bool) -> CommandResult:
    return CommandResult(
        success=exit_code == 0 and not timed_out,
        stdout=stdout,
        stderr=stderr,
        return_code=exit_code,
        returncode=exit_code,
        exit_code=exit_code,
        output=stdout,
        timed_out=timed_out,
    )


def _check(command: str, res: CommandResult, check: bool | None) -> CommandResult:
    # Raise only when the task asked for it explicitly: cua-bench 0.2.7's default
    # check=True never fired (it read a field its computer never set, so every
    # exit code was 0), and ALE's graders were written and scored that way.
    if check is True and not res["success"]:
        raise CommandFailed(
            f"Command failed with return code {res['return_code']}"
            + (" (timed out)" if res["timed_out"] else "")
            + f".\nCommand: {command}\nStdout: {res['stdout'][-2000:]}\nStderr: {res['stderr'][-2000:]}"
        )
    return res


def missing(path: str) -> FileNotFoundError:
    """The error a read of a missing file raises (``[Errno 2] ...``, as upstream's text)."""
    return FileNotFoundError(2, "No such file or directory", path)


class Interface:
    """``session.interface``: the computer-interface calls ALE tasks make
    (``create_dir`` in 22 Linux graders, ``delete_dir``), over the session's own
    file and command calls, so routes and the sandbox apply alike."""

    def __init__(self, session: Any):
        self._s = session

    async def create_dir(self, path: str) -> None:
        await self._s.make_dir(path)

    async def delete_dir(self, path: str) -> None:
        await self._s.remove_tree(path)

    async def delete_file(self, path: str) -> None:
        await self._s.remove_file(path)

    async def file_exists(self, path: str) -> bool:
        return bool(await self._s.file_exists(path))

    async def directory_exists(self, path: str) -> bool:
        return bool(await self._s.directory_exists(path))

    async def list_dir(self, path: str) -> list[str]:
        return list(await self._s.list_dir(path))

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return str(await self._s.read_file(path, encoding))

    async def write_text(self, path: str, content: str, encoding: str = "utf-8") -> None:
        await self._s.write_bytes(path, content.encode(encoding))

    async def read_bytes(self, path: str) -> bytes:
        return bytes(await self._s.read_bytes(path))

    async def write_bytes(self, path: str, content: bytes) -> None:
        await self._s.write_bytes(path, content)

    async def run_command(self, command: str, **kw: Any) -> CommandResult:
        kw.setdefault("check", False)
        return await self._s.run_command(command, **kw)


class ContainerSession(GuiMethods):
    """Task-facing session whose every call runs inside a container (GUI calls
    through the tool box's ``computer``, recorded like the agent's)."""

    def __init__(self, tools: ToolBox, *, default_timeout: float = 600.0):
        self.tools = tools
        self.default_timeout = default_timeout
        self.interface = Interface(self)
        self._bash: bool | None = None  # whether the container has bash (looked up once)

    async def _has_bash(self) -> bool:
        if self._bash is None:
            try:
                r = await self.tools.run(["sh", "-c", "command -v bash"], timeout=30)
                self._bash = r.ok
            except SandboxError:
                return False
        return self._bash

    async def run_command(self, command: str, *, check: bool | None = None, timeout: float | None = None,
                          **_: Any) -> CommandResult:
        # ALE's driver runs a task's command with bash (`bash cmd.sh`): `[[ ]]`, brace
        # expansion and `echo` behave as there; plain `sh` where an image has no bash.
        run = f"exec bash -c {shlex.quote(command)}" if await self._has_bash() else command
        out = await self.tools.call("shell", {"command": run, "timeout": timeout or self.default_timeout})
        if out.error and out.exit_code is None:
            raise CommandFailed(out.error)
        marker = TRUNCATION_MARKER.format(limit=self.tools.output_limit)
        stdout, stderr = out.stdout.removesuffix(marker), out.stderr.removesuffix(marker)
        res = _result(out.exit_code if out.exit_code is not None else -1, stdout, stderr, out.timed_out)
        # Task code parses what a command printed: a cut output is said so, never
        # spliced with a marker.
        res["truncated"] = out.truncated
        return _check(command, res, check)

    async def read_bytes(self, path: str) -> bytes:
        try:
            return await self.tools.read_bytes(path)
        except ToolRefused as e:
            if "not a regular file" in str(e):
                raise missing(path) from e
            raise PermissionError(str(e)) from e

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(path)).decode(encoding, errors="replace")

    async def write_bytes(self, path: str, content: bytes) -> None:
        out = await self.tools.call("write_file", {"path": path, "content": content})
        if not out.ok:
            raise PermissionError(out.error or f"cannot write {path}")

    async def write_file(self, path: str, content: str | bytes) -> None:
        await self.write_bytes(path, content.encode() if isinstance(content, str) else content)

    async def file_exists(self, path: str) -> bool:
        return await self.tools.exists(path, "f")

    async def directory_exists(self, path: str) -> bool:
        return await self.tools.exists(path, "d")

    async def list_dir(self, path: str) -> list[str]:
        out = await self.tools.call("list_dir", {"path": path})
        if not out.ok:
            raise FileNotFoundError(2, "No such file or directory", path)
        return [line for line in out.output.splitlines() if line and not line.startswith("[... output")]

    async def _sh(self, script: str, path: str, what: str) -> None:
        r = await self.tools.run(["sh", "-c", script, what, path], workdir=self.tools.workdir, timeout=120)
        if r.exit_code != 0:
            raise PermissionError(r.stderr.decode(errors="replace").strip() or f"cannot {what} {path}")

    async def make_dir(self, path: str) -> None:
        await self._sh('mkdir -p -- "$1"', path, "create_dir")

    async def remove_tree(self, path: str) -> None:
        await self._sh('rm -rf -- "$1"', path, "delete_dir")

    async def remove_file(self, path: str) -> None:
        await self._sh('rm -f -- "$1"', path, "delete_file")

    def _gui_size(self) -> tuple[int, int]:
        c = self.tools.computer
        return (c.desktop.width, c.desktop.height) if c is not None else (1024, 768)

    async def _gui_action(self, args: dict[str, Any]) -> Any:
        if self.tools.computer is None:
            raise NotImplementedError("this sandbox has no display: GUI calls are not available")
        out = await self.tools.call("computer", args)
        if not out.ok:
            raise RuntimeError(out.error or "the computer action failed")
        return out.image if out.image is not None else out.output

    async def _gui_task(self, op: str, args: dict[str, Any]) -> Any:
        try:
            return await self.tools.task_gui(op, args)
        except ComputerError as e:
            raise RuntimeError(str(e)) from e


@dataclass(frozen=True)
class Route:
    """Container path prefix `target` is served from host folder `host`; `ready`,
    if given, is called before each use (e.g. to make `host` on first use)."""

    target: str
    host: Path
    writable: bool
    ready: Callable[[], object] | None = None


class RoutedSession(GuiMethods):
    """File calls under routed paths hit host folders; the rest goes to a container;
    GUI calls go to ``gui`` (the candidate's still-sealed desktop, in grading), if any."""

    def __init__(
        self, routes: list[Route], container: Callable[[], Awaitable[ContainerSession]], *,
        gui: GuiMethods | None = None
    ):
        self.gui = gui
        # Longest prefix first, so /input/sub routes win over /input.
        self.routes = sorted(routes, key=lambda r: len(r.target), reverse=True)
        self._container_factory = container
        self._container: ContainerSession | None = None
        self.interface = Interface(self)

    async def _c(self) -> ContainerSession:
        if self._container is None:
            self._container = await self._container_factory()
        return self._container

    def _route(self, path: str) -> tuple[Route, Path] | None:
        norm = posixpath.normpath(path)
        for r in self.routes:
            if norm == r.target or norm.startswith(r.target.rstrip("/") + "/"):
                if r.ready is not None:
                    r.ready()
                rel = posixpath.relpath(norm, r.target)
                host = (r.host / rel) if rel != "." else r.host
                # Never leave the routed folder, even through a symlink.
                real = Path(os.path.realpath(host))
                root = Path(os.path.realpath(r.host))
                if real != root and root not in real.parents:
                    raise PermissionError(f"{path} resolves outside {r.target}")
                return r, host
        return None

    async def run_command(self, command: str, *, check: bool | None = None, timeout: float | None = None,
                          **kw: Any) -> CommandResult:
        return await (await self._c()).run_command(command, timeout=timeout, check=check, **kw)

    async def read_bytes(self, path: str) -> bytes:
        hit = self._route(path)
        if hit is None:
            return await (await self._c()).read_bytes(path)
        _, host = hit
        if host.is_symlink() or not host.is_file():
            raise missing(path)
        return host.read_bytes()

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(path)).decode(encoding, errors="replace")

    async def write_bytes(self, path: str, content: bytes) -> None:
        hit = self._route(path)
        if hit is None:
            await (await self._c()).write_bytes(path, content)
            return
        route, host = hit
        if not route.writable:
            raise PermissionError(f"{path} is read-only here ({route.target} is not writable in this phase)")
        host.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        host.write_bytes(content)
        os.chmod(host, 0o644)

    async def write_file(self, path: str, content: str | bytes) -> None:
        await self.write_bytes(path, content.encode() if isinstance(content, str) else content)

    async def file_exists(self, path: str) -> bool:
        hit = self._route(path)
        if hit is None:
            return await (await self._c()).file_exists(path)
        return hit[1].is_file() and not hit[1].is_symlink()

    async def directory_exists(self, path: str) -> bool:
        hit = self._route(path)
        if hit is None:
            return await (await self._c()).directory_exists(path)
        return hit[1].is_dir() and not hit[1].is_symlink()

    async def list_dir(self, path: str) -> list[str]:
        hit = self._route(path)
        if hit is None:
            return await (await self._c()).list_dir(path)
        if hit[1].is_symlink() or not hit[1].is_dir():
            raise FileNotFoundError(2, "No such file or directory", path)
        return sorted(os.listdir(hit[1]))

    def _writable(self, path: str) -> Path | None:
        """The host path of a routed ``path`` (PermissionError on a read-only route),
        or None when the path is the container's."""
        hit = self._route(path)
        if hit is None:
            return None
        route, host = hit
        if not route.writable:
            raise PermissionError(f"{path} is read-only here ({route.target} is not writable in this phase)")
        return host

    async def make_dir(self, path: str) -> None:
        host = self._writable(path)
        if host is None:
            await (await self._c()).make_dir(path)
        else:
            host.mkdir(parents=True, exist_ok=True, mode=0o755)

    async def remove_tree(self, path: str) -> None:
        host = self._writable(path)
        if host is None:
            await (await self._c()).remove_tree(path)
        elif host.is_dir() and not host.is_symlink():
            shutil.rmtree(host)

    async def remove_file(self, path: str) -> None:
        host = self._writable(path)
        if host is None:
            await (await self._c()).remove_file(path)
        elif host.is_file() or host.is_symlink():
            host.unlink()

    def _gui_size(self) -> tuple[int, int]:
        return self.gui._gui_size() if self.gui is not None else (1024, 768)

    async def _gui_action(self, args: dict[str, Any]) -> Any:
        if self.gui is None:
            raise NotImplementedError("this sandbox has no display: GUI calls are not available")
        return await self.gui._gui_action(args)

    async def _gui_task(self, op: str, args: dict[str, Any]) -> Any:
        if self.gui is None:
            raise NotImplementedError("this sandbox has no display: " + op + "() is not available")
        return await self.gui._gui_task(op, args)
