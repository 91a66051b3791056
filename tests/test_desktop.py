"""The desktop: task specs, the computer tool, cua-bench's action mapping, the
trajectory's PNG files, the socket and process probes (units); and, with the
desktop image, a real MCP client receiving a screenshot, GUI tasks scored by
oracle and nop, and a candidate shell that attacks the desktop and fails."""

from __future__ import annotations

import ast
import asyncio
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ale.agents.trajectory import TrajectoryWriter
from ale.isolation.probes import socket_and_process_checks, split_sections
from ale.sandbox.computer import Computer, ComputerError
from ale.sandbox.desktop import DEFAULT_DESKTOP_IMAGE, Desktop, DesktopSpec, desktop_spec
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.session import action_to_tool_args
from ale.sandbox.tools import ToolBox
from tests.conftest import require

ROOT = Path(__file__).resolve().parent.parent
GUI_TASKS = ("click_button", "fill_form", "drag_slider", "context_menu")
PNG_1x1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


# -- units ---------------------------------------------------------------------------
def test_desktop_spec_from_card_or_computer():
    assert desktop_spec({}, None) is None
    assert desktop_spec({}, {"setup_config": {"os_type": "linux"}}) is None  # ALE's shell tasks: no desktop
    assert desktop_spec({"desktop": True}, None) == DesktopSpec(1024, 768)
    assert desktop_spec({"desktop": {"width": 1280, "height": 800}}, None) == DesktopSpec(1280, 800)
    assert desktop_spec({}, {"provider": "simulated", "setup_config": {"width": 800, "height": 600}}) == DesktopSpec(800, 600)
    assert desktop_spec({}, {"desktop": True, "setup_config": {"width": "big"}}) == DesktopSpec(1024, 768)
    assert desktop_spec({}, {"provider": "native", "setup_config": {"os_type": "linux", "width": 1024, "height": 768}}) == DesktopSpec()
    assert desktop_spec({}, {"provider": "native", "setup_config": {"os_type": "linux"}}) is None


class FakeDesktop:
    def __init__(self, width=2048, height=1536):
        self.width, self.height = width, height
        self.calls: list[tuple[str, dict]] = []

    async def request(self, op, timeout=120, **kw):
        self.calls.append((op, kw))
        if op == "screenshot":
            return {"ok": True, "capture_s": 0.01}, PNG_1x1
        if op == "cursor_position":
            return {"ok": True, "x": 1000, "y": 500}, b""
        return {"ok": True}, b""


def test_computer_scales_coordinates_both_ways_and_refuses_bad_actions():
    d = FakeDesktop()
    c = Computer(d, width=1024, height=768)  # type: ignore[arg-type]

    async def go():
        await c.act({"action": "left_click", "coordinate": [100, 50]})
        await c.act({"action": "left_click_drag", "start_coordinate": [0, 0], "coordinate": [512, 384]})
        await c.act({"action": "double_click", "coordinate": [10, 10], "screen": True})
        pos = await c.act({"action": "cursor_position"})
        shot = await c.act({"action": "screenshot"})
        for bad in ({"action": "format_disk"}, {"action": "left_click", "coordinate": [2000, 10]},
                    {"action": "mouse_move"}, {"action": "type"}):
            with pytest.raises(ComputerError):
                await c.act(bad)
        return pos, shot

    pos, shot = asyncio.run(go())
    assert d.calls[0] == ("click", {"button": "left", "clicks": 1, "x": 200, "y": 100})
    assert d.calls[1][1] == {"from_x": 0, "from_y": 0, "to_x": 1024, "to_y": 768, "duration": 0.3}
    assert d.calls[2] == ("click", {"button": "left", "clicks": 2, "x": 10, "y": 10})
    assert pos.info["x"] == 500 and pos.info["y"] == 250
    assert d.calls[4] == ("screenshot", {"size": [1024, 768]})  # the desktop scales the image down
    assert shot.image == PNG_1x1 and shot.info["sha256"] == hashlib.sha256(PNG_1x1).hexdigest()


def test_cua_bench_actions_map_onto_the_computer_tool():
    assert action_to_tool_args({"type": "ClickAction", "x": 5, "y": 6}, 1024, 768) == {
        "action": "left_click", "coordinate": [5, 6], "screen": True}
    assert action_to_tool_args({"type": "HotkeyAction", "keys": ["ctrl", "a"]}, 1024, 768) == {"action": "key", "text": "ctrl+a"}
    assert action_to_tool_args({"type": "ScrollAction", "direction": "down", "amount": 300}, 1024, 768)["scroll_amount"] == 3
    assert action_to_tool_args({"type": "DragAction", "from_x": 1, "from_y": 2, "to_x": 3, "to_y": 4, "duration": 1.0},
                               1024, 768)["start_coordinate"] == [1, 2]
    assert action_to_tool_args({"type": "DoneAction"}, 1024, 768) is None
    with pytest.raises(ValueError):
        action_to_tool_args({"type": "RebootAction"}, 1024, 768)


def test_stand_in_exports_cua_bench_action_classes():
    sys.path.insert(0, str(ROOT / "src" / "ale" / "tasks" / "runtime"))
    try:
        import cua_bench as cb  # the stand-in
    finally:
        sys.path.pop(0)
    for name in ("ClickAction", "RightClickAction", "DoubleClickAction", "MiddleClickAction", "DragAction",
                 "MoveToAction", "ScrollAction", "TypeAction", "KeyAction", "HotkeyAction", "WaitAction",
                 "DoneAction", "Snapshot", "WindowSnapshot", "interact"):
        assert hasattr(cb, name), name
    assert cb.DragAction(1, 2, 3, 4).duration == 1.0 and cb.ScrollAction().amount == 100


def test_screenshot_is_a_png_file_in_the_trajectory_never_base64(tmp_path):
    w = TrajectoryWriter(tmp_path, "r", "a")
    tools = ToolBox(object(), workdir="/w", recorder=w, computer=Computer(FakeDesktop(1024, 768)))  # type: ignore[arg-type]
    out = asyncio.run(tools.call("computer", {"action": "screenshot"}))
    w.close(end="finished")
    assert out.ok and out.image == PNG_1x1
    step = json.loads((tmp_path / "trajectory.json").read_text())["steps"][0]
    ref = step["files"]["image"]
    assert ref["path"].endswith(".png") and ref["bytes"] == len(PNG_1x1)
    assert (tmp_path / ref["path"]).read_bytes() == PNG_1x1
    text = (tmp_path / "trajectory.json").read_text() + (tmp_path / "trajectory.jsonl").read_text()
    assert base64.b64encode(PNG_1x1).decode() not in text and "$base64" not in text


def test_computer_is_offered_only_with_a_desktop():
    assert "computer" not in ToolBox(object(), workdir="/w").offered  # type: ignore[arg-type]
    assert "computer" in ToolBox(object(), workdir="/w", computer=Computer(FakeDesktop())).offered  # type: ignore[arg-type]
    out = asyncio.run(ToolBox(object(), workdir="/w").call("computer", {"action": "screenshot"}))  # type: ignore[arg-type]
    assert not out.ok and "no desktop" in (out.error or "")


def test_task_check_names_a_task_flaw_apart_from_a_harness_failure():
    from types import SimpleNamespace

    from ale.grading.task_flaws import ORACLE_MISSED, RUN_FAILED, TASK_FLAW, classify, run_problem
    from ale.status import RunStatus

    nop_scores = SimpleNamespace(status=RunStatus.SCORED, scores=[1.0], error=None)
    assert classify("nop", nop_scores) == TASK_FLAW
    line = run_problem(1, "nop", nop_scores)
    assert line.startswith("task flaw: variant 1: nop") and "[1.0]" in line and "not a harness failure" in line
    assert classify("oracle", SimpleNamespace(status=RunStatus.SCORED, scores=[0.0], error=None)) == ORACLE_MISSED
    broken = SimpleNamespace(status=RunStatus.INFRASTRUCTURE_ERROR, scores=None, error="start() raised X\nmore")
    assert classify("nop", broken) == RUN_FAILED
    assert run_problem(2, "nop", broken) == "run failed: variant 2 nop: infrastructure_error: start() raised X"


def _probe_text(sockets: list[str], procs: list[str], me: int = 50) -> dict:
    raw = "=== ale-probe:sockets ===\n" + "\n".join(sockets) + f"\n=== ale-probe:processes ===\nself {me}\n" + "\n".join(procs) + "\n"
    return split_sections(raw)


class _HostileEnv:
    """A sandbox whose every exec carries an inspector server and a session bus, as an
    environment where the harness runs might: the desktop must not pass them on."""

    HOSTILE = {"WEBKIT_INSPECTOR_SERVER": "127.0.0.1:2999", "WEBKIT_INSPECTOR_HTTP_SERVER": "127.0.0.1:2998",
               "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus"}

    def __init__(self, sandbox):
        self.sandbox = sandbox

    async def exec(self, argv, **kw):
        return await self.sandbox.exec(argv, **{**kw, "env": {**(kw.get("env") or {}), **self.HOSTILE}})


def _window_environ(raw: bytes) -> dict[str, str]:
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.docker
def test_the_windows_get_no_inspector_or_bus_from_the_environment(docker_client, tmp_path):
    """The window's environment is built from nothing: an inspector server (WebKit's
    WEBKIT_INSPECTOR_SERVER / _HTTP_SERVER: a TCP port) or a session bus in the
    environment the desktop is started and driven from never reaches a window. Read
    from the real window processes (/proc/<pid>/environ, as the desktop user)."""
    from ale.defaults import DESKTOP_UID
    from ale.sandbox.base import Mount, SandboxSpec
    from ale.sandbox.docker import DockerSandbox

    image = _desktop_image(docker_client)
    ws, inp = tmp_path / "ws", tmp_path / "in"
    ws.mkdir()
    inp.mkdir()
    os.chmod(ws, 0o777)
    sandbox = DockerSandbox.create(docker_client, SandboxSpec(
        name=f"ale-test-desktop-env-{uuid.uuid4().hex[:8]}", image=image, policy=IsolationPolicy(cpus=1.0),
        mounts=(Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)),
        labels={"ale.test": "1"}, workdir="/workspace"))

    async def scenario() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        await sandbox.start()
        desktop = Desktop(_HostileEnv(sandbox))  # type: ignore[arg-type]
        await desktop.start()
        computer = Computer(desktop)
        pids = {engine: await computer.task_call("launch_window", {
            "html": "<p>env</p>", "title": engine, "x": 0, "y": 0, "width": 300, "height": 200, "engine": engine})
            for engine in ("webview", "chromium")}
        environs = {}
        for engine, pid in pids.items():
            r = await sandbox.exec(["cat", f"/proc/{pid}/environ"], user=f"{DESKTOP_UID}:{DESKTOP_UID}")
            assert r.exit_code == 0, r.stderr
            environs[engine] = _window_environ(r.stdout)
        # The hostile environment really reached the helper's own process (so the windows could have inherited it).
        r = await sandbox.exec(["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null "
                                "| grep -q '^WEBKIT_INSPECTOR_SERVER=' && echo ${p#/proc/}; done"],
                               user=f"{DESKTOP_UID}:{DESKTOP_UID}")
        carriers = set(r.stdout.decode().split())
        return environs["webview"], environs["chromium"], {"carriers": " ".join(sorted(carriers))}

    try:
        webview, chromium, seen = asyncio.run(scenario())
    finally:
        asyncio.run(sandbox.remove())
    assert seen["carriers"], "the hostile environment never reached the desktop's processes: the test proves nothing"
    for window_env in (webview, chromium):
        assert not [k for k in window_env if k.startswith("WEBKIT_INSPECTOR")], window_env
        assert window_env.get("DBUS_SESSION_BUS_ADDRESS") != "unix:path=/run/user/0/bus"
    assert webview["DBUS_SESSION_BUS_ADDRESS"] == "unix:path=/nonexistent/bus"
    assert webview["NO_AT_BRIDGE"] == "1"
    src = (ROOT / "images" / "desktop" / "webview_window.py").read_text()
    assert "debug=False" in src and "enable_developer_extras" not in src


def test_socket_and_process_probes_judge():
    policy = IsolationPolicy(cpus=1.0)
    good = _probe_text(["unix 00010000 01 /tmp/.X11-unix/X0 -", "tcp 0100007F:0277 01"],
                       ["1 1000 0 sleep", "20 1001 1 Xvfb", "49 1000 0 timeout", "50 1000 49 sh"])
    checks = {c.id: c.ok for c in socket_and_process_checks(good, policy, "after")}
    assert checks == {"probe.no_inet_listeners": True, "probe.unix_listeners_private": True,
                      "probe.process_owners": True, "probe.no_candidate_process_left": True}
    bad = _probe_text(["tcp 00000000:1770 0A", "unix 00010000 01 @/tmp/.X11-unix/X0 -", "unix 00010000 01 /tmp/x w"],
                      ["1 1000 0 sleep", "7 0 1 sshd", "30 1000 1 miner", "50 1000 1 sh"])
    checks = {c.id: c.ok for c in socket_and_process_checks(bad, policy, "after")}
    assert not any(checks.values()), checks


# -- with the desktop image -------------------------------------------------------------
def _desktop_image(docker_client) -> str:
    try:
        docker_client.images.get(DEFAULT_DESKTOP_IMAGE)
        found = True
    except Exception:
        found = False
    require(found, f"no {DEFAULT_DESKTOP_IMAGE} (ale image build --desktop; scripts/test.sh builds it)")
    return DEFAULT_DESKTOP_IMAGE


@pytest.mark.docker
def test_real_mcp_client_receives_a_screenshot_image(docker_client, tmp_path):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from ale.agents.mcp_bridge import serve_http
    from ale.sandbox.base import Mount, SandboxSpec
    from ale.sandbox.docker import DockerSandbox

    image = _desktop_image(docker_client)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o777)
    inp = tmp_path / "in"
    inp.mkdir()
    sandbox = DockerSandbox.create(docker_client, SandboxSpec(
        name=f"ale-test-desktop-{uuid.uuid4().hex[:8]}", image=image, policy=IsolationPolicy(cpus=1.0),
        mounts=(Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)),
        labels={"ale.test": "1"}, workdir="/workspace"))

    async def scenario():
        await sandbox.start()
        desktop = Desktop(sandbox)
        await desktop.start()
        computer = Computer(desktop)
        pid = await computer.task_call("launch_window", {"html": "<h1 id=t>hello</h1>", "title": "hi", "x": 0, "y": 0,
                                                         "width": 300, "height": 200})
        # A browser window where a task asks for one (ALE's engine="chromium"), beside cua-bench's.
        await computer.task_call("launch_window", {"html": "<p>browser</p>", "title": "b", "x": 400, "y": 300,
                                                   "width": 300, "height": 200, "engine": "chromium"})
        snap = await computer.task_call("get_snapshot", {"html": False})
        screen_xy = await computer.task_call("execute_javascript", {"pid": pid, "javascript": "[screenX, screenY]"})
        writer = TrajectoryWriter(tmp_path / "run", "r", "mcp")
        tools = ToolBox(sandbox, workdir="/workspace", recorder=writer, computer=computer)
        async with serve_http(tools) as (url, token):
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
            async with http, Client(streamable_http_client(url, http_client=http)) as client:
                names = sorted(t.name for t in (await client.list_tools()).tools)
                shot = await client.call_tool("computer", {"action": "screenshot"})
                click = await client.call_tool("computer", {"action": "left_click", "coordinate": [50, 50]})
        writer.close(end="finished")
        return names, shot, click, snap, screen_xy

    try:
        names, shot, click, snap, screen_xy = asyncio.run(scenario())
    finally:
        asyncio.run(sandbox.remove())
    assert sorted(w["engine"] for w in snap["windows"]) == ["chromium", "webview"], snap
    webview = next(w for w in snap["windows"] if w["engine"] == "webview")
    assert screen_xy == [webview["x"], webview["y"]]  # screenX/Y: the page's origin on the screen
    assert "computer" in names
    images = [c for c in shot.content if getattr(c, "type", "") == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    png = base64.b64decode(images[0].data)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1024
    assert not click.is_error
    step = json.loads((tmp_path / "run" / "trajectory.json").read_text())["steps"][0]
    assert hashlib.sha256((tmp_path / "run" / step["files"]["image"]["path"]).read_bytes()).hexdigest() == \
        step["files"]["image"]["sha256"] == hashlib.sha256(png).hexdigest()


def _ale(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "ale.cli", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)


@pytest.mark.docker
@pytest.mark.parametrize("task", GUI_TASKS)
def test_gui_task_check_oracle_one_nop_zero(docker_client, tmp_path, task):
    _desktop_image(docker_client)
    r = _ale("task", "check", str(ROOT / "examples" / "tasks" / "gui" / task), "--runs-dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "oracle 1.0, nop 0" in r.stdout + r.stderr


# cua-bench-basic's drag-drop in shape: HTML5 drag and drop of an element whose
# dragstart sets no data (WebKitGTK's drop target never answers such a drag unless
# the desktop gives it an item), the oracle one DragAction; the drop must also see
# the page's own data types only (none).
DND_TASK = r'''
import cua_bench as cb

HTML = """<div id="item" draggable="true" style="width:120px;height:40px;background:#f99;margin:20px">Apple</div>
<div id="zone" style="width:300px;height:160px;margin:40px 20px;background:#99f">Fruits</div>
<script>
let dragged = null; window.__drop = null;
document.getElementById('item').addEventListener('dragstart', function () { dragged = this; });
const zone = document.getElementById('zone');
zone.addEventListener('dragover', e => e.preventDefault());
zone.addEventListener('drop', e => { e.preventDefault();
  window.__drop = {item: dragged && dragged.id, types: Array.from(e.dataTransfer.types)}; });
</script>"""
pid = None


@cb.tasks_config(split="train")
def load():
    return [cb.Task(description="Drag the Apple into the Fruits box.", metadata={},
                    computer={"provider": "native", "setup_config": {"os_type": "linux", "width": 1024, "height": 768}})]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    global pid
    pid = await session.launch_window(html=HTML, title="Drag and Drop", width=500, height=400)


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session):
    drop = await session.execute_javascript(pid, "window.__drop")
    return [1.0 if drop == {"item": "item", "types": []} else 0.0]


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    a = await session.get_element_rect(pid, "#item", space="screen")
    b = await session.get_element_rect(pid, "#zone", space="screen")
    await session.execute_action(cb.DragAction(from_x=a["x"] + a["width"] / 2, from_y=a["y"] + a["height"] / 2,
                                               to_x=b["x"] + b["width"] / 2, to_y=b["y"] + b["height"] / 2,
                                               duration=0.5))
'''


@pytest.mark.docker
def test_html5_drag_and_drop_of_an_element_without_data(docker_client, tmp_path):
    _desktop_image(docker_client)
    task = tmp_path / "drag_drop"
    task.mkdir()
    (task / "main.py").write_text(DND_TASK)
    r = _ale("task", "check", str(task), "--no-adversarial", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "oracle 1.0, nop 0" in r.stdout + r.stderr


def attack_sections(steps: list[dict]) -> dict[str, str]:
    """bench/desktop_attack.json's shell steps by their ``## <what>`` header: each
    step's stdout and stderr."""
    out = {}
    for s in steps:
        text = s.get("stdout", "") + s.get("stderr", "")
        m = re.match(r"## (.+)\n", text)
        if s["tool"] == "shell" and m:
            out[m[1]] = text
    return out


@pytest.mark.docker
def test_candidate_shell_cannot_reach_the_desktop_and_the_run_is_graded(docker_client, tmp_path):
    _desktop_image(docker_client)
    r = _ale("run", str(ROOT / "examples" / "tasks" / "gui" / "click_button"), "--agent", "replay",
             "--script", str(ROOT / "bench" / "desktop_attack.json"), "--runs-dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run = next(p for p in tmp_path.iterdir() if p.is_dir() and (p / "result.json").exists())
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "scored" and result["score"] == 0.0 and result["violations"] == []
    steps = json.loads((run / "trajectory.json").read_text())["steps"]
    out = "\n".join(s["stdout"] + s["stderr"] for s in steps)
    assert "CONNECTED" not in out and "STOPPED" not in out and "KILLED" not in out and "READ " not in out
    attack = attack_sections(steps)
    # Each way in fails on its own (one refusal must not stand for another).
    assert "unable to open display" in attack["open the display (socket path)"]
    tcp = attack["open the display (abstract socket, TCP)"]
    assert len(re.findall(r"^refused ", tcp, re.M)) == 8, tcp  # 2 unix addresses, 6 ports
    cookie = attack["read the X cookie"]
    assert "Xauthority: Permission denied" in cookie and "unable to open display" in cookie, cookie
    helper = attack["reach the desktop helper"]
    assert "PermissionError" in helper or "ConnectionRefusedError" in helper, helper
    signals = attack["signal desktop processes"]
    assert signals.count("Operation not permitted") >= 2, signals  # STOP and KILL of at least one process
    # The window: cua-bench's engine (pywebview's process, WebKit's web process).
    window = attack["attach to the window (ptrace, its control pipe)"]
    host, web = re.search(r"^window pid (\d+)$", window, re.M), re.search(r"^webprocess pid (\d+)$", window, re.M)
    assert host and web, f"the attack found no window to attack:\n{window}"
    assert f"/proc/{host[1]}/fd/0: Permission denied" in window and "pipe write refused" in window, window
    for who in ("window", "webprocess"):
        assert f"{who} ptrace attach -1 Operation not permitted" in window, window
        assert f"{who} ptrace seize -1 Operation not permitted" in window, window
    engine = attack["reach the engine (IPC sockets, inspector ports)"]
    assert "denied webprocess fds" in engine, engine  # WebKit's IPC: socketpairs, reachable only through fds
    assert re.search(r"^networkprocess \d+: \S*WebKitNetworkProcess", engine, re.M), engine
    assert "denied networkprocess fds" in engine, engine
    assert "shm files of the desktop user 0" in engine, engine  # WebKit's shared memory: memfds, no /dev/shm name
    for v in ("WEBKIT_INSPECTOR_SERVER", "WEBKIT_INSPECTOR_HTTP_SERVER"):
        assert f"no {v} readable" in engine, engine
    names = ast.literal_eval(re.search(r"^unix socket names (\[.*\])$", engine, re.M)[1])
    for name in names:  # every named socket there is (the display's, the helper's) refuses the candidate
        assert re.search(rf"^refused {re.escape(name)} ", engine, re.M), (name, engine)
    assert not any(n.startswith("@") for n in names), names  # no abstract socket at all
    assert "tcp listeners 0" in engine and len(re.findall(r"^refused \d+ ", engine, re.M)) == 5, engine  # no inspector port
    procfs = attack["read /proc of desktop processes"]
    for pid, name in ((host[1], "python3"), (web[1], "WebKitWebProces")):  # comm: 15 characters
        assert re.search(rf"^process /proc/{pid} {name}$", procfs, re.M), (pid, name, procfs)
    assert len(re.findall(r"^Uid:\s+1001\s", procfs, re.M)) == 2, procfs
    for f in ("environ", "maps", "smaps", "stack", "syscall", "auxv", "mem"):
        assert procfs.count(f"denied {f}: PermissionError") == 2, (f, procfs)
    for d in ("fd", "cwd", "root", "map_files"):
        assert procfs.count(f"denied {d}/") == 2, (d, procfs)
    assert steps[-1]["tool"] == "computer" and steps[-1]["files"]["image"]["path"].endswith(".png")  # desktop intact
    checks = json.loads((run / "evidence" / "checks.json").read_text())
    assert all(c["ok"] for c in checks)
    ids = {c["id"] for c in checks}
    assert {"probe.no_inet_listeners", "probe.unix_listeners_private", "probe.process_owners",
            "probe.no_candidate_process_left"} <= ids



@pytest.mark.docker
def test_a_desktop_run_records_its_screen_after_start_and_at_the_end_of_the_turn(docker_client, tmp_path):
    """Issue 27, item 5: a GUI run whose agent took no screenshot (nop) still shows its
    screen: after start() and at the end of the agent's turn, as signed evidence, and
    on its ``ale view`` page."""
    import base64

    from ale.layout import Evidence
    from ale.record.verify import verify_run_dir
    from ale.sandbox.computer import png_size

    _desktop_image(docker_client)
    r = _ale("run", str(ROOT / "examples" / "tasks" / "gui" / "click_button"), "--agent", "nop",
             "--runs-dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run = next(p for p in tmp_path.iterdir() if p.is_dir() and (p / "result.json").exists())
    assert json.loads((run / "result.json").read_text())["status"] == "scored"
    screens = json.loads((run / "evidence" / Evidence.SCREENS).read_text())
    manifest = (run / "manifest.json").read_text()
    pngs = {}
    for moment in ("after_start", "end_of_turn"):
        shot = screens[moment]
        assert "error" not in shot, shot
        assert shot["file"] == f"evidence/{Evidence.screen(moment)}"
        png = (run / shot["file"]).read_bytes()
        assert hashlib.sha256(png).hexdigest() == shot["sha256"] and png_size(png) == (shot["width"], shot["height"])
        assert shot["file"] in manifest  # signed with the run
        pngs[moment] = png
    assert json.loads((run / "trajectory.json").read_text())["steps"] == []  # the agent took none
    assert verify_run_dir(run).valid
    events = [json.loads(line)["type"] for line in (run / "events.jsonl").read_text().splitlines()]
    # after start() and before the end-of-turn kill
    assert events.index("screen.recorded") < events.index("agent.ended") < \
        len(events) - 1 - events[::-1].index("screen.recorded") < events.index("phase.end", events.index("agent.ended"))

    v = _ale("view", str(run), "--out", str(tmp_path / "page.html"), cwd=tmp_path)
    assert v.returncode == 0, v.stdout + v.stderr
    page = (tmp_path / "page.html").read_text()
    assert 'id="screens"' in page and 'id="screen-after-start"' in page and 'id="screen-end-of-turn"' in page
    for png in pngs.values():
        assert "data:image/png;base64," + base64.b64encode(png).decode() in page

    # tampered with afterwards: the run no longer verifies
    (run / screens["end_of_turn"]["file"]).write_bytes(pngs["end_of_turn"] + b"\0")
    assert not verify_run_dir(run).valid


def test_click_element_waits_until_its_element_is_visible_and_stable():
    """Issue 27, item 8: the page learns of a right click through the display, while
    click_element reads the menu entry's box through a JavaScript evaluation; the two
    are not ordered. Under load the entry may still be hidden (a box of zeros) when
    its box is read: the click must wait for it, as Playwright's does, not land in
    the window's corner (gui/context_menu's oracle once scored 0 that way)."""
    import asyncio

    from ale.sandbox import session as sess

    hidden = {"x": 300, "y": 130, "width": 0, "height": 0}
    shown = {"x": 420, "y": 240, "width": 120, "height": 34}
    moved = {"x": 421, "y": 240, "width": 120, "height": 34}

    class Fake(sess.GuiMethods):
        def __init__(self, rects):
            self.rects, self.actions = list(rects), []

        async def _gui_task(self, op, args):
            if op == "execute_javascript":
                return False
            return self.rects.pop(0) if len(self.rects) > 1 else self.rects[0]

        async def _gui_action(self, args):
            self.actions.append(args)

        def _gui_size(self):
            return (1024, 768)

    fake = Fake([hidden, hidden, shown, moved, moved])
    asyncio.run(fake.click_element(1, "#menu-archive"))
    assert [(a["action"], a["coordinate"]) for a in fake.actions] == [("left_click", [481, 257])]  # moved's centre

    orig = sess.ACTIONABLE_TIMEOUT_S
    try:
        sess.ACTIONABLE_TIMEOUT_S = 0.3
        # never visible (an <option> of a closed drop-down: 0x0 in every engine): once
        # the wait is over, its centre is clicked as cua-bench's Playwright click does
        never = Fake([hidden])
        asyncio.run(never._click_element(1, "option[value=pro]", "ClickAction"))
        assert [a["coordinate"] for a in never.actions] == [[300, 130]]
        gone = Fake([None])
        with pytest.raises(RuntimeError, match="Element not found for selector: #nothing"):
            asyncio.run(gone._click_element(1, "#nothing", "ClickAction"))
        assert gone.actions == []
    finally:
        sess.ACTIONABLE_TIMEOUT_S = orig
