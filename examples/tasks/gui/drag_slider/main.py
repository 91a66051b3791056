"""Example GUI task ``gui/drag_slider`` (cua-bench's shape): drag a slider to a value.

The slider is the page's own (pointer events on a track): its value follows the
pointer while the button is held. The grader reads the value the page committed
on release; the oracle drags the thumb with one ``DragAction``.
"""

from __future__ import annotations

import cua_bench as cb

TARGET = 73
HTML = """<!doctype html><html><head><meta charset="utf-8"><title>Volume</title>
<style>body{font-family:sans-serif;margin:0;padding:24px;user-select:none}
#track{position:relative;width:400px;height:8px;background:#ccc;margin:40px 0 0 20px;border-radius:4px}
#thumb{position:absolute;top:-10px;width:28px;height:28px;margin-left:-14px;border-radius:14px;background:#1565c0;cursor:pointer}
#value{font-size:22px;margin:24px 0 0 20px}</style></head><body>
<h2>Volume</h2><div id="track"><div id="thumb"></div></div><div id="value">20</div>
<script>
const track = document.getElementById('track'), thumb = document.getElementById('thumb'), out = document.getElementById('value');
let value = 20, dragging = false; window.__committed = null;
function show() { thumb.style.left = (value * 4) + 'px'; out.textContent = value; }
function at(x) { const r = track.getBoundingClientRect(); return Math.max(0, Math.min(100, Math.round((x - r.left) / r.width * 100))); }
thumb.addEventListener('mousedown', e => { dragging = true; e.preventDefault(); });
window.addEventListener('mousemove', e => { if (dragging) { value = at(e.clientX); show(); } });
window.addEventListener('mouseup', e => { if (dragging) { dragging = false; value = at(e.clientX); show(); window.__committed = value; } });
show();
</script></body></html>"""  # noqa: E501

pid = None


@cb.tasks_config(split="train")
def load():
    return [cb.Task(
        description=f"A 'Volume' window with a slider is open on the screen (it shows its value below it). "
                    f"Drag the slider's round handle until the value reads exactly {TARGET}, and release it there. "
                    "Use the computer tool.",
        task_id="gui/drag_slider",
        metadata={"target": TARGET},
        computer={"provider": "simulated", "setup_config": {"os_type": "linux", "width": 1024, "height": 768}},
    )]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    global pid
    pid = await session.launch_window(html=HTML, title="Volume", x=200, y=120, width=520, height=300)


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session) -> list[float]:
    value = await session.execute_javascript(pid, "window.__committed")
    return [1.0 if value == task_cfg.metadata["target"] else 0.0]


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    thumb = await session.get_element_rect(pid, "#thumb", space="screen")
    track = await session.get_element_rect(pid, "#track", space="screen")
    fx, fy = int(thumb["x"] + thumb["width"] / 2), int(thumb["y"] + thumb["height"] / 2)
    tx = round(track["x"] + track["width"] * task_cfg.metadata["target"] / 100)
    await session.execute_action(cb.DragAction(from_x=fx, from_y=fy, to_x=tx, to_y=fy, duration=0.5))
