"""Desktop round trips: screenshots and actions through the harness's computer tool
(an exec as the desktop user per call) vs the same capture and input run directly
inside the container (one exec, a loop in the helper's own code), at 1024x768;
and the desktop's start per run (fresh sealed container each time).

Writes the numbers to bench/results/desktop.{json,md} (docs/benchmarks.md cites them).

    .venv/bin/python bench/desktop.py [--repeats 50] [--starts 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from publish import publish  # noqa: E402

from ale.sandbox.base import Mount, SandboxSpec  # noqa: E402
from ale.sandbox.computer import Computer, ComputerError  # noqa: E402
from ale.sandbox.desktop import DEFAULT_DESKTOP_IMAGE, DESKTOP_USER, HELPER, Desktop  # noqa: E402
from ale.sandbox.docker import DockerSandbox, connect  # noqa: E402
from ale.sandbox.policy import IsolationPolicy  # noqa: E402

IMAGE = [DEFAULT_DESKTOP_IMAGE]  # --image
HTML = "<h1>bench</h1><button id=b style='position:absolute;left:100px;top:100px'>x</button>"
DIRECT = r"""
import json, sys, time, subprocess
sys.path.insert(0, "/opt/ale-desktop")
import desktopd as d
n = int(sys.argv[1])
s = d.Screen()
shots, clicks, sizes = [], [], []
for i in range(n):
    t = time.perf_counter(); png, _ = s.capture(1024, 768); shots.append(time.perf_counter() - t); sizes.append(len(png))
for i in range(n):
    t = time.perf_counter()
    subprocess.run(["xdotool", "mousemove", "--sync", str(200 + i % 2), "200", "click", "1"], env=d.env(), check=True)
    clicks.append(time.perf_counter() - t)
print(json.dumps({"screenshot": shots, "click": clicks, "png_bytes": sizes}))
"""  # noqa: E501


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]
    return {"median_ms": round(statistics.median(xs) * 1000, 1), "p95_ms": round(p95 * 1000, 1), "n": len(xs)}


def desktop_of(box: DockerSandbox, variant: str) -> Desktop:
    """``IMAGE@helper``: each call through ``desktopd.py call`` (the client before
    ``desktopctl.py``), else the harness's own client."""
    desk = Desktop(box)
    if variant.partition("@")[2] == "helper":
        desk.client = [*HELPER, "call"]
    return desk


async def sandbox(client, root: Path, image: str) -> DockerSandbox:
    ws, inp = root / f"ws-{uuid.uuid4().hex[:6]}", root / f"in-{uuid.uuid4().hex[:6]}"
    ws.mkdir()
    inp.mkdir()
    ws.chmod(0o777)
    box = DockerSandbox.create(client, SandboxSpec(
        name=f"ale-bench-desktop-{uuid.uuid4().hex[:8]}", image=image.partition("@")[0], policy=IsolationPolicy(),
        mounts=(Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)),
        labels={"ale.bench": "desktop"}, workdir="/workspace"))
    return box


async def main(repeats: int, starts: int) -> dict:
    """Every measurement on each image in turn (``--image`` twice: interleaved, call by
    call, two sandboxes up at once), so that both see the same load."""
    client = connect()
    root = Path(tempfile.mkdtemp(prefix="ale-bench-desktop-"))
    per: dict[str, dict[str, list[float]]] = {
        im: {k: [] for k in ("start_total", "start_helper", "first_window", "screenshot", "click", "mouse_move",
                             "helper_capture")} for im in IMAGE}
    failed: dict[str, list[str]] = {im: [] for im in IMAGE}
    for _ in range(starts):
        for im in IMAGE:
            box = await sandbox(client, root, im)
            try:
                t0 = time.perf_counter()
                await box.start()
                desk = desktop_of(box, im)
                info = await desk.start()
                per[im]["start_total"].append(time.perf_counter() - t0)
                per[im]["start_helper"].append(info["seconds"])
                t1 = time.perf_counter()
                try:
                    await Computer(desk).task_call("launch_window", {"html": HTML, "x": 0, "y": 0, "width": 400,
                                                                     "height": 300})
                    per[im]["first_window"].append(time.perf_counter() - t1)
                except ComputerError as e:  # counted, and said: a loaded machine
                    failed[im].append(f"{time.perf_counter() - t1:.1f}s: {e}")
                    print(f"{im}: first window failed: {e}", file=sys.stderr)
            finally:
                await box.remove()
    boxes, comps = {}, {}
    direct: dict[str, dict] = {}
    try:
        for im in IMAGE:
            boxes[im] = await sandbox(client, root, im)
            await boxes[im].start()
            desk = desktop_of(boxes[im], im)
            await desk.start()
            comps[im] = Computer(desk)
            await comps[im].task_call("launch_window", {"html": HTML, "x": 0, "y": 0, "width": 600, "height": 400})
        for _ in range(repeats):
            for im in IMAGE:
                t = time.perf_counter()
                out = await comps[im].act({"action": "screenshot"})
                per[im]["screenshot"].append(time.perf_counter() - t)
                per[im]["helper_capture"].append(out.info["capture_s"])
        for i in range(repeats):
            for im in IMAGE:
                t = time.perf_counter()
                await comps[im].act({"action": "left_click", "coordinate": [200 + i % 2, 200]})
                per[im]["click"].append(time.perf_counter() - t)
        for i in range(repeats):
            for im in IMAGE:
                t = time.perf_counter()
                await comps[im].act({"action": "mouse_move", "coordinate": [300 + i % 2, 300]})
                per[im]["mouse_move"].append(time.perf_counter() - t)
        for im in IMAGE:
            r = await boxes[im].exec(["python3", "-c", DIRECT, str(repeats)], user=DESKTOP_USER,
                                     workdir="/", timeout=600)
            direct[im] = json.loads(r.stdout.decode().strip().splitlines()[-1])
    finally:
        for box in boxes.values():
            await box.remove()
    results = {}
    for im in IMAGE:
        p, d = per[im], direct[im]
        results[im] = {
            "harness": {k: stats(p[k]) for k in ("screenshot", "click", "mouse_move")},
            "harness_helper_capture": stats(p["helper_capture"]),
            "direct": {"screenshot": stats(d["screenshot"]), "click": stats(d["click"])},
            "png_bytes_median": int(statistics.median(d["png_bytes"])),
            "desktop_start": {"container_start_plus_desktop": stats(p["start_total"]),
                              "helper_internal": stats(p["start_helper"]),
                              "first_window": stats(p["first_window"]) if p["first_window"] else None,
                              "first_window_failed": failed[im], "runs": starts},
        }
    res = {"resolution": "1024x768", "load": " / ".join(f"{x:.1f}" for x in os.getloadavg()), "repeats": repeats,
           "images": IMAGE, "per_image": results}
    res.update(results[IMAGE[-1]])  # the last image's figures at the top level (the doc's table)
    return res


def write_doc(res: dict) -> None:
    h, d, s = res["harness"], res["direct"], res["desktop_start"]

    def row(name: str, x: dict | None) -> str:
        if x is None:
            return f"| {name} | every launch failed | | 0 |"
        return f"| {name} | {x['median_ms']} | {x['p95_ms']} | {x['n']} |"

    section = "\n".join([
        f"`bench/desktop.py` on this machine, {res['resolution']}, the desktop image, the default sealed policy; "
        f"{res['repeats']} calls each. *Harness* = the `computer` tool as an agent calls it (one `docker exec` "
        "as the desktop user per call, the helper's socket, xdotool or XGetImage + PNG); *direct* = the same "
        "capture and the same xdotool call in a loop inside the container (no exec per call). Median PNG: "
        f"{res['png_bytes_median']} bytes. Load average during the run: {res.get('load', '?')}.",
        "",
        "| round trip | median ms | p95 ms | n |",
        "| --- | --- | --- | --- |",
        row("screenshot, harness", h["screenshot"]),
        row("screenshot, direct in the container", d["screenshot"]),
        row("screenshot, the helper's own capture+encode (harness path)", res["harness_helper_capture"]),
        row("left click, harness", h["click"]),
        row("left click, direct in the container", d["click"]),
        row("mouse move, harness", h["mouse_move"]),
        "",
        f"Desktop start per run ({s['runs']} fresh sealed containers):",
        "",
        "| | median ms | p95 ms | n |",
        "| --- | --- | --- | --- |",
        row("container start + desktop ready (Xvfb, openbox, helper)", s["container_start_plus_desktop"]),
        row("the helper's own start (inside the container)", s["helper_internal"]),
        row("first window launched and ready (pywebview on WebKitGTK)", s["first_window"]),
        "",
    ])
    print("wrote", *publish("desktop", res, section))

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--image", action="append", default=None,
                    help="the desktop image (repeated: each measured in turn, interleaved; the doc gets the last one); "
                         "IMAGE@helper: every call through `desktopd.py call`, the client before desktopctl.py")
    ap.add_argument("--no-doc", action="store_true", help="print only; write no bench/results/desktop.{json,md}")
    a = ap.parse_args()
    IMAGE[:] = a.image or [DEFAULT_DESKTOP_IMAGE]
    res = asyncio.run(main(a.repeats, a.starts))
    print(json.dumps(res, indent=2))
    if not a.no_doc:
        write_doc(res)
