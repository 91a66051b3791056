#!/usr/bin/env python3
"""ale's desktop helper, inside the desktop image. Runs as the desktop user (1001).

    desktopd.py start [--width W --height H]   # Xvfb + openbox + this helper's server
    desktopd.py call < request.json            # one request to the running server

The harness reaches it only by ``docker exec --user 1001:1001``: the server's
socket and the display's socket are in folders only uid 1001 can enter, the X
server has an MIT cookie readable by uid 1001 alone, listens on no TCP port
(``-nolisten tcp``) and no abstract socket (``-nolisten local``). cua-bench's
windows are pywebview windows on WebKitGTK, as cua-bench renders them
(``webview_window.py``, one process per window, driven over its stdin/stdout);
a browser window (``engine: chromium``) is Chromium, driven over
``--remote-debugging-pipe``. Both channels are pipes this server holds, never a
port. Standard library only.

A ``call`` answers with one JSON line, then (screenshots) the PNG's bytes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from typing import Any

HOME = "/tmp/.ale-desktop"
XDIR = "/tmp/.X11-unix"
XAUTH = f"{HOME}/Xauthority"
CTL = f"{HOME}/ctl.sock"
WINDOWS = f"{HOME}/windows"
PROFILES = f"{HOME}/profiles"
LOG = f"{HOME}/desktop.log"
DISPLAY = ":0"
CHROMIUM_FLAGS = [
    "--no-sandbox", "--test-type", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
    "--disable-gpu", "--disable-extensions", "--disable-background-networking", "--disable-sync",
    "--disable-component-update", "--disable-default-apps", "--disable-breakpad", "--password-store=basic",
    "--disable-features=Translate,MediaRouter,DialMediaRouteProvider,OptimizationHints",
    "--remote-debugging-pipe", "--force-device-scale-factor=1", "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--no-pings", "--disable-domain-reliability",
    "--disable-client-side-phishing-detection", "--webrtc-ip-handling-policy=disable_non_proxied_udp",
]
KEYS = {
    "enter": "Return", "return": "Return", "esc": "Escape", "escape": "Escape", "backspace": "BackSpace",
    "tab": "Tab", "space": "space", "delete": "Delete", "del": "Delete", "insert": "Insert", "home": "Home",
    "end": "End", "pageup": "Prior", "page_up": "Prior", "pagedown": "Next", "page_down": "Next",
    "up": "Up", "down": "Down", "left": "Left", "right": "Right", "arrowup": "Up", "arrowdown": "Down",
    "arrowleft": "Left", "arrowright": "Right", "ctrl": "ctrl", "control": "ctrl", "alt": "alt",
    "shift": "shift", "cmd": "super", "command": "super", "meta": "super", "super": "super", "win": "super",
    "option": "alt", "capslock": "Caps_Lock", "minus": "minus", "plus": "plus", "equal": "equal",
}
BUTTONS = {"left": 1, "middle": 2, "right": 3}
WEBVIEW_HOST = "/opt/ale-desktop/webview_window.py"
# WebKitGTK in a sealed container: no session bus (nothing to autolaunch), no
# accessibility bus, no GPU (software rendering into the X window), no GVFS.
# No WEBKIT_INSPECTOR_SERVER / WEBKIT_INSPECTOR_HTTP_SERVER: no inspector port.
WEBKIT_ENV = {
    "NO_AT_BRIDGE": "1", "GTK_A11Y": "none", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/bus",
    "GSETTINGS_BACKEND": "memory", "GDK_BACKEND": "x11", "GIO_USE_VFS": "local", "GIO_USE_VOLUME_MONITOR": "unix",
    "WEBKIT_DISABLE_COMPOSITING_MODE": "1", "WEBKIT_DISABLE_DMABUF_RENDERER": "1", "LIBGL_ALWAYS_SOFTWARE": "1",
}
ENGINES = ("webview", "chromium")
# How long a drag waits, after its first moves, for the page to start an HTML5 drag.
DRAG_START_WAIT_S = 1.5


def env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "DISPLAY": DISPLAY, "XAUTHORITY": XAUTH,
        "LANG": "C.UTF-8", "XDG_CONFIG_HOME": f"{HOME}/.config", "XDG_CACHE_HOME": f"{HOME}/.cache",
        "XDG_RUNTIME_DIR": HOME,
    }


def log(msg: str) -> None:
    with open(LOG, "a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")


# -- screenshots: XGetImage through libX11, PNG by zlib ------------------------------
class _XImage(ctypes.Structure):
    _fields_ = [
        ("width", ctypes.c_int), ("height", ctypes.c_int), ("xoffset", ctypes.c_int), ("format", ctypes.c_int),
        ("data", ctypes.POINTER(ctypes.c_char)), ("byte_order", ctypes.c_int), ("bitmap_unit", ctypes.c_int),
        ("bitmap_bit_order", ctypes.c_int), ("bitmap_pad", ctypes.c_int), ("depth", ctypes.c_int),
        ("bytes_per_line", ctypes.c_int), ("bits_per_pixel", ctypes.c_int),
    ]


class Screen:
    def __init__(self) -> None:
        self.x = ctypes.cdll.LoadLibrary(ctypes.util.find_library("X11") or "libX11.so.6")
        self.x.XOpenDisplay.restype = ctypes.c_void_p
        self.x.XOpenDisplay.argtypes = [ctypes.c_char_p]
        self.x.XDefaultRootWindow.restype = ctypes.c_ulong
        self.x.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
        self.x.XGetImage.restype = ctypes.POINTER(_XImage)
        self.x.XGetImage.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_ulong, ctypes.c_int]
        self.x.XFree.argtypes = [ctypes.c_void_p]
        self.x.XInternAtom.restype = ctypes.c_ulong
        self.x.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        self.x.XGetSelectionOwner.restype = ctypes.c_ulong
        self.x.XGetSelectionOwner.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
        self.x.XQueryPointer.argtypes = [ctypes.c_void_p, ctypes.c_ulong] + [ctypes.c_void_p] * 7
        os.environ["XAUTHORITY"] = XAUTH
        self.dpy = self.x.XOpenDisplay(DISPLAY.encode())
        if not self.dpy:
            raise RuntimeError("cannot open the display")
        self.root = self.x.XDefaultRootWindow(self.dpy)

    def capture(self, width: int, height: int, out: tuple[int, int] | None = None) -> tuple[bytes, float]:
        t0 = time.perf_counter()
        img = self.x.XGetImage(self.dpy, self.root, 0, 0, width, height, 0xFFFFFFFF, 2)  # ZPixmap
        if not img:
            raise RuntimeError("XGetImage failed")
        try:
            im = img.contents
            bpl = im.bytes_per_line
            raw = ctypes.string_at(im.data, bpl * height)
            if im.bits_per_pixel != 32:
                raise RuntimeError(f"unsupported depth {im.bits_per_pixel}")
        finally:
            self.x.XFree(ctypes.cast(img.contents.data, ctypes.c_void_p))
            self.x.XFree(ctypes.cast(img, ctypes.c_void_p))
        png = encode_png(raw, width, height, bpl, out)
        return png, time.perf_counter() - t0

    def selection_owner(self, name: str) -> int:
        """The X window that owns selection ``name`` (0: none)."""
        atom = self.x.XInternAtom(self.dpy, name.encode(), 0)
        return int(self.x.XGetSelectionOwner(self.dpy, atom))

    def pointer(self) -> tuple[int, int]:
        root, child = ctypes.c_ulong(), ctypes.c_ulong()
        rx, ry, wx, wy = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        mask = ctypes.c_uint()
        self.x.XQueryPointer(self.dpy, self.root, ctypes.byref(root), ctypes.byref(child), ctypes.byref(rx),
                             ctypes.byref(ry), ctypes.byref(wx), ctypes.byref(wy), ctypes.byref(mask))
        return rx.value, ry.value


def encode_png(bgrx: bytes, width: int, height: int, bpl: int, out: tuple[int, int] | None = None) -> bytes:
    """PNG (RGB, no alpha) of a 32-bit ZPixmap, optionally resized to ``out``
    (box filter for whole factors, nearest pixel otherwise)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - the image has numpy
        np = None
    if np is not None:
        a = np.frombuffer(bgrx, dtype=np.uint8).reshape(height, bpl)[:, : width * 4].reshape(height, width, 4)
        rgb = a[:, :, 2::-1]
        if out and out != (width, height):
            ow, oh = out
            if width % ow == 0 and height % oh == 0:
                fx, fy = width // ow, height // oh
                rgb = rgb.reshape(oh, fy, ow, fx, 3).mean(axis=(1, 3)).astype(np.uint8)
            else:
                ys = (np.arange(oh) * height // oh).clip(0, height - 1)
                xs = (np.arange(ow) * width // ow).clip(0, width - 1)
                rgb = rgb[ys][:, xs]
            width, height = ow, oh
        rows = np.zeros((height, width * 3 + 1), dtype=np.uint8)
        rows[:, 1:] = np.ascontiguousarray(rgb).reshape(height, width * 3)
        raw = rows.tobytes()
    else:
        if out and out != (width, height):
            raise RuntimeError("resizing needs numpy")
        parts = []
        for y in range(height):
            row = bgrx[y * bpl: y * bpl + width * 4]
            rgbb = bytearray(width * 3)
            rgbb[0::3], rgbb[1::3], rgbb[2::3] = row[2::4], row[1::4], row[0::4]
            parts.append(b"\x00" + bytes(rgbb))
        raw = b"".join(parts)
    body = zlib.compress(raw, 3)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))


# -- Chromium windows over --remote-debugging-pipe ----------------------------------
class Window:
    def __init__(self, n: int, url: str, title: str, x: int | None, y: int | None, width: int, height: int):
        self.n, self.title = n, title
        profile = f"{PROFILES}/{n}"
        os.makedirs(profile, mode=0o700, exist_ok=True)
        cmd_r, self.cmd_w = os.pipe()
        self.resp_r, resp_w = os.pipe()

        def fds() -> None:
            os.dup2(cmd_r, 3)
            os.dup2(resp_w, 4)

        argv = ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--app={url}",
                f"--window-size={width},{height}", f"--class=ale-window-{n}"]
        if x is not None and y is not None:
            argv.append(f"--window-position={x},{y}")
        self.proc = subprocess.Popen(argv, env=env(), preexec_fn=fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
                                     stdout=open(f"{HOME}/chromium-{n}.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115 - the child keeps it
                                     start_new_session=True)
        os.close(cmd_r)
        os.close(resp_w)
        self.pid = self.proc.pid
        self.ids = 0
        self.buf = b""
        self.session: str | None = None

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 15) -> Any:
        self.ids += 1
        msg: dict[str, Any] = {"id": self.ids, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.ids:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"{method}: no answer from the window (pid {self.pid})")
            ready, _, _ = select.select([self.resp_r], [], [], left)
            if ready:
                data = os.read(self.resp_r, 1 << 20)
                if not data:
                    raise RuntimeError(f"{method}: the window closed its control pipe")
                self.buf += data

    def attach(self) -> str:
        if self.session is None:
            deadline = time.monotonic() + 60  # a first start under load is slow
            while True:
                pages = [t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page"]
                if pages:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the window has no page")
                time.sleep(0.05)
            self.session = self.send("Target.attachToTarget",
                                     {"targetId": pages[0]["targetId"], "flatten": True})["sessionId"]
        return self.session

    def evaluate(self, expression: str, timeout: float = 15) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True,
                                             "userGesture": False}, session=self.attach(), timeout=timeout)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            text = (d.get("exception") or {}).get("description") or d.get("text")
            raise RuntimeError(f"javascript error: {text}")
        return (res.get("result") or {}).get("value")

    def wait_loaded(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.evaluate("document.readyState", timeout=5) == "complete":
                    return
            except RuntimeError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the window did not finish loading")

    def ready(self) -> dict:
        self.wait_loaded()
        return self.evaluate(f"(async () => {{ {READY_JS} }})()", timeout=60) or {}

    def rect(self, selector: str, space: str) -> dict | None:
        r = self.evaluate(RECT_JS % json.dumps(selector))
        if r is not None and space == "screen":
            ox, oy = content_origin(r)
            r["x"], r["y"] = r["x"] + ox, r["y"] + oy
        return None if r is None else {k: r[k] for k in ("x", "y", "width", "height")}

    def geometry(self, html: bool) -> dict:
        g = self.evaluate(GEOM_JS, timeout=5)
        body = self.evaluate("document.documentElement.outerHTML", timeout=5) if html else None
        ox, oy = content_origin(g)
        return {"window_type": "webview", "engine": "chromium", "pid": str(self.pid), "url": g["url"], "html": body,
                "title": g["title"] or self.title, "x": int(ox), "y": int(oy), "width": g["iw"], "height": g["ih"],
                "active": bool(g["focused"]), "minimized": False}

    def close(self) -> None:
        with _quiet():
            os.killpg(self.proc.pid, signal.SIGKILL)
        with _quiet():
            self.proc.wait(5)
        for fd in (self.cmd_w, self.resp_r):
            with _quiet():
                os.close(fd)


class WebWindow:
    """A cua-bench window: ``webview_window.py`` (pywebview on WebKitGTK), one
    process per window, requests on its stdin, answers on its stdout."""

    def __init__(self, n: int, url: str, title: str, x: int | None, y: int | None, width: int, height: int):
        self.n, self.title = n, title
        self.proc = subprocess.Popen(
            ["python3", "-I", WEBVIEW_HOST], env={**env(), **WEBKIT_ENV}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=open(f"{HOME}/webview-{n}.log", "ab"),  # noqa: SIM115 - the child keeps it
            start_new_session=True)
        self.pid = self.proc.pid
        self.buf = b""
        self.send_raw({"url": url, "title": title, "x": x, "y": y, "width": width, "height": height})

    def send_raw(self, msg: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, op: str, timeout: float = 35, **args: Any) -> dict:
        assert self.proc.stdout is not None
        try:
            self.send_raw({"op": op, "timeout": timeout - 5, **args})
        except OSError:
            raise RuntimeError(f"{op}: the window is gone (pid {self.pid})") from None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{op}: no answer from the window (pid {self.pid})")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 1 << 20)
                if not data:
                    raise RuntimeError(f"{op}: the window closed its control pipe (pid {self.pid})")
                self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        reply = json.loads(line)
        if not reply.pop("ok", False):
            raise RuntimeError(str(reply.get("error")))
        return reply

    def ready(self) -> dict:
        return self.call("ready", timeout=90, js=READY_JS)

    def evaluate(self, expression: str, timeout: float = 35) -> Any:
        return self.call("eval", timeout=timeout, js=expression).get("value")

    def rect(self, selector: str, space: str) -> dict | None:
        return self.call("rect", selector=selector, space=space).get("rect")

    def geometry(self, html: bool) -> dict:
        g = self.call("geometry", timeout=15, html=html)
        return {"window_type": "webview", "engine": "webview", "pid": str(self.pid), "url": g["url"],
                "html": g.get("html"), "title": g["title"] or self.title, "x": int(g["x"]), "y": int(g["y"]),
                "width": g["iw"], "height": g["ih"], "active": bool(g["active"]), "minimized": False}

    def close(self) -> None:
        with _quiet():
            os.killpg(self.proc.pid, signal.SIGKILL)
        with _quiet():
            self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            with _quiet():
                f.close()  # type: ignore[union-attr]


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], Exception)


RECT_JS = """(() => { const e = document.querySelector(%s); if (!e) return null;
  const r = e.getBoundingClientRect();
  return {x: r.left, y: r.top, width: r.width, height: r.height,
          sx: window.screenX, sy: window.screenY, ow: window.outerWidth, oh: window.outerHeight,
          iw: window.innerWidth, ih: window.innerHeight}; })()"""
GEOM_JS = """(() => ({sx: window.screenX, sy: window.screenY, ow: window.outerWidth, oh: window.outerHeight,
  iw: window.innerWidth, ih: window.innerHeight, title: document.title, url: location.href,
  focused: document.hasFocus()}))()"""
# A window is ready when its layout has settled: loaded, fonts ready, and the same
# geometry (page size, style sheets, element boxes) over three frames in a row
# (Tailwind's browser build styles the page after ``load``). The body of an async function.
READY_JS = """
await new Promise(r => { if (document.readyState === 'complete') r(); else addEventListener('load', () => r(), {once: true}); });
// fonts: ready, or their status loaded (WebKitGTK under gVisor never settles fonts.ready)
if (document.fonts && document.fonts.ready) { const t = performance.now(); await Promise.race([document.fonts.ready,
  (async () => { while (document.fonts.status !== 'loaded' && performance.now() - t < 15000) await new Promise(r => setTimeout(r, 20)); })()]); }
const frame = () => new Promise(r => requestAnimationFrame(() => r()));
const sig = () => { const d = document.documentElement, b = document.body;
  const parts = [d.scrollWidth, d.scrollHeight, document.styleSheets.length, document.querySelectorAll('*').length];
  const els = b ? b.querySelectorAll('*') : [];
  for (let i = 0; i < els.length && i < 400; i++) { const r = els[i].getBoundingClientRect();
    parts.push(Math.round(r.left), Math.round(r.top), Math.round(r.width), Math.round(r.height)); }
  return parts.join(','); };
let last = null, same = 0, n = 0;
const t0 = performance.now();
while (performance.now() - t0 < 15000) {
  await frame(); await new Promise(r => setTimeout(r, 40)); n++;
  const s = sig();
  if (s === last) { if (++same >= 3) break; } else { same = 0; last = s; }
}
await frame(); await frame();
return {settled: same >= 3, checks: n, ms: Math.round(performance.now() - t0)};
"""  # noqa: E501
# cua-bench's template for an HTML fragment (Tailwind's browser build, served locally).
TAILWIND = "/opt/ale-desktop/vendor/tailwindcss-browser-4.3.4.js"
HTML_TEMPLATE = ("<!doctype html>\n<html>\n  <head>\n    <meta charset=\"UTF-8\" />\n"
                 "    <meta name=\"viewport\" content=\"width=device-width, initial-scale=1.0\" />\n"
                 "    <title>{title}</title>\n    <script src=\"tailwind.js\"></script>\n  </head>\n"
                 "  <body>\n{content}\n  </body>\n</html>\n")


def content_origin(g: dict) -> tuple[float, float]:
    border = max(0.0, (g["ow"] - g["iw"]) / 2)
    return g["sx"] + border, g["sy"] + max(0.0, g["oh"] - g["ih"] - border)


# -- the server ------------------------------------------------------------------------
class Desktop:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.screen = Screen()
        self.windows: dict[int, Window | WebWindow] = {}
        self.count = 0

    def xdotool(self, *args: str) -> None:
        r = subprocess.run(["xdotool", *args], env=env(), capture_output=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"xdotool {' '.join(args)}: {r.stderr.decode(errors='replace').strip()}")

    def _to(self, x: str, y: str) -> list[str]:
        """xdotool words that move the pointer to (x, y) and wait until it is there
        (``--sync`` hangs when the pointer is there already: then nothing)."""
        return [] if self.screen.pointer() == (int(x), int(y)) else ["mousemove", "--sync", x, y]

    def _xy(self, req: dict, kx: str = "x", ky: str = "y") -> tuple[str, str]:
        x, y = int(round(float(req[kx]))), int(round(float(req[ky])))
        if not (0 <= x < self.width and 0 <= y < self.height):
            raise ValueError(f"({x}, {y}) is outside the {self.width}x{self.height} screen")
        return str(x), str(y)

    def window(self, pid: Any) -> Window | WebWindow:
        w = self.windows.get(int(pid))
        if w is None or w.proc.poll() is not None:
            raise ValueError(f"no open window with pid {pid}")
        return w

    def handle(self, req: dict) -> tuple[dict, bytes]:
        op = req.get("op")
        t0 = time.perf_counter()
        out: dict[str, Any] = {}
        data = b""
        if op == "ping":
            out = {"width": self.width, "height": self.height}
        elif op == "screenshot":
            size = req.get("size")
            want = (int(size[0]), int(size[1])) if size else None
            if want and not (16 <= want[0] <= 4096 and 16 <= want[1] <= 4096):
                raise ValueError(f"bad screenshot size {size!r}")
            data, secs = self.screen.capture(self.width, self.height, want)
            w, h = want or (self.width, self.height)
            out = {"width": w, "height": h, "capture_s": round(secs, 5)}
        elif op == "cursor_position":
            x, y = self.screen.pointer()
            out = {"x": x, "y": y}
        elif op == "move":
            words = self._to(*self._xy(req))
            if words:
                self.xdotool(*words)
        elif op == "click":
            button = BUTTONS.get(str(req.get("button", "left")))
            if button is None:
                raise ValueError(f"unknown button {req.get('button')!r}")
            clicks = int(req.get("clicks", 1))
            if not 1 <= clicks <= 3:
                raise ValueError("clicks must be 1, 2 or 3")
            args = self._to(*self._xy(req)) if "x" in req else []
            self.xdotool(*args, "click", "--repeat", str(clicks), "--delay", "60", str(button))
        elif op in ("mouse_down", "mouse_up"):
            button = BUTTONS.get(str(req.get("button", "left")), 1)
            args = self._to(*self._xy(req)) if "x" in req else []
            self.xdotool(*args, "mousedown" if op == "mouse_down" else "mouseup", str(button))
        elif op == "drag":
            out = self.drag(*(int(v) for v in (*self._xy(req, "from_x", "from_y"), *self._xy(req, "to_x", "to_y"))),
                            duration=float(req.get("duration", 0.3)))
        elif op == "scroll":
            direction = str(req.get("direction", "down"))
            button = {"up": "4", "down": "5", "left": "6", "right": "7"}.get(direction)
            if button is None:
                raise ValueError(f"unknown scroll direction {direction!r}")
            amount = max(1, min(50, int(req.get("clicks", 3))))
            args = self._to(*self._xy(req)) if "x" in req else []
            self.xdotool(*args, "click", "--repeat", str(amount), "--delay", "20", button)
        elif op == "type":
            text = str(req.get("text", ""))
            if len(text) > 10000:
                raise ValueError("text is longer than 10000 characters")
            if text:
                self.xdotool("type", "--delay", "8", "--", text)
        elif op == "key":
            self.xdotool("key", "--delay", "30", "--", *[key_name(k) for k in str(req["keys"]).split()])
        elif op == "launch_window":
            out = self.launch(req)
        elif op == "execute_javascript":
            out = {"value": self.window(req["pid"]).evaluate(str(req["javascript"]))}
        elif op == "element_rect":
            out = {"rect": self.window(req["pid"]).rect(str(req["selector"]), str(req.get("space", "window")))}
        elif op == "snapshot":
            out = {"windows": self.snapshot(bool(req.get("html", True)))}
        elif op == "close_all_windows":
            for w in list(self.windows.values()):
                w.close()
            self.windows.clear()
        else:
            raise ValueError(f"unknown desktop request {op!r}")
        out["seconds"] = round(time.perf_counter() - t0, 5)
        return out, data

    def drag(self, fx: int, fy: int, tx: int, ty: int, duration: float = 0.3) -> dict:
        """Press at (fx, fy), move to (tx, ty) in small steps, release: paced as a hand
        drags, so that an HTML5 drag starts and drops in either engine on a loaded
        machine. The press, a pause, a few moves past the toolkits' drag thresholds
        (GTK: 8 px), then, when the page starts an HTML5 drag (an XDND drag: its source
        owns ``XdndSelection``), the rest of the way only once it has: WebKit starts
        the GTK drag when its web process has run ``dragstart``, which a loaded
        machine delays past moves (and a release) sent at once. A drag that starts
        none (a slider, a selection) waits at most ``DRAG_START_WAIT_S`` for it."""
        steps = max(4, min(40, int(duration * 40)))
        dist = max(abs(tx - fx), abs(ty - fy))
        before = self.screen.selection_owner("XdndSelection")  # (a drag before this one may have left it)
        self.xdotool(*self._to(str(fx), str(fy)), "mousedown", "1", "sleep", "0.1")
        # the first moves: 12 px along the way (or the whole way when shorter), 3 px each
        lead = min(dist, 12)
        words: list[str] = []
        for i in range(1, 5):
            k = lead * i / 4 / dist if dist else 0
            words += ["mousemove", str(round(fx + (tx - fx) * k)), str(round(fy + (ty - fy) * k)), "sleep", "0.02"]
        self.xdotool(*words)
        t0 = time.monotonic()
        started = False
        while time.monotonic() - t0 < DRAG_START_WAIT_S:
            if self.screen.selection_owner("XdndSelection") not in (0, before):
                started = True
                break
            time.sleep(0.01)
        waited = time.monotonic() - t0
        words = []
        for i in range(1, steps + 1):  # one xdotool: moves with short sleeps between them
            words += ["mousemove", str(fx + (tx - fx) * i // steps), str(fy + (ty - fy) * i // steps), "sleep", "0.02"]
        # over the target: hover (a 1 px move and back) so that the drop target answers
        # the last position before the release
        words += ["sleep", "0.1", "mousemove", str(tx + (1 if tx + 1 < self.width else -1)), str(ty), "sleep", "0.1",
                  "mousemove", str(tx), str(ty), "sleep", "0.15" if started else "0.05"]
        self.xdotool(*words)
        self.xdotool(*self._to(str(tx), str(ty)), "mouseup", "1")
        return {"html5_drag": started, "drag_start_wait_s": round(waited, 3)}

    def launch(self, req: dict) -> dict:
        self.count += 1
        n = self.count
        title = str(req.get("title") or "Window")
        url = req.get("url")
        folder = f"{WINDOWS}/{n}"
        if req.get("html") is not None or req.get("files"):
            os.makedirs(folder, mode=0o700)
            for rel, content in (req.get("files") or {}).items():
                rel = os.path.normpath(str(rel))
                if rel.startswith(("..", "/")):
                    raise ValueError(f"bad file name {rel!r}")
                os.makedirs(os.path.dirname(f"{folder}/{rel}") or folder, mode=0o700, exist_ok=True)
                with open(f"{folder}/{rel}", "w") as f:
                    f.write(content)
            if req.get("html") is not None:
                html = str(req["html"])
                if "<html" not in html.lower():
                    html = HTML_TEMPLATE.replace("{title}", title).replace("{content}", html)
                    shutil.copyfile(TAILWIND, f"{folder}/tailwind.js")
                with open(f"{folder}/index.html", "w") as f:
                    f.write(html)
            url = f"file://{folder}/index.html"
        if not url:
            raise ValueError("launch_window needs url=, html= or folder=")
        engine = str(req.get("engine") or "webview")
        if engine not in ENGINES:
            raise ValueError(f"unknown window engine {engine!r} (one of {', '.join(ENGINES)})")
        x, y = req.get("x"), req.get("y")
        kind = WebWindow if engine == "webview" else Window
        w = kind(n, str(url), title, None if x is None else int(x), None if y is None else int(y),
                 int(req.get("width", 600)), int(req.get("height", 400)))
        self.windows[w.pid] = w
        try:
            # Ready before launch_window returns: loaded, shown where the window
            # manager put it, painted, its layout settled (no first-run race).
            ready = w.ready()
            if engine == "chromium" and title and req.get("html") is None:
                w.evaluate(f"document.title = document.title || {json.dumps(title)}")
        except Exception:
            w.close()
            del self.windows[w.pid]
            raise
        log(f"window {n} ({engine}) pid {w.pid} ready: {json.dumps(ready)}")
        return {"pid": w.pid, "engine": engine, "ready": ready}

    def snapshot(self, html: bool) -> list[dict]:
        wins = []
        for w in self.windows.values():
            if w.proc.poll() is not None:
                continue
            try:
                wins.append(w.geometry(html))
            except RuntimeError:
                continue
        return wins


def key_name(combo: str) -> str:
    parts = [p for p in combo.replace("-", "+").split("+") if p] if combo not in ("+", "-") else [combo]
    out = []
    for p in parts:
        low = p.lower()
        if low in KEYS:
            out.append(KEYS[low])
        elif len(low) > 1 and low[0] == "f" and low[1:].isdigit():
            out.append(low.upper())
        else:
            out.append(p if len(p) > 1 else p.lower() if p.isalpha() and len(parts) > 1 else p)
    return "+".join(out)


def serve(width: int, height: int) -> None:
    desk = Desktop(width, height)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with _quiet():
        os.unlink(CTL)
    srv.bind(CTL)
    os.chmod(CTL, 0o600)
    srv.listen(8)
    me = os.getuid()
    while True:
        conn, _ = srv.accept()
        with conn:
            try:
                pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                if uid != me:
                    raise PermissionError("only the desktop user may use the desktop")
                raw = b""
                while not raw.endswith(b"\n"):
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        break
                    raw += chunk
                head, data = desk.handle(json.loads(raw))
                head["ok"] = True
            except Exception as e:  # every failure is an answer, never the server's end
                head, data = {"ok": False, "error": f"{type(e).__name__}: {e}"}, b""
            head["bytes"] = len(data)
            with _quiet():
                conn.sendall(json.dumps(head).encode() + b"\n" + data)


def start(width: int, height: int) -> dict:
    t0 = time.perf_counter()
    os.umask(0o077)
    for d in (HOME, WINDOWS, PROFILES, XDIR):
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)
    cookie = os.urandom(16).hex()
    subprocess.run(["xauth", "-q", "-f", XAUTH, "add", DISPLAY, "MIT-MAGIC-COOKIE-1", cookie], env=env(), check=True)
    os.chmod(XAUTH, 0o600)
    logf = open(LOG, "ab")  # noqa: SIM115 - held by the desktop processes for their life
    xvfb = subprocess.Popen(
        ["Xvfb", DISPLAY, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp", "-nolisten", "local",
         "-auth", XAUTH, "-dpi", "96", "-noreset"],
        env=env(), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
    deadline = time.monotonic() + 20
    while not os.path.exists(f"{XDIR}/X0"):
        if xvfb.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"Xvfb did not start (exit {xvfb.poll()}); see {LOG}")
        time.sleep(0.02)
    os.chmod(XDIR, 0o700)  # the X server makes it 1777; only the desktop user may enter
    t_x = time.perf_counter() - t0
    wm = subprocess.Popen(["openbox", "--config-file", "/etc/ale-desktop/openbox-rc.xml"], env=env(),
                          stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
    # The window manager has taken the screen over before any window is launched: a
    # window mapped while openbox is still starting (a loaded machine) has its map
    # request swallowed and stays unmapped, unframed, invisible.
    deadline = time.monotonic() + 60
    while True:
        r = subprocess.run(["xprop", "-root", "-notype", "_NET_SUPPORTING_WM_CHECK"], env=env(),
                           capture_output=True, text=True)
        if "window id" in r.stdout:
            break
        if wm.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the window manager did not start (exit {wm.poll()}); see {LOG}")
        time.sleep(0.02)
    t_wm = time.perf_counter() - t0
    child = os.fork()
    if child == 0:  # the server, detached from the exec that started it
        os.setsid()
        fd = os.open(os.devnull, os.O_RDWR)
        for i in (0, 1, 2):
            os.dup2(fd, i)
        try:
            serve(width, height)
        except BaseException as e:
            log(f"server ended: {e!r}")
        os._exit(0)
    deadline = time.monotonic() + 20
    while True:
        try:
            head, _ = request({"op": "ping"})
            if head.get("ok"):
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the desktop helper did not answer; see {LOG}")
        time.sleep(0.02)
    return {"ok": True, "display": DISPLAY, "width": width, "height": height, "xvfb_pid": xvfb.pid,
            "wm_pid": wm.pid, "server_pid": child, "x_ready_s": round(t_x, 4), "wm_ready_s": round(t_wm, 4),
            "seconds": round(time.perf_counter() - t0, 4)}


def request(req: dict, timeout: float = 120) -> tuple[dict, bytes]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(CTL)
    with s:
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(1 << 20)
            if not chunk:
                raise OSError("the desktop helper closed the connection")
            buf += chunk
        line, _, rest = buf.partition(b"\n")
        head = json.loads(line)
        need = int(head.get("bytes", 0))
        while len(rest) < need:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            rest += chunk
        return head, rest


def main() -> None:
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "start":
        args = sys.argv[2:]
        width = int(args[args.index("--width") + 1]) if "--width" in args else 1024
        height = int(args[args.index("--height") + 1]) if "--height" in args else 768
        try:
            out = start(width, height)
        except Exception as e:
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.exit(0 if out.get("ok") else 1)
    if cmd == "call":
        req = json.loads(sys.stdin.buffer.read() or b"{}")
        try:
            head, data = request(req)
        except OSError as e:
            head, data = {"ok": False, "error": f"the desktop is not running ({e})", "bytes": 0}, b""
        sys.stdout.buffer.write(json.dumps(head).encode() + b"\n" + data)
        sys.stdout.flush()
        return
    sys.stderr.write(__doc__ or "")
    sys.exit(2)


if __name__ == "__main__":
    main()
