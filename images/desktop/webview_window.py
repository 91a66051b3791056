#!/usr/bin/env python3
"""One cua-bench window, rendered as cua-bench renders it: a pywebview window on
WebKitGTK (cua-bench's ``bench_ui.child``: ``webview.create_window(title, url,
width, height, x, y, confirm_close=False, text_select=True,
background_color="#FFFFFF")``, no debug). Runs as the desktop user (1001),
started by ``desktopd.py``, one process per window (its pid is the window's).

Unlike ``bench_ui``, no HTTP server: the page is a file in the desktop user's
0700 folder, and the control channel is this process's stdin/stdout, pipes
only ``desktopd.py`` holds (one JSON request a line in, one JSON answer a line
out). WebKit's inspector is off (no ``enable-developer-extras``, no
``WEBKIT_INSPECTOR_*SERVER``), its context menu disabled (pywebview without
debug), and its processes talk over socketpairs, never a named socket.

    python3 -I webview_window.py          # first line on stdin: the window's config

Requests: ``{"op": "ready", "js": ...}`` (loaded, layout settled, mapped, framed
and placed by the window manager, painted), ``eval`` (``js``: evaluated as a global
script, its completion value awaited when it is a promise, returned as JSON),
``rect`` (``selector``, ``space``), ``geometry`` (``html``: with the outerHTML),
``close``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

# window.screenX/screenY (and screenLeft/screenTop) report where the page's (0, 0)
# is on the screen. WebKitGTK reports the window manager's frame, a title bar
# above the page (and outerHeight without it); cua-bench's tasks add screenX/Y to
# getBoundingClientRect() to find what to click, as bench_ui's own screen rects do.
# Run at every document start; the origin comes from GDK, and again on each move.
SCREEN_JS = """(() => { for (const [k, i] of [['screenX', 0], ['screenLeft', 0], ['screenY', 1], ['screenTop', 1]]) {
  const d = Object.getOwnPropertyDescriptor(window, k) || Object.getOwnPropertyDescriptor(Object.getPrototypeOf(window), k);
  const native = d && d.get;
  try { Object.defineProperty(window, k, {configurable: true, enumerable: true, set(v) {},
    get() { const o = window.__aleScreenOrigin; return o ? o[i] : (native ? native.call(window) : 0); }}); } catch (e) {}
} })();"""  # noqa: E501
# HTML5 drag and drop of an element whose dragstart sets no data (cua-bench's
# drag-drop page: ``draggable="true"``, a ``dragstart`` that only remembers the
# element): WebKitGTK starts a GTK drag with an empty target list, and its GTK3
# drop target (the same web view) never answers the first XDND position of a drag
# that offers no type, so GTK sends no further one and the release ends it with
# GTK_DRAG_RESULT_NO_TARGET: no dragover, no drop (any input; Chromium drags it).
# After the page's own listeners, a drag that still carries nothing gets one empty
# item of a private type (carried as WebKit's custom pasteboard data, the target
# it asks for); ``types`` hides it, so the page sees what Chromium shows.
DND_JS = """(() => { const T = 'application/x-ale-drag';
  const fill = e => { const d = e.dataTransfer; try { if (d && d.types.length === 0) d.setData(T, ''); } catch (x) {} };
  addEventListener('dragstart', e => { e.target.addEventListener && e.target.addEventListener('dragstart', fill, {once: true}); }, true);
  addEventListener('dragstart', fill);
  const p = window.DataTransfer && DataTransfer.prototype, d = p && Object.getOwnPropertyDescriptor(p, 'types');
  if (d && d.get) { const get = d.get; Object.defineProperty(p, 'types', {configurable: true, enumerable: true,
    get() { const t = get.call(this); return t.includes(T) ? Object.freeze(Array.from(t).filter(x => x !== T)) : t; }}); }
})();"""  # noqa: E501
RECT_JS = """const e = document.querySelector(selector); if (!e) return null;
const r = e.getBoundingClientRect(); return {x: r.left, y: r.top, width: r.width, height: r.height};"""
GEOM_JS = """return {iw: window.innerWidth, ih: window.innerHeight, title: document.title, url: location.href,
  focused: document.hasFocus(), html: withHtml ? document.documentElement.outerHTML : null};"""


# The answers' pipe, kept apart from what GTK, WebKit or pywebview may print.
CTL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)


def out(msg: dict) -> None:
    CTL.write(json.dumps(msg) + "\n")
    CTL.flush()


def main() -> None:
    cfg = json.loads(sys.stdin.readline())
    import webview  # python3-webview (pywebview 3.3.5), its GTK backend

    url = str(cfg["url"])
    if url.startswith("file://"):  # pywebview 3.3.5 loads a file:// URL's folder; a path, the file
        from urllib.parse import unquote, urlparse

        url = unquote(urlparse(url).path)
    if url.startswith("/") and under_gvisor():
        load_files_as_html(url)
    window = webview.create_window(
        str(cfg.get("title") or "Window"), url=url, width=int(cfg.get("width", 600)),
        height=int(cfg.get("height", 400)), x=cfg.get("x"), y=cfg.get("y"), confirm_close=False,
        text_select=True, background_color="#FFFFFF")
    webview.start(control, (window,), gui="gtk", debug=False, http_server=False)
    os._exit(0)


GVISOR_VERSION = "#1 SMP Sun Jan 10 15:06:54 PST 2016"  # gVisor's constant /proc/version


def under_gvisor() -> bool:
    try:
        with open("/proc/version") as f:
            return GVISOR_VERSION in f.read()
    except OSError:
        return False


def load_files_as_html(path: str) -> None:
    """Under gVisor WebKitGTK refuses a ``file://`` page as the main frame ("Frame load
    interrupted": the view stays on about:blank) but loads the same document given as
    HTML with that ``file://`` URL as its base (its ``file://`` subresources too): the
    window's page is loaded that way there (runc keeps ``load_uri``)."""
    from urllib.parse import unquote, urlparse

    from webview.platforms import gtk as wgtk

    with open(path, encoding="utf-8", errors="replace") as f:
        content = f.read()
    view = wgtk.webkit.WebView
    load_uri = view.load_uri

    def load(self: Any, uri: str) -> None:
        if uri.startswith("file://") and unquote(urlparse(uri).path) == path:
            self.load_html(content, "file://" + path)
        else:
            load_uri(self, uri)

    view.load_uri = load


def on_main(fn: Any, timeout: float = 30) -> Any:
    """Run ``fn`` on GTK's main thread; its value (or its exception, raised here)."""
    from gi.repository import GLib

    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> bool:
        try:
            box["v"] = fn()
        except BaseException as e:  # carried to the caller
            box["e"] = e
        done.set()
        return False

    GLib.idle_add(run)
    if not done.wait(timeout):
        raise TimeoutError("the window's main loop did not answer")
    if "e" in box:
        raise box["e"]
    return box.get("v")


class Host:
    def __init__(self, window: Any):
        from webview.platforms import gtk as wgtk

        self.window = window
        deadline = time.monotonic() + 60
        while window.uid not in wgtk.BrowserView.instances:
            if time.monotonic() > deadline:
                raise RuntimeError("pywebview made no window")
            time.sleep(0.01)
        self.view = wgtk.BrowserView.instances[window.uid]
        self.origin_sent: tuple[int, int] | None = None
        on_main(self._install)

    def _install(self) -> None:
        """(main thread) The screen-origin script for every page, and the toplevel's
        moves sent to the page."""
        from gi.repository import GLib, WebKit2

        manager = self.view.webview.get_user_content_manager()
        manager.add_script(WebKit2.UserScript.new(
            SCREEN_JS, WebKit2.UserContentInjectedFrames.TOP_FRAME, WebKit2.UserScriptInjectionTime.START, None, None))
        manager.add_script(WebKit2.UserScript.new(
            DND_JS, WebKit2.UserContentInjectedFrames.ALL_FRAMES, WebKit2.UserScriptInjectionTime.START, None, None))

        def moved(*_: Any) -> bool:
            GLib.idle_add(self._send_origin)
            return False

        self.view.window.connect("configure-event", moved)
        self.view.webview.connect("load-changed", moved)

    def _send_origin(self) -> bool:
        """(main thread) Tell the page where its (0, 0) is on the screen."""
        o = self._read_origin()
        if o.get("mapped"):
            xy = (o["x"], o["y"])
            self.origin_sent = xy
            js = f"window.__aleScreenOrigin = [{xy[0]}, {xy[1]}];"
            if hasattr(self.view.webview, "evaluate_javascript"):
                self.view.webview.evaluate_javascript(js, -1, None, None, None, None, None)
            else:  # pragma: no cover - WebKitGTK before 2.40
                self.view.webview.run_javascript(js, None, None, None)
        return False

    def call(self, body: str, args: dict[str, Any], timeout: float = 30) -> Any:
        """``body`` as an async function of ``args`` in the page (WebKit's
        call_async_javascript_function: promises awaited), its value as JSON."""
        from gi.repository import GLib

        box: dict[str, Any] = {}
        done = threading.Event()
        variant = GLib.Variant("a{sv}", {k: GLib.Variant("s", json.dumps(v)) for k, v in args.items()})
        # The arguments arrive as JSON strings: parsed in the page, any JSON value.
        prologue = "".join(f"{k} = JSON.parse({k});\n" for k in args)

        def finish(view: Any, result: Any, _data: Any = None) -> None:
            try:
                value = view.call_async_javascript_function_finish(result)
                text = value.to_json(0) if value is not None and not value.is_undefined() else None
                box["v"] = None if text is None else json.loads(text)
            except Exception as e:
                box["e"] = e
            done.set()

        def start() -> bool:
            src = prologue + body
            self.view.webview.call_async_javascript_function(src, len(src.encode()), variant, None, None, None,
                                                             finish, None)
            return False

        GLib.idle_add(start)
        if not done.wait(timeout):
            raise TimeoutError("the page did not answer in time")
        if "e" in box:
            e = box["e"]
            msg = getattr(e, "message", None) or str(e)
            raise RuntimeError(f"javascript error: {msg}")
        return box.get("v")

    def _read_origin(self) -> dict[str, Any]:
        """(main thread) Where the page's (0, 0) is on the screen, from GDK (the
        web view's own X window), and whether the window is mapped, framed and focused."""
        wv, top = self.view.webview, self.view.window
        gw = wv.get_window()
        tw = top.get_window()
        from gi.repository import Gdk

        # mapped on the X server (GDK saw its MapNotify), not only in GTK's own state
        if gw is None or tw is None or not top.get_mapped() or tw.get_state() & Gdk.WindowState.WITHDRAWN:
            return {"mapped": False}
        _, ox, oy = gw.get_origin()
        if not wv.get_has_window():
            a = wv.get_allocation()
            ox, oy = ox + a.x, oy + a.y
        frame = tw.get_frame_extents()
        return {"mapped": True, "x": ox, "y": oy, "width": wv.get_allocated_width(),
                "height": wv.get_allocated_height(), "active": bool(top.is_active()),
                "framed": frame is not None and (frame.width, frame.height) != (tw.get_width(), tw.get_height()),
                "opacity": wv.get_opacity()}

    def origin(self) -> dict[str, Any]:
        return on_main(self._read_origin)

    def ready(self, settle_js: str, timeout: float = 60) -> dict[str, Any]:
        """Loaded, its layout settled (``settle_js``, desktopd's), then mapped,
        framed and placed by the window manager, shown, and painted."""
        t0 = time.monotonic()
        if not self.window.loaded.wait(timeout):
            raise RuntimeError("the window did not finish loading")
        settled = self.call(settle_js, {}, timeout=timeout)
        href = self.call("return location.href;", {}, timeout=timeout)
        if str(href).startswith("about:"):  # (a load that failed: pywebview's "loaded" fires all the same)
            raise RuntimeError(f"the page did not load (the window shows {href})")
        # The window manager has framed and placed it: the same origin twice, mapped, shown.
        last = None
        while True:
            o = self.origin()
            # (framed: openbox decorates every pywebview window; not waited for past 20 s)
            framed = o.get("framed") or time.monotonic() - t0 > 20
            ok = o.get("mapped") and framed and o.get("opacity", 0) >= 1.0
            if ok and last is not None and (o["x"], o["y"]) == (last["x"], last["y"]):
                break
            last = o if ok else None
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the window was not shown in time ({o})")
            time.sleep(0.05)
        self.call("window.__aleScreenOrigin = origin;"
                  "await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r())));",
                  {"origin": [o["x"], o["y"]]})
        return {**settled, "origin": [o["x"], o["y"]], "active": o.get("active"),
                "ready_s": round(time.monotonic() - t0, 3)}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "ready":
            return self.ready(str(req["js"]), float(req.get("timeout", 60)))
        if op == "eval":
            js = str(req["js"])
            return {"value": self.call("return await (0, eval)(code);", {"code": js},
                                       timeout=float(req.get("timeout", 30)))}
        if op == "rect":
            r = self.call(RECT_JS, {"selector": str(req["selector"])})
            if r is not None and req.get("space", "window") == "screen":
                o = self.origin()
                r["x"], r["y"] = r["x"] + o["x"], r["y"] + o["y"]
            return {"rect": r}
        if op == "geometry":
            g = self.call(GEOM_JS, {"withHtml": bool(req.get("html", True))}, timeout=10)
            o = self.origin()
            return {**g, "x": o.get("x", 0), "y": o.get("y", 0), "active": bool(o.get("active")) or g["focused"]}
        if op == "close":
            on_main(self.view.close_window)
            return {}
        raise ValueError(f"unknown window request {op!r}")


def control(window: Any) -> None:
    try:
        host = Host(window)
    except Exception as e:
        out({"ok": False, "error": f"{type(e).__name__}: {e}"})
        os._exit(1)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            answer = {"ok": True, **host.handle(req)}
        except Exception as e:  # every failure is an answer
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out(answer)
        if req.get("op") == "close":
            break
    os._exit(0)  # the pipe closed: the window goes with it


if __name__ == "__main__":
    main()
