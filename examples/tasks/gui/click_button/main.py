"""Example GUI task ``gui/click_button`` (cua-bench's shape): press a button in an HTML window.

``start`` opens the window; the grader asks the live page (``execute_javascript``)
whether the button was pressed; the oracle clicks it through the computer tool.
"""

from __future__ import annotations

import cua_bench as cb

HTML = """<!doctype html><html><head><meta charset="utf-8"><title>Launch control</title>
<style>body{font-family:sans-serif;margin:0;padding:24px} button{font-size:18px;padding:10px 24px}
#status{margin-top:24px;font-size:16px}</style></head><body>
<h2>Launch control</h2>
<p>Press the button labelled <b>Launch</b>.</p>
<button id="decoy" onclick="window.__pressed = (window.__pressed || []).concat(['abort'])">Abort</button>
<button id="launch" style="margin-left:160px" onclick="window.__pressed = (window.__pressed || []).concat(['launch']); document.getElementById('status').textContent = 'Launched.'">Launch</button>
<div id="status">Waiting.</div>
</body></html>"""  # noqa: E501

pid = None  # the window, from start() to evaluate() (this task's own process)


@cb.tasks_config(split="train")
def load():
    return [cb.Task(
        description="A window titled 'Launch control' is open on the screen. Press its 'Launch' button once "
                    "(and no other button). Use the computer tool: take a screenshot first.",
        task_id="gui/click_button",
        metadata={},
        computer={"provider": "simulated", "setup_config": {"os_type": "linux", "width": 1024, "height": 768}},
    )]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    global pid
    pid = await session.launch_window(html=HTML, title="Launch control", x=120, y=80, width=640, height=360)


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session) -> list[float]:
    pressed = await session.execute_javascript(pid, "window.__pressed || []")
    return [1.0 if pressed == ["launch"] else 0.0]


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    await session.click_element(pid, "#launch")
