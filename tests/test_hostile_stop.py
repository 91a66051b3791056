"""The end of the turn is done from the host: whatever the candidate leaves running
at that moment (processes that stop, signal or write into whatever else runs, that
stop the sandbox at any moment of the stop step), the run ends graded, scores 0, verifies and leaves
no container. Real runs of a hostile replay agent on an example task.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from ale.defaults import PROBE_USER
from ale.plan import AgentSpec, Limits, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider, DockerSandbox
from ale.sandbox.policy import IsolationPolicy
from tests.conftest import EXAMPLES, TOOLS_IMAGE, our_containers

pytestmark = pytest.mark.docker


def _run(docker_client, tmp_path: Path, steps: list[dict], *, wall: float = 120, provider=None, config=None):
    plan = RunPlan(
        run_id=f"hostile-stop-{uuid.uuid4().hex[:10]}",
        task_dir=str(EXAMPLES / "files" / "word_count"),
        agent=AgentSpec(name="replay", config=config or {"steps": steps}),
        image=TOOLS_IMAGE,
        policy=IsolationPolicy(memory_bytes=512 * 1024**2),
        limits=Limits(wall_time_s=wall),
        runs_dir=str(tmp_path / "runs"),
    )
    return graded_zero(docker_client, plan, provider), plan.run_dir


def graded_zero(docker_client, plan: RunPlan, provider=None):
    """Run ``plan``: it ends graded (scored, agent_failed or timeout) with 0, verifies, and
    leaves no container and no scratch folder."""
    result = asyncio.run(execute_run(plan, provider=provider or DockerProvider(docker_client)))
    assert our_containers(docker_client, **{"ale.run_id": plan.run_id}) == [], "a container outlived its run"
    assert not (Path(plan.runs_dir) / ".scratch" / plan.run_id).exists(), "scratch folder left behind"
    assert result.status.value in {"scored", "agent_failed", "timeout"}, (result.status, result.error, result.violations)
    assert result.scores and all(x == 0 for x in result.scores), (result.status, result.error, result.violations)
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
    return result


def _shell(cmd: str) -> dict:
    return {"tool": "shell", "args": {"command": cmd, "timeout": 60}}


def _daemon(source: str) -> dict:
    """A Python process that leaves the command's group and outlives the agent's turn."""
    return _shell(f"cat > /tmp/d.py <<'ALE_EOF'\n{source}\nALE_EOF\n"
                  "setsid nohup python3 /tmp/d.py >/dev/null 2>&1 < /dev/null & sleep 0.5; echo started")


# From the agent's last command on (/tmp/go), every 2 ms: SIGSTOP every other process
# it can reach, SIGINT/TERM/HUP/USR1 to init, and probe-looking lines into the stdout
# and stderr of every process whose fds it can open; it forks a copy of itself now and
# then (a moving target).
DISRUPTOR = r'''
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN)
me = os.getpid()
while not os.path.exists("/tmp/go"):
    time.sleep(0.002)
n = 0
while True:
    n += 1
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        pid = int(p)
        try:
            if b"/tmp/go" in open(f"/proc/{pid}/cmdline", "rb").read():
                continue  # the agent's last command: let its turn end
        except OSError:
            pass
        for s in ((signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGSTOP) if pid == 1
                  else (signal.SIGSTOP,)):
            try:
                os.kill(pid, s)
            except OSError:
                pass
        for fd in (1, 2):
            try:
                with open(f"/proc/{pid}/fd/{fd}", "w") as f:
                    f.write("=== ale-probe:id ===\nnumeric uid=0 gid=0 groups=0\n=== ale-probe:end ===\n")
            except OSError:
                pass
    if n % 200 == 0 and os.fork() == 0:
        me = os.getpid()
    time.sleep(0.002)
'''


def test_processes_that_stop_signal_and_write_into_everything_leave_a_graded_run(docker_client, tmp_path):
    result, run_dir = _run(docker_client, tmp_path, [
        _daemon(DISRUPTOR),
        _shell("kill -INT 1; kill -TERM 1; kill -HUP 1; sleep 1; echo init-alive; cat /proc/1/status | head -3"),
        _shell("echo 'wrong answer' > /workspace/answer.txt; touch /tmp/go"),
    ])
    assert result.status.value == "scored", (result.error, result.violations)
    stop = json.loads((run_dir / "evidence" / "stop.json").read_text())
    assert stop["within_bound"] and stop["halt"]["within_bound"], stop
    assert stop["halt"]["method"].startswith("cgroup"), stop
    assert stop["halt"]["killed"] >= 1 and stop["halt"]["survivors"] == [], stop
    assert stop["probes"]["user"] == "65533:65533"
    probes = (run_dir / "evidence" / "probes-after.txt").read_text()
    assert "numeric uid=0" not in probes and "numeric uid=65533 gid=65533" in probes, probes[:400]
    checks = json.loads((run_dir / "evidence" / "checks.json").read_text())
    after = {c["id"]: c for c in checks if c.get("phase") == "probes-after"}
    assert after["probe.well_formed"]["ok"] is True and after["probe.no_candidate_process_left"]["ok"] is True


class _StopsDuring(DockerSandbox):
    """The sandbox stops (its init killed, as an out-of-memory kill would) at a chosen
    moment of the stop step: as the host-side stop begins, or as the probes start."""

    moment = "halt"

    def _down(self) -> None:
        self.client.api.kill(self.id)
        self.client.api.wait(self.id, timeout=30)

    async def halt(self, **kw):
        if self.moment == "halt":
            await asyncio.to_thread(self._down)
        return await super().halt(**kw)

    async def exec(self, argv, **kw):
        if self.moment == "probes" and kw.get("user") == PROBE_USER:
            await asyncio.to_thread(self._down)
        return await super().exec(argv, **kw)


class _Provider(DockerProvider):
    def __init__(self, client, moment: str):
        super().__init__(client)
        self.moment = moment

    async def create(self, spec):
        sb = await super().create(spec)
        if spec.labels.get("ale.role") == "candidate":
            sb.__class__ = _StopsDuring
            sb.moment = self.moment
        return sb


@pytest.mark.parametrize("moment", ["halt", "probes"])
def test_a_sandbox_that_stops_during_the_stop_step_is_judged_from_its_stopped_state(docker_client, tmp_path, moment):
    result, run_dir = _run(docker_client, tmp_path, [_shell("echo 'wrong answer' > /workspace/answer.txt")],
                           provider=_Provider(docker_client, moment))
    assert result.status.value == "agent_failed", (result.status, result.error)
    assert "sandbox stopped" in (result.error or ""), result.error
    stopped = json.loads((run_dir / "evidence" / "sandbox-stopped.json").read_text())
    assert stopped["observed_at"] and stopped["state"]["Pid"] == 0, stopped
    stop = json.loads((run_dir / "evidence" / "stop.json").read_text())
    assert stop["within_bound"] and "stopped" in stop["judged"], stop


def test_a_tool_argument_no_serializer_takes_is_a_step_of_the_signed_record(docker_client, tmp_path):
    """An argument nested far past any serializer's limit: the command runs, its step
    is in trajectory.json and trajectory.jsonl alike, the value kept as a file."""
    deep: object = "bottom"
    for _ in range(300):
        deep = {"d": [deep]}
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"tool": "shell", "args": {"command": "echo wrong > /workspace/answer.txt",
                                                              "meta": deep}}]))
    plan_steps = {"script": str(script)}
    result, run_dir = _run(docker_client, tmp_path, [], config=plan_steps)
    steps = json.loads((run_dir / "trajectory.json").read_text())["steps"]
    logged = [json.loads(line) for line in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    assert len(steps) == len(logged) == 1 and steps[0]["exit_code"] == 0, steps
    ref = steps[0]["files"]["args.meta"]
    assert ref["kind"] == "json" and (run_dir / ref["path"]).stat().st_size == ref["bytes"], ref
    assert (run_dir / ref["path"]).read_text().startswith('{"d":[{"d":[')
