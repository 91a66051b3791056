"""The real computer-server (``cua-computer-server`` from PyPI) in a real sealed
container of the cua-compatible image built here (``ale image build --cua``, cached by
content): ale's client through the exec-stream tunnel, and whole runs of the example
tasks through the protocol, sealed and verified."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import time
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, Limits, RunPlan
from ale.runs.lifecycle import execute_run
from ale.sandbox.base import Mount, SandboxSpec
from ale.sandbox.cua.image import build_cua_image
from ale.sandbox.cua.sandbox import CuaSandbox
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.tools import ToolBox
from ale.status import RunStatus
from tests.conftest import EXAMPLES, our_containers, require

pytestmark = pytest.mark.docker

POLICY = IsolationPolicy(memory_bytes=1024**3)


@pytest.fixture(scope="module")
def cua_image(docker_client) -> str:
    from ale.sandbox.cua.image import CUA_REPO

    cached = any(t.startswith(f"{CUA_REPO}:") for i in docker_client.images.list(name=CUA_REPO) for t in i.tags)
    require(cached or shutil.which("debootstrap"), "building the cua image needs debootstrap (apt-get install debootstrap)")
    return build_cua_image(docker_client, say=lambda _m: None)


@pytest.fixture
def sandbox(docker_client, cua_image, tmp_path):
    inp, ws = tmp_path / "input", tmp_path / "workspace"
    inp.mkdir()
    ws.mkdir()
    os.chmod(ws, 0o777)
    (inp / "data.bin").write_bytes(bytes(range(256)) * 4)
    spec = SandboxSpec(
        name=f"ale-cua-test-{uuid.uuid4().hex[:10]}", image=cua_image, policy=POLICY,
        mounts=(Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)),
        workdir="/workspace", labels={"ale.run_id": f"cua-test-{uuid.uuid4().hex[:8]}"}, environment={"HOME": "/home/agent"},
    )
    yield spec, ws
    assert our_containers(docker_client, **spec.labels) == [], "the sandbox outlived its test"


def test_the_client_through_the_tunnel_in_a_sealed_container(docker_client, sandbox) -> None:
    spec, ws = sandbox
    timings: dict[str, list[float]] = {"protocol": [], "exec": []}

    async def go() -> dict:
        sb = await DockerProvider(docker_client).create(spec)
        assert isinstance(sb, CuaSandbox)
        try:
            return await body(sb)
        finally:
            await sb.remove()

    async def body(sb: CuaSandbox) -> dict:
        t0 = time.perf_counter()
        await sb.start()
        ready = time.perf_counter() - t0
        cua = await sb.protocol()
        r = await cua.run_command("printf 'a\\377'; echo oops >&2; exit 3", cwd="/workspace")
        assert (r.exit_code, r.stdout, r.stderr) == (3, b"a\xff", b"oops\n")
        r = await cua.run_command("id -u; cat", stdin=b"fed")
        assert r.stdout == b"1000\nfed"
        t = time.perf_counter()
        r = await cua.run_command("sleep 30 & sleep 30", timeout=1)
        assert r.timed_out and time.perf_counter() - t < 15
        assert await cua.read_bytes("/input/data.bin") == bytes(range(256)) * 4
        await cua.write_bytes("/workspace/out.bin", b"\x00\x01")
        assert (ws / "out.bin").read_bytes() == b"\x00\x01"
        assert await cua.list_dir("/workspace") == ["out.bin"]
        with pytest.raises(PermissionError):
            await cua.write_bytes("/input/x", b"no")  # the input is read-only
        png = await cua.screenshot()
        assert png.startswith(b"\x89PNG")
        await cua.move_cursor(40, 50)
        assert await cua.cursor_position() == (40, 50)
        for _ in range(15):  # one round trip each way in, on the same sandbox
            t = time.perf_counter()
            assert (await cua.run_command("true")).ok
            timings["protocol"].append(time.perf_counter() - t)
            t = time.perf_counter()
            assert (await sb.exec(["true"])).ok
            timings["exec"].append(time.perf_counter() - t)
        # The control server runs with the candidate's rights, and the probes say so.
        assert sb.rights is not None and sb.rights["mode"] == "same-rights", sb.rights
        section = await sb.control_listeners()
        assert "tcp 0100007F:1F40" in section
        # The candidate may kill it (its own process): that call fails, the next one works.
        tools = ToolBox(sb, workdir="/workspace")
        lost = await tools.call("shell", {"command": "kill -9 -1"})
        assert not lost.ok and "computer-server was lost" in (lost.error or ""), lost
        back = await tools.call("shell", {"command": "echo again"})
        assert back.ok and back.stdout == "again\n", back
        cua = await sb.protocol()
        # The end-of-turn kill ends it (a candidate process); the next call starts a fresh one.
        assert await sb.kill_user_processes() == 0
        again = await sb.protocol()
        assert again is not cua and (await again.run_command("echo back")).stdout == b"back\n"
        return {"ready_s": round(ready, 3), "starts": sb.starts}

    out = asyncio.run(go())
    medians = {k: round(statistics.median(v) * 1000, 1) for k, v in timings.items()}
    print(f"\ncua sandbox ready in {out['ready_s']}s; median `true`: protocol {medians['protocol']} ms, "
          f"docker exec {medians['exec']} ms; starts {out['starts']}")


def _plan(task: str, runs: Path, image: str, agent: str = "oracle", script: Path | None = None) -> RunPlan:
    return RunPlan(
        run_id=f"t-{uuid.uuid4().hex[:12]}", task_dir=str(EXAMPLES / task), variant=0,
        agent=AgentSpec(name=agent, config={"script": str(script)} if script else {}), image=image,
        policy=POLICY, limits=Limits(), runs_dir=str(runs),
    )


def _run(plan: RunPlan, client):
    from ale.record.verify import verify_run_dir

    result = asyncio.run(execute_run(plan, provider=DockerProvider(client)))
    assert our_containers(client, **{"ale.run_id": plan.run_id}) == [], "a container outlived its run"
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
    return result


def _cua_record(plan: RunPlan) -> dict:
    record = json.loads((plan.run_dir / "evidence" / "cua.json").read_text())
    assert record["control_server"]["mode"] == "same-rights", record["control_server"]
    assert record["calls"] > 0 and record["tunnel"]["connections"] > 0
    assert "=== ale-probe:control_server ===" in (plan.run_dir / "evidence" / "probes-before.txt").read_text()
    return record


@pytest.mark.parametrize("task", ["files/word_count", "physics/cloth_sim", "secrets/echo_secret"])
def test_example_tasks_score_through_the_protocol_sealed_and_verified(task, docker_client, cua_image, tmp_path) -> None:
    oracle = _plan(task, tmp_path, cua_image)
    result = _run(oracle, docker_client)
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores and all(s == 1.0 for s in result.scores)
    _cua_record(oracle)
    if task == "files/word_count":
        nop = _plan(task, tmp_path, cua_image, agent="nop")
        result = _run(nop, docker_client)
        assert result.status is RunStatus.SCORED and result.score == 0.0


def test_screenshot_mouse_and_keyboard_through_the_protocol(docker_client, cua_image, tmp_path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"tool": "computer", "args": {"action": "screenshot"}},
        {"tool": "computer", "args": {"action": "mouse_move", "coordinate": [100, 200]}},
        {"tool": "computer", "args": {"action": "cursor_position"}},
        {"tool": "computer", "args": {"action": "type", "text": "hello"}},
        {"tool": "computer", "args": {"action": "key", "text": "ctrl+a Return"}},
        {"tool": "shell", "args": {"command": "printf '{\"words\": %d, \"lines\": %d}\\n' $(wc -w < /input/document.txt) "
                                              "$(wc -l < /input/document.txt) > /workspace/answer.json"}},
    ]))
    plan = _plan("files/word_count", tmp_path, cua_image, agent="replay", script=script)
    result = _run(plan, docker_client)
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.error, result.violations)
    steps = json.loads((plan.run_dir / "trajectory.json").read_text())["steps"]
    assert [s["ok"] for s in steps] == [True] * 6, steps
    assert steps[2]["output"] == "X=100,Y=200"
    pngs = list((plan.run_dir / "trajectory-files").glob("*.png"))
    assert pngs and pngs[0].read_bytes().startswith(b"\x89PNG")
    _cua_record(plan)
