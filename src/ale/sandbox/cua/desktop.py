"""The ``computer`` tool over a cua sandbox's computer-server: the screen, the mouse
and the keyboard through the protocol (``Desktop.request``'s operations, mapped to
computer-server's commands), at the screen's own size (no scaling).

Task-only desktop calls (``launch_window``, ``execute_javascript``, element
rectangles, snapshots) are ale's desktop helper's, not computer-server's: they are
refused with a ``DesktopError`` that says so.
"""

from __future__ import annotations

import time
from typing import Any

from ale.sandbox.cua.client import CuaClient, CuaError
from ale.sandbox.desktop import DesktopError

# xdotool-style key names (what agents send) -> pynput's Key names (what the server takes).
_KEYS = {
    "return": "enter", "kp_enter": "enter", "escape": "esc", "control": "ctrl", "control_l": "ctrl_l",
    "control_r": "ctrl_r", "super": "cmd", "super_l": "cmd", "meta": "cmd", "win": "cmd", "prior": "page_up",
    "next": "page_down", "pageup": "page_up", "pagedown": "page_down", "bksp": "backspace", "del": "delete",
    "ins": "insert", "alt_l": "alt_l", "shift_l": "shift_l", "caps_lock": "caps_lock", "arrowup": "up",
    "arrowdown": "down", "arrowleft": "left", "arrowright": "right",
}


def key_name(key: str) -> str:
    """A key as computer-server's ``press_key`` / ``hotkey`` take it."""
    k = key.strip()
    if len(k) == 1:
        return k
    return _KEYS.get(k.lower(), k.lower())


class CuaDesktop:
    """``Desktop``'s interface (``width``, ``height``, ``request``) over a cua sandbox."""

    def __init__(self, sandbox: Any, width: int, height: int):
        self.sandbox = sandbox
        self.width, self.height = width, height

    @classmethod
    async def of(cls, sandbox: Any) -> CuaDesktop | None:
        """The sandbox's screen, or None when its server has none."""
        try:
            w, h = await (await sandbox.protocol()).screen_size()
        except CuaError:
            return None
        return cls(sandbox, w, h)

    async def request(self, op: str, timeout: float = 120, **a: Any) -> tuple[dict[str, Any], bytes]:
        try:
            return await self._request(await self.sandbox.protocol(), op, a)
        except CuaError as e:
            raise DesktopError(f"desktop {op}: {e}") from e

    async def _request(self, c: CuaClient, op: str, a: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        xy = (a.get("x"), a.get("y"))
        if op == "screenshot":
            t0 = time.perf_counter()
            png = await c.screenshot()
            return {"ok": True, "capture_s": round(time.perf_counter() - t0, 4), "bytes": len(png)}, png
        if op == "cursor_position":
            x, y = await c.cursor_position()
            return {"ok": True, "x": x, "y": y}, b""
        if op == "click":
            button, clicks = a.get("button", "left"), int(a.get("clicks", 1))
            if button == "left" and clicks == 2:
                await c.double_click(*xy)
            elif button == "right" and clicks == 1:
                await c.right_click(*xy)
            elif button == "left":
                for _ in range(clicks):
                    await c.left_click(*xy)
            else:
                for i in range(clicks):
                    await c.mouse_down(*(xy if i == 0 else (None, None)), button=button)
                    await c.mouse_up(button=button)
            return {"ok": True}, b""
        if op == "move":
            await c.move_cursor(int(a["x"]), int(a["y"]))
            return {"ok": True}, b""
        if op in ("mouse_down", "mouse_up"):
            await (c.mouse_down if op == "mouse_down" else c.mouse_up)(*xy, button=a.get("button", "left"))
            return {"ok": True}, b""
        if op == "drag":
            await c.move_cursor(int(a["from_x"]), int(a["from_y"]))
            await c.drag_to(int(a["to_x"]), int(a["to_y"]), duration=float(a.get("duration", 0.3)))
            return {"ok": True}, b""
        if op == "scroll":
            if xy[0] is not None and xy[1] is not None:
                await c.move_cursor(int(xy[0]), int(xy[1]))
            await c.scroll_direction(str(a.get("direction", "down")), int(a.get("clicks", 1)))
            return {"ok": True}, b""
        if op == "type":
            await c.type_text(str(a["text"]))
            return {"ok": True}, b""
        if op == "key":
            for combo in str(a["keys"]).split():
                keys = [key_name(k) for k in combo.split("+") if k]
                if len(keys) == 1:
                    await c.press_key(keys[0])
                elif keys:
                    await c.hotkey(keys)
            return {"ok": True}, b""
        raise DesktopError(f"desktop {op}: not available through computer-server (ale's desktop image serves it)")
