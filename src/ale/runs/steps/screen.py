"""A desktop run's screen and a cua sandbox's record, kept as evidence at the moments the table names."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ale import layout
from ale.layout import Evidence
from ale.record import evidence as ev
from ale.runs.state import RunState, now


async def record_cua(state: RunState) -> None:
    """A cua-compatible image's sandbox (``ale.sandbox.cua.sandbox``): its computer-server,
    the tunnel to it and the control server's rights beside the candidate's (written
    once, at the end of the agent's turn)."""
    record = getattr(state.sandbox, "record", None)
    if record is not None:
        state.record.store.write_json(Evidence.CUA, await record())


# A desktop run's screen, recorded at these moments (evidence/screens.json, the PNGs beside).
SCREEN_AFTER_START, SCREEN_END_OF_TURN = "after_start", "end_of_turn"


SCREENSHOT_BOUND_S = 30.0


async def record_screen(state: RunState, moment: str) -> None:
    """The whole screen of a desktop run (the desktop's or a cua sandbox's), as its own
    evidence file; a screen that cannot be captured is recorded with why, and never
    fails the run. A run without a desktop records nothing."""
    computer = state.extension.computer
    if computer is None or state.live.sandbox is None:
        return
    from ale.sandbox.computer import png_size

    entry: dict[str, Any] = {"at": now().isoformat()}
    t0 = time.monotonic()
    try:
        _, png = await asyncio.wait_for(computer.desktop.request("screenshot", timeout=SCREENSHOT_BOUND_S),
                                        SCREENSHOT_BOUND_S + 5)
        width, height = png_size(png)
        name = Evidence.screen(moment)
        ev.write_new(state.record.store.path(name), png, durable=state.record.store.durable)
        entry.update(file=layout.evidence_path(name), sha256=ev.sha256_bytes(png), bytes=len(png), width=width,
                     height=height)
    except Exception as e:  # the desktop may be gone (the candidate's doing, or the sandbox stopped)
        entry["error"] = f"{type(e).__name__}: {e}"[:2000]
    entry["seconds"] = round(time.monotonic() - t0, 4)
    state.record.screens[moment] = entry
    state.record.events.append("screen.recorded", moment=moment,
                               **{k: entry[k] for k in ("sha256", "error") if k in entry})
