"""Example GUI task ``gui/type_in_box`` (cua's shape: the screen is computer-server's):
click a white box drawn by a plain X client, type ``hello`` and press Enter.

It needs a screen served by cua's computer-server with an X client library beside it:
the qemu provider's own guest (Xvfb, computer-server and python-xlib in /opt/cua), not
ale's desktop image. ``start`` runs the X client as the candidate on that screen; the
client appends every click and key it receives to a log in the workspace; the grader
reads that log among the deliverables, in its own sandbox, once the candidate's
processes are dead. The log is the candidate's to write too (the client is a candidate
process): the task shows keyboard and mouse reaching an X client, it is not a
tamper-proof grader.
"""

from __future__ import annotations

import json

import cua_bench as cb

CLIENT = "/tmp/ale-example-xclient.py"
LOG = "/workspace/xclient-events.jsonl"  # a deliverable: the grader reads it in its own sandbox
READY = "/tmp/ale-example-xclient.ready"
PYTHON = "/opt/cua/bin/python"  # computer-server's venv: python-xlib (pynput's X backend) is in it
DISPLAY = ":99"  # the screen computer-server's entrypoint starts
BOX = (200, 150, 600, 400)  # x, y, width, height on the screen

XCLIENT = '''
import json, sys
from Xlib import X, XK, display

LOG, READY, BOX = sys.argv[1], sys.argv[2], (200, 150, 600, 400)


def note(doc):
    with open(LOG, "a") as f:
        f.write(json.dumps(doc) + "\\n")


d = display.Display()
s = d.screen()
w = s.root.create_window(*BOX, 2, s.root_depth, background_pixel=s.white_pixel, border_pixel=s.black_pixel,
                         override_redirect=True, event_mask=X.ExposureMask | X.KeyPressMask | X.ButtonPressMask)
gc = w.create_gc(foreground=s.black_pixel, background=s.white_pixel)
w.map()
w.set_input_focus(X.RevertToParent, X.CurrentTime)
d.sync()
open(READY, "w").close()
typed = ""
while True:
    e = d.next_event()
    if e.type == X.ButtonPress:
        w.set_input_focus(X.RevertToParent, X.CurrentTime)
        note({"button": e.detail, "x": e.event_x, "y": e.event_y})
    elif e.type == X.KeyPress:
        sym = d.keycode_to_keysym(e.detail, 1 if e.state & X.ShiftMask else 0)
        key = XK.keysym_to_string(sym) or str(sym)
        note({"key": key})
        typed += key if len(key) == 1 and key.isprintable() else ""
    w.clear_area()
    w.fill_rectangle(gc, 20, 20, 560, 40)
    w.draw_text(gc, 20, 100, b"Click here, type hello and press Enter")
    w.draw_text(gc, 20, 140, ("typed: " + typed).encode())
    d.flush()
'''


@cb.tasks_config(split="train")
def load():
    return [cb.Task(
        description="A white box is on the screen. Click inside it, type the word hello and press Enter. "
                    "Use the computer tool: take a screenshot first.",
        task_id="gui/type_in_box",
        metadata={"remote_output_dir": "/workspace"},
        computer={"provider": "native", "setup_config": {"os_type": "linux", "width": 1024, "height": 768}},
    )]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    check = await session.run_command(f"test -x {PYTHON} && {PYTHON} -c 'import Xlib'", check=False)
    if check["return_code"] != 0:
        raise RuntimeError(f"gui/type_in_box needs computer-server's screen and python-xlib in {PYTHON} "
                           "(the qemu provider's own guest: --provider qemu)")
    await session.write_file(CLIENT, XCLIENT)
    await session.run_command(f"DISPLAY={DISPLAY} setsid {PYTHON} {CLIENT} {LOG} {READY} "
                              ">/tmp/ale-example-xclient.log 2>&1 </dev/null &")
    for _ in range(240):  # the window is up before the agent's first screenshot
        if (await session.run_command(f"test -e {READY} || {{ sleep 0.5; false; }}", check=False))["return_code"] == 0:
            return
    log = (await session.run_command("cat /tmp/ale-example-xclient.log", check=False))["stdout"]
    raise RuntimeError(f"the example's X client did not start: {log[-2000:]}")


def _events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session) -> list[float]:
    if not await session.file_exists(LOG):
        return [0.0]
    events = _events(await session.read_file(LOG))
    x, y, w, h = BOX
    clicked = any("button" in e and 0 <= e["x"] < w and 0 <= e["y"] < h for e in events)
    keys = [e["key"] for e in events if "key" in e]
    typed = "".join(k for k in keys if len(k) == 1 and k.isprintable())
    return [1.0 if clicked and typed == "hello" and "\r" in keys else 0.0]


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    x, y, w, h = BOX
    await session.execute_action({"type": "ClickAction", "x": x + w // 2, "y": y + h // 2})
    await session.execute_action({"type": "TypeAction", "text": "hello"})
    await session.execute_action({"type": "KeyAction", "key": "Return"})
    for _ in range(120):  # the client (slow under TCG emulation) has logged the Enter before the turn ends
        if '"\\r"' in (await session.run_command(f"cat {LOG}; sleep 0.5", check=False))["stdout"]:
            return
