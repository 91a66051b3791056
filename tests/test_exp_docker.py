"""Real Docker: SIGKILL the orchestrator mid-way, start again, every run ends once,
no container left; Ctrl-C leaves no container; concurrency bounds containers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

SLOW_TASK = textwrap.dedent("""\
    import asyncio

    import cua_bench as cb


    @cb.tasks_config
    def load():
        return [cb.Task(description=f"Do nothing ({i}).", task_id=f"slow-{i}") for i in range(4)]


    @cb.setup_task
    async def start(cfg, session):
        await asyncio.sleep(1.5)  # keeps the candidate container alive a while


    @cb.evaluate_task
    async def evaluate(cfg, session):
        return [0.0]
""")


def make_experiment(tmp: Path, name: str, repeats: int = 2, concurrency: int = 2) -> Path:
    task = tmp / "tasks" / "slow"
    task.mkdir(parents=True)
    (task / "main.py").write_text(SLOW_TASK)
    f = tmp / "exp.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: {name}
        tasks_root: tasks
        agents: [{{name: nop}}]
        tasks: [{{path: slow, variants: all}}]
        repeats: {repeats}
        concurrency: {concurrency}
        environment:
          policy: {{cpus: 1, memory_bytes: 268435456}}
        output: out
    """))
    return f


def start(exp: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ale.cli.exp", "run", str(exp), "--plain"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def containers(client, name: str) -> list:
    # The low-level call lists without inspecting each one (no race with removals).
    return client.api.containers(all=True, filters={"label": [f"ale.experiment={name}"]})


def results(out: Path) -> list[Path]:
    return sorted((out / "runs").glob("*/result.json")) if (out / "runs").is_dir() else []


@pytest.fixture
def exp_name(docker_client):
    name = f"exptest-{uuid.uuid4().hex[:8]}"
    yield name
    from ale.sandbox.docker import remove_containers

    remove_containers(docker_client, experiment=name)


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None, poll=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if poll:
            poll()
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended before {what}: {proc.communicate()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkill_then_resume_ends_every_run_once(tmp_path: Path, docker_client, exp_name: str) -> None:
    exp = make_experiment(tmp_path, exp_name)
    out = tmp_path / "out"
    proc = start(exp)
    peak = [0]

    def sample() -> None:
        peak[0] = max(peak[0], len(containers(docker_client, exp_name)))

    try:
        wait_for(lambda: len(results(out)) >= 2 and len(containers(docker_client, exp_name)) >= 1,
                 90, "two results and a live container", proc, poll=sample)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert peak[0] <= 2  # concurrency 2: never more than 2 containers
    done_before = len(results(out))
    assert done_before < 8

    second = subprocess.run([sys.executable, "-m", "ale.cli.exp", "run", str(exp), "--plain"],
                            capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith("report.html")
    found = results(out)
    # Every planned run ended exactly once (on failure: what each attempt said).
    assert len(found) == 8, [(p.parent.name, json.loads(p.read_text())["status"],
                              (json.loads(p.read_text()).get("error") or "")[:300]) for p in found]
    assert sorted(p.parent.name for p in found) == sorted(
        f"slow-v{v}-nop-r{r}-a1" for v in range(4) for r in range(2))
    assert (out / ".incomplete").is_dir()  # the half-done run(s) were moved aside and redone
    assert containers(docker_client, exp_name) == []
    assert (out / "report.html").is_file() and (out / "report.json").is_file()


def test_ctrl_c_leaves_no_container(tmp_path: Path, docker_client, exp_name: str) -> None:
    exp = make_experiment(tmp_path, exp_name, repeats=3)
    out = tmp_path / "out"
    proc = start(exp)
    try:
        wait_for(lambda: len(containers(docker_client, exp_name)) >= 1, 90, "a container", proc)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    assert containers(docker_client, exp_name) == []
    assert len(results(out)) < 12
