"""Example GUI task ``gui/fill_form`` (cua-bench's shape): fill a form and submit it.

The grader reads what the page received on submit (``execute_javascript``); the
oracle clicks each field and types, through the computer tool.
"""

from __future__ import annotations

import cua_bench as cb

NAME, EMAIL, PLAN = "Ada Lovelace", "ada@example.org", "pro"
HTML = """<!doctype html><html><head><meta charset="utf-8"><title>Sign up</title>
<style>body{font-family:sans-serif;margin:0;padding:20px} label{display:block;margin-top:12px}
input,select{font-size:16px;width:280px;padding:4px} button{margin-top:18px;font-size:16px;padding:6px 18px}</style>
</head><body><h2>Sign up</h2>
<form id="f" onsubmit="event.preventDefault(); window.__submitted = {name: document.getElementById('name').value,
  email: document.getElementById('email').value, plan: document.getElementById('plan').value};
  document.getElementById('done').textContent = 'Thanks!';">
<label>Full name <input id="name" autocomplete="off"></label>
<label>Email <input id="email" autocomplete="off"></label>
<label>Plan <select id="plan"><option value="free">Free</option><option value="pro">Pro</option>
<option value="team">Team</option></select></label>
<button id="submit" type="submit">Create account</button></form><div id="done"></div>
</body></html>"""

pid = None


@cb.tasks_config(split="train")
def load():
    return [cb.Task(
        description=f"A 'Sign up' form is open on the screen. Fill it in: full name '{NAME}', email '{EMAIL}', "
                    "plan 'Pro', then press 'Create account'. Use the computer tool.",
        task_id="gui/fill_form",
        metadata={"name": NAME, "email": EMAIL, "plan": PLAN},
        computer={"provider": "simulated", "setup_config": {"os_type": "linux", "width": 1024, "height": 768}},
    )]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    global pid
    pid = await session.launch_window(html=HTML, title="Sign up", x=60, y=40, width=520, height=420)


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session) -> list[float]:
    got = await session.execute_javascript(pid, "window.__submitted || null")
    want = task_cfg.metadata
    if not isinstance(got, dict):
        return [0.0]
    ok = got.get("name") == want["name"] and got.get("email") == want["email"] and got.get("plan") == want["plan"]
    return [1.0 if ok else 0.0]


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    meta = task_cfg.metadata
    await session.click_element(pid, "#name")
    await session.execute_action(cb.TypeAction(text=meta["name"]))
    await session.click_element(pid, "#email")
    await session.execute_action(cb.TypeAction(text=meta["email"]))
    # A <select>: focus it and choose by keyboard (Down moves Free -> Pro).
    await session.click_element(pid, "#name")
    await session.execute_action(cb.KeyAction(key="Tab"))
    await session.execute_action(cb.KeyAction(key="Tab"))
    await session.execute_action(cb.KeyAction(key="Down"))
    await session.click_element(pid, "#submit")
