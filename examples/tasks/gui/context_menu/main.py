"""Example GUI task ``gui/context_menu`` (cua-bench's shape): use a right-click menu.

A file list whose items open the page's own context menu on a right click. The
grader reads which action the page recorded; the oracle right-clicks the item
and clicks the menu entry through the computer tool.
"""

from __future__ import annotations

import cua_bench as cb

HTML = """<!doctype html><html><head><meta charset="utf-8"><title>Files</title>
<style>body{font-family:sans-serif;margin:0;padding:20px} li{padding:8px;list-style:none;border-bottom:1px solid #ddd;width:300px}
#menu{display:none;position:fixed;background:#fff;border:1px solid #888;box-shadow:2px 2px 6px #aaa}
#menu div{padding:8px 24px;cursor:pointer} #menu div:hover{background:#e3f2fd}</style></head><body>
<h2>Files</h2><ul id="files">
<li id="item-notes" data-name="notes.txt">notes.txt</li>
<li id="item-report" data-name="report.pdf">report.pdf</li>
<li id="item-photo" data-name="photo.png">photo.png</li></ul>
<div id="menu"><div id="menu-rename" data-action="rename">Rename</div><div id="menu-archive" data-action="archive">Archive</div>
<div id="menu-delete" data-action="delete">Delete</div></div>
<script>
const menu = document.getElementById('menu'); let target = null; window.__actions = [];
document.querySelectorAll('#files li').forEach(li => li.addEventListener('contextmenu', e => {
  e.preventDefault(); target = li.dataset.name; menu.style.left = e.clientX + 'px'; menu.style.top = e.clientY + 'px';
  menu.style.display = 'block'; }));
menu.querySelectorAll('div').forEach(d => d.addEventListener('click', () => {
  window.__actions.push(d.dataset.action + ':' + target); menu.style.display = 'none';
  if (d.dataset.action === 'archive') document.querySelector('[data-name="' + target + '"]').style.opacity = 0.4; }));
window.addEventListener('click', e => { if (!menu.contains(e.target)) menu.style.display = 'none'; });
document.addEventListener('contextmenu', e => e.preventDefault());
</script></body></html>"""  # noqa: E501

pid = None


@cb.tasks_config(split="train")
def load():
    return [cb.Task(
        description="A 'Files' window is open on the screen. Archive the file 'report.pdf' using its right-click "
                    "menu (and do nothing else to any file). Use the computer tool.",
        task_id="gui/context_menu",
        metadata={"expected": ["archive:report.pdf"]},
        computer={"provider": "simulated", "setup_config": {"os_type": "linux", "width": 1024, "height": 768}},
    )]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    global pid
    pid = await session.launch_window(html=HTML, title="Files", x=300, y=100, width=480, height=360)


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session) -> list[float]:
    actions = await session.execute_javascript(pid, "window.__actions")
    return [1.0 if actions == task_cfg.metadata["expected"] else 0.0]


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    await session.right_click_element(pid, "#item-report")
    await session.click_element(pid, "#menu-archive")
