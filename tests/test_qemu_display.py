"""The screen of ale's VM guest: Xvfb and cua's computer-server started by ale's init as
the candidate (in the candidate's cgroup), driven by ale's ``CuaDesktop`` over the
control channel's relay: a screenshot has the screen's size and what an X client drew;
keys and clicks reach that client; the end-of-turn kill ends the screen too."""

from __future__ import annotations

import ast
import json
import struct
import zlib
from pathlib import Path

import pytest

from ale.runs.extensions import _ServerSession
from ale.sandbox.computer import Computer, png_size
from ale.sandbox.cua.desktop import CuaDesktop
from tests.qemu_support import booted_guest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples/tasks/gui/type_in_box/main.py"


def example_client() -> str:
    """The example task's X client (its ``XCLIENT`` source)."""
    for node in ast.parse(EXAMPLE.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "XCLIENT":
            return str(ast.literal_eval(node.value))
    raise AssertionError(f"no XCLIENT in {EXAMPLE}")


def png_pixels(png: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, the unfiltered rows) of an 8-bit RGB(A) PNG."""
    pos, idat, hdr = 8, b"", b""
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + n]
        hdr, idat = (body, idat) if kind == b"IHDR" else (hdr, idat + body if kind == b"IDAT" else idat)
        pos += 12 + n
    w, h, depth, colour = struct.unpack(">IIBB", hdr[:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    bpp = 3 if colour == 2 else 4
    raw, stride, out, prev = zlib.decompress(idat), w * bpp, bytearray(), bytearray(w * bpp)
    for y in range(h):
        f, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            pred = (0, a, b, (a + b) // 2, _paeth(a, b, c))[f]
            row[i] = (row[i] + pred) & 0xFF
        out += row
        prev = row
    return w, h, bpp, bytes(out)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def pixel(px: tuple[int, int, int, bytes], x: int, y: int) -> tuple[int, int, int]:
    w, _h, bpp, data = px
    i = (y * w + x) * bpp
    return data[i], data[i + 1], data[i + 2]


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    yield from booted_guest(tmp_path_factory, name="test-display", memory_mib=768)


def test_the_screen_is_the_candidates_xvfb_and_an_x_client_sees_keys_and_clicks(guest):
    loop, sb, base = guest
    assert sb.screen == "1024x768x24", sb.meta["guest_cfg"]

    async def go():
        screen = await CuaDesktop.of(_ServerSession(sb))
        assert screen is not None and (screen.width, screen.height) == (1024, 768)
        # Xvfb and computer-server: the candidate's uid, no capability, in the candidate's cgroup
        who = await sb.exec(["sh", "-c", "for p in $(pgrep -x Xvfb) $(pgrep -f 'm computer[_]server'); do "
                                         "grep -E '^(Uid|CapEff)' /proc/$p/status; cat /proc/$p/cgroup; done"],
                            user="0:0", timeout=30)
        out = who.stdout.decode()
        assert out.count("Uid:\t1000") == 2 and out.count("CapEff:\t0000000000000000") == 2, out
        assert out.count("0::/candidate/") == 2, out
        # an X client on that screen (the example task's): a white box at (200, 150), 600x400
        (base / "ws" / "xclient.py").write_text(example_client())
        r = await sb.exec(["sh", "-c", "DISPLAY=:99 setsid /opt/cua/bin/python /workspace/xclient.py "
                                       "/workspace/events.jsonl /tmp/ready >/tmp/xclient.log 2>&1 </dev/null & "
                                       "for i in $(seq 240); do [ -e /tmp/ready ] && exit 0; sleep 0.5; done; "
                                       "cat /tmp/xclient.log; exit 1"], timeout=180)
        assert r.exit_code == 0, r
        computer = Computer(screen)
        await computer.act({"action": "left_click", "coordinate": [500, 350], "screen": True})
        await computer.act({"action": "type", "text": "hello"})
        await computer.act({"action": "key", "text": "Return"})
        events: list[dict] = []
        for _ in range(120):
            log = base / "ws" / "events.jsonl"
            events = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
            if {"key": "\r"} in events:
                break
            await __import__("asyncio").sleep(0.5)
        assert {"button": 1, "x": 298, "y": 198} in events, events  # inside its 2-pixel border
        assert [e["key"] for e in events if "key" in e] == ["h", "e", "l", "l", "o", "\r"], events
        _, png = await screen.request("screenshot")
        assert png_size(png) == (1024, 768)
        px = png_pixels(png)
        assert pixel(px, 5, 5) == (0, 0, 0), "the root window is black"
        assert pixel(px, 700, 500) == (255, 255, 255), "the client's white box is on the screen"
        assert pixel(px, 300, 190) == (0, 0, 0), "the client's black bar is drawn"
        return png

    loop.run_until_complete(go())


def test_the_end_of_turn_kill_ends_the_screen(guest):
    loop, sb, _base = guest

    async def go():
        out = await sb.halt()
        assert out.killed >= 2 and not out.survivors, out
        left = await sb.exec(["sh", "-c", "pgrep -x Xvfb; pgrep -f 'm computer[_]server'; true"], user="0:0", timeout=30)
        assert left.stdout == b"", left

    loop.run_until_complete(go())
