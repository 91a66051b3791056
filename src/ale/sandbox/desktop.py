"""The desktop inside a sandbox: a second identity, reached only by the harness.

The desktop image (``images/desktop``) runs a virtual display, a window manager,
the task's windows (pywebview on WebKitGTK as cua-bench renders them, Chromium for
``engine="chromium"``) and ale's helper (``/opt/ale-desktop/desktopd.py``) as the
desktop user (``DESKTOP_USER``, uid 1001), never as the candidate (uid 1000).
The harness starts it and sends it every request by its own exec *as the desktop
user* (``docker exec --user``: no capability, no setuid, nothing the candidate
can do); the helper's socket, the X socket and the X cookie are in folders only
uid 1001 can enter, the display listens on no TCP port and no abstract socket,
and every window is driven over a pipe the helper holds, never a port.

A task asks for a desktop with ``desktop: true`` (or ``desktop: {width, height}``)
in its card, or a variant's ``computer`` spec: cua-bench's ``simulated`` provider,
its ``native`` provider with a screen (``setup_config`` states ``width``/``height``
or an ``image``, as cua-bench-basic's tasks do), or ``desktop: true``; the
resolution comes from ``setup_config`` (``width``/``height``), default 1024x768.
Tasks that need none (ALE's shell tasks: ``setup_config`` names only ``os_type``)
keep the tools image.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from ale.defaults import DEFAULT_TOOLS_IMAGE
from ale.sandbox.base import Sandbox, SandboxError

DESKTOP_REPO = "ale-desktop"
# What `ale image build --desktop` tags and desktop tasks run in; ALE_DESKTOP_IMAGE names
# another (read at import: a process's runs use one desktop image).
DEFAULT_DESKTOP_IMAGE = os.environ.get("ALE_DESKTOP_IMAGE") or f"{DESKTOP_REPO}:latest"
DESKTOP_USER = "1001:1001"
HELPER = ["python3", "-I", "/opt/ale-desktop/desktopd.py"]
# The per-call client: socket and json only, no site packages (``desktopd.py call`` answers
# the same, after importing the helper's whole module; images before it have only that).
CLIENT = ["python3", "-I", "-S", "/opt/ale-desktop/desktopctl.py"]
DEFAULT_WIDTH, DEFAULT_HEIGHT = 1024, 768
SCREENSHOT_LIMIT = 32 * 1024 * 1024


class DesktopError(SandboxError):
    """The desktop did not start, or a request to it failed."""


@dataclass(frozen=True)
class DesktopSpec:
    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT

    def to_dict(self) -> dict[str, int]:
        return {"width": self.width, "height": self.height}


def start_image(image: str, provider: str, *, desktop: bool) -> str:
    """The image a run's sandbox starts from (before its software environment): the
    desktop image for a task asking for a desktop that Docker would run in the default
    tools image; the plan's image otherwise (under qemu the guest's own screen serves a
    desktop: the disk is the plan's). The one place this is decided: the preflight and
    ``ale.runs.images`` (which builds what runs will need) both ask it."""
    if desktop and image == DEFAULT_TOOLS_IMAGE and provider != "qemu":
        return DEFAULT_DESKTOP_IMAGE
    return image


def _size(d: dict[str, Any], default: DesktopSpec) -> DesktopSpec:
    def num(key: str, fallback: int) -> int:
        v = d.get(key)
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and 64 <= v <= 4096 else fallback

    return DesktopSpec(num("width", default.width), num("height", default.height))


def desktop_spec(card: dict[str, Any] | None, computer: dict[str, Any] | None) -> DesktopSpec | None:
    """The desktop a task asks for, or None (no desktop: the smaller tools image)."""
    card = card or {}
    computer = computer or {}
    wanted = card.get("desktop")
    raw_setup = computer.get("setup_config")
    setup: dict[str, Any] = raw_setup if isinstance(raw_setup, dict) else {}
    spec = None
    if wanted:
        spec = _size(wanted, DesktopSpec()) if isinstance(wanted, dict) else DesktopSpec()
    native_gui = computer.get("provider") == "native" and any(k in setup for k in ("width", "height", "image"))
    if computer.get("desktop") or computer.get("provider") == "simulated" or native_gui:
        spec = spec or DesktopSpec()
    if spec is not None and setup:
        spec = _size(setup, spec)
    return spec


class Desktop:
    """The harness's handle on one sandbox's desktop (every call an exec as the
    desktop user). ``start`` once, after the sandbox has started."""

    def __init__(self, sandbox: Sandbox, spec: DesktopSpec | None = None, *, user: str = DESKTOP_USER):
        self.sandbox = sandbox
        self.spec = spec or DesktopSpec()
        self.user = user
        self.started: dict[str, Any] | None = None
        self.client = CLIENT

    @property
    def width(self) -> int:
        return self.spec.width

    @property
    def height(self) -> int:
        return self.spec.height

    async def start(self, timeout: float = 60) -> dict[str, Any]:
        """Start the display, the window manager and the helper; returns what the
        helper reported plus the round trip (``start_s``). Raises ``DesktopError``."""
        t0 = time.perf_counter()
        r = await self.sandbox.exec(
            [*HELPER, "start", "--width", str(self.width), "--height", str(self.height)],
            user=self.user, workdir="/", timeout=timeout,
        )
        try:
            out = json.loads(r.stdout.decode(errors="replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            out = {"ok": False, "error": r.stderr.decode(errors="replace")[-2000:] or f"exit {r.exit_code}"}
        if not out.get("ok"):
            raise DesktopError(f"the desktop did not start: {out.get('error')}")
        out["start_s"] = round(time.perf_counter() - t0, 4)
        self.started = out
        return out

    async def request(self, op: str, timeout: float = 120, **args: Any) -> tuple[dict[str, Any], bytes]:
        """One request to the helper: (its JSON answer, the bytes after it).
        Raises ``DesktopError`` when it fails (bad arguments included)."""
        body = json.dumps({"op": op, **args}).encode()
        r = await self.sandbox.exec(
            self.client, user=self.user, workdir="/", timeout=timeout, stdin=body, output_limit=SCREENSHOT_LIMIT,
        )
        if r.exit_code == 2 and not r.stdout and b"desktopctl.py" in r.stderr and self.client == CLIENT:
            self.client = [*HELPER, "call"]  # an image from before the client: the helper's own call
            return await self.request(op, timeout, **args)
        line, _, data = r.stdout.partition(b"\n")
        try:
            head = json.loads(line)
        except ValueError:
            raise DesktopError(
                f"desktop {op}: no answer (exit {r.exit_code}{', timed out' if r.timed_out else ''}): "
                f"{r.stderr.decode(errors='replace')[-1000:]}"
            ) from None
        if not head.get("ok"):
            raise DesktopError(f"desktop {op}: {head.get('error')}")
        if len(data) != int(head.get("bytes", 0)):
            raise DesktopError(f"desktop {op}: {len(data)} bytes received, {head.get('bytes')} announced")
        return head, data

    async def screenshot(self) -> bytes:
        _, png = await self.request("screenshot")
        return png
