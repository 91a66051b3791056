"""The ``computer`` tool: what an agent may do to the desktop, and nothing more.

Actions (``{"action": ..., ...}``; coordinates as ``coordinate: [x, y]`` or ``x``/``y``):

==================  ==============================================================
``screenshot``      a PNG of the whole screen at the tool's resolution
``left_click`` ``right_click`` ``middle_click`` ``double_click`` ``triple_click``
                    at ``coordinate`` (or where the pointer is)
``mouse_move``      to ``coordinate``
``left_click_drag`` from ``start_coordinate`` to ``coordinate`` (``drag`` too)
``left_mouse_down`` ``left_mouse_up``   press or release the left button
``scroll``          ``scroll_direction`` (up/down/left/right), ``scroll_amount`` clicks
``type``            ``text`` (at most 10 000 characters)
``key``             ``text``: a key or a combination (``Return``, ``ctrl+a``), several
                    separated by spaces
``wait``            ``duration`` seconds (at most 30)
``cursor_position`` where the pointer is
==================  ==============================================================

The agent sees a fixed resolution (``width`` x ``height``, default 1024x768);
when the desktop's own differs, coordinates are scaled to the screen and
screenshots and the cursor position back to the tool's. ``screen: true`` marks
coordinates already in screen pixels (task code's ``execute_action``).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ale.sandbox.desktop import Desktop, DesktopError

if TYPE_CHECKING:
    from ale.sandbox.cua.desktop import CuaDesktop

CLICKS = {
    "left_click": ("left", 1), "right_click": ("right", 1), "middle_click": ("middle", 1),
    "double_click": ("left", 2), "triple_click": ("left", 3),
}
ACTIONS = (
    "screenshot", *CLICKS, "mouse_move", "left_click_drag", "drag", "left_mouse_down", "left_mouse_up",
    "scroll", "type", "key", "wait", "cursor_position",
)
TASK_OPS = ("launch_window", "execute_javascript", "get_element_rect", "get_snapshot", "close_all_windows")
MAX_WAIT_S = 30.0


class ComputerError(Exception):
    """An action the tool refuses (unknown, bad arguments) or the desktop failed."""


@dataclass
class ComputerOutput:
    text: str
    image: bytes | None = None
    info: dict[str, Any] = field(default_factory=dict)


def png_size(png: bytes) -> tuple[int, int]:
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ComputerError("the desktop sent something that is not a PNG")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


class Computer:
    """The tool over one desktop at a fixed resolution for the agent."""

    def __init__(self, desktop: Desktop | CuaDesktop, *, width: int | None = None, height: int | None = None):
        self.desktop = desktop
        self.width = int(width or desktop.width)
        self.height = int(height or desktop.height)
        if not (16 <= self.width <= 4096 and 16 <= self.height <= 4096):
            raise ValueError(f"bad computer tool resolution {self.width}x{self.height}")

    @property
    def scaled(self) -> bool:
        return (self.width, self.height) != (self.desktop.width, self.desktop.height)

    # -- coordinates ------------------------------------------------------------
    def _point(self, args: dict[str, Any], key: str = "coordinate", *, required: bool = True) -> tuple[int, int] | None:
        v = args.get(key)
        if v is None and key == "coordinate" and "x" in args and "y" in args:
            v = [args["x"], args["y"]]
        if v is None:
            if required:
                raise ComputerError(f"{args.get('action')}: needs {key} [x, y]")
            return None
        try:
            x, y = float(v[0]), float(v[1])
        except (TypeError, ValueError, IndexError, KeyError):
            raise ComputerError(f"{key} must be [x, y] numbers, got {v!r}") from None
        screen = bool(args.get("screen"))
        w, h = (self.desktop.width, self.desktop.height) if screen else (self.width, self.height)
        if not (0 <= x < w and 0 <= y < h):
            raise ComputerError(f"{key} {[x, y]} is outside the {w}x{h} screen")
        if not screen:
            x, y = x * self.desktop.width / self.width, y * self.desktop.height / self.height
        return int(x), int(y)

    def _back(self, x: float, y: float) -> tuple[int, int]:
        return round(x * self.width / self.desktop.width), round(y * self.height / self.desktop.height)

    async def _req(self, op: str, **kw: Any) -> tuple[dict[str, Any], bytes]:
        try:
            return await self.desktop.request(op, **kw)
        except DesktopError as e:
            raise ComputerError(str(e)) from e

    # -- the agent's actions -------------------------------------------------------
    async def act(self, args: dict[str, Any]) -> ComputerOutput:
        action = str(args.get("action", ""))
        if action not in ACTIONS:
            raise ComputerError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
        info: dict[str, Any] = {"action": action}
        if action == "screenshot":
            size = [self.width, self.height] if self.scaled else None
            head, png = await self._req("screenshot", **({"size": size} if size else {}))
            w, h = png_size(png)
            info.update(width=w, height=h, bytes=len(png), sha256=hashlib.sha256(png).hexdigest(),
                        capture_s=head.get("capture_s"), helper_s=head.get("seconds"))
            return ComputerOutput(f"screenshot {w}x{h}", png, info)
        if action == "cursor_position":
            head, _ = await self._req("cursor_position")
            x, y = self._back(head["x"], head["y"])
            return ComputerOutput(f"X={x},Y={y}", None, {**info, "x": x, "y": y})
        if action == "wait":
            try:
                secs = float(args.get("duration", args.get("seconds", 1.0)))
            except (TypeError, ValueError):
                raise ComputerError("wait: duration must be a number of seconds") from None
            secs = max(0.0, min(MAX_WAIT_S, secs))
            await asyncio.sleep(secs)
            return ComputerOutput(f"waited {secs:g}s", None, {**info, "seconds": secs})
        if action in CLICKS:
            button, clicks = CLICKS[action]
            p = self._point(args, required=False)
            kw: dict[str, Any] = {"button": button, "clicks": clicks}
            if p:
                kw.update(x=p[0], y=p[1])
            await self._req("click", **kw)
            return ComputerOutput(f"{action} at {list(p) if p else 'the pointer'}", None, {**info, "screen": p})
        if action == "mouse_move":
            p = self._point(args)
            assert p is not None
            await self._req("move", x=p[0], y=p[1])
            return ComputerOutput(f"moved to {list(p)}", None, {**info, "screen": p})
        if action in ("left_mouse_down", "left_mouse_up"):
            p = self._point(args, required=False)
            kw = {"button": "left", **({"x": p[0], "y": p[1]} if p else {})}
            await self._req("mouse_down" if action == "left_mouse_down" else "mouse_up", **kw)
            return ComputerOutput(action.replace("_", " "), None, {**info, "screen": p})
        if action in ("left_click_drag", "drag"):
            start = self._point(args, "start_coordinate")
            end = self._point(args)
            assert start is not None and end is not None
            await self._req("drag", from_x=start[0], from_y=start[1], to_x=end[0], to_y=end[1],
                            duration=float(args.get("duration", 0.3) or 0.3))
            return ComputerOutput(f"dragged {list(start)} -> {list(end)}", None, {**info, "screen": [start, end]})
        if action == "scroll":
            p = self._point(args, required=False)
            direction = str(args.get("scroll_direction", args.get("direction", "down")))
            amount = args.get("scroll_amount", args.get("amount", 3))
            try:
                clicks = max(1, min(50, int(amount)))
            except (TypeError, ValueError):
                raise ComputerError("scroll: scroll_amount must be a number") from None
            kw = {"direction": direction, "clicks": clicks, **({"x": p[0], "y": p[1]} if p else {})}
            await self._req("scroll", **kw)
            return ComputerOutput(f"scrolled {direction} {clicks}", None, {**info, "screen": p})
        if action == "type":
            text = args.get("text")
            if not isinstance(text, str):
                raise ComputerError("type: needs text")
            await self._req("type", text=text)
            return ComputerOutput(f"typed {len(text)} characters", None, info)
        if action == "key":
            keys = args.get("text", args.get("key", args.get("keys")))
            if isinstance(keys, list):
                keys = "+".join(str(k) for k in keys)
            if not isinstance(keys, str) or not keys.strip():
                raise ComputerError("key: needs text (a key or combination, e.g. 'ctrl+a')")
            await self._req("key", keys=keys)
            return ComputerOutput(f"pressed {keys}", None, info)
        raise ComputerError(f"unknown action {action!r}")  # pragma: no cover

    # -- task code's own GUI calls (never the agent's) -----------------------------
    async def task_call(self, op: str, args: dict[str, Any]) -> Any:
        if op not in TASK_OPS:
            raise ComputerError(f"unknown desktop call {op!r}")
        if op == "launch_window":
            head, _ = await self._req("launch_window", **args)
            return head["pid"]
        if op == "execute_javascript":
            head, _ = await self._req("execute_javascript", pid=args["pid"], javascript=args["javascript"])
            return head.get("value")
        if op == "get_element_rect":
            head, _ = await self._req("element_rect", pid=args["pid"], selector=args["selector"],
                                      space=args.get("space", "window"))
            return head.get("rect")
        if op == "get_snapshot":
            head, _ = await self._req("snapshot", html=bool(args.get("html", True)))
            return {"windows": head.get("windows", [])}
        await self._req("close_all_windows")
        return None
