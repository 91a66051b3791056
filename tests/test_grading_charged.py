"""No candidate can void its failure (real containers).

A grader that breaks on the candidate's output (an exception, a recursion limit, a
hang past the grading timeout, its process killed) is retried on the same signed
deliverables and then charged to the candidate: counted as 0 and flagged, never
retried. A grading environment that fails is the harness's: left out, retried. A
sandbox the candidate brings down is graded as it was left; a /tmp sized to fit the
memory cannot bring it down."""

from __future__ import annotations

import asyncio
import json
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from ale.plan import AgentSpec, Limits, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.base import SandboxError, SandboxSpec
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import MIB, IsolationPolicy, TmpfsMount
from ale.status import InvalidAttribution, RunStatus, headline_score, is_retryable
from tests.conftest import TOOLS_IMAGE, our_containers

pytestmark = pytest.mark.docker

TASK = '''
import json, os, time
import cua_bench as cb

@cb.tasks_config
def load():
    return [cb.Task(description="write /workspace/answer.json", task_id="charged-0",
                    metadata={{"input_dir": "/input", "remote_output_dir": "/workspace"}})]

@cb.evaluate_task
async def evaluate(cfg, session):
    raw = await session.read_file("/workspace/answer.json")
{body}
'''


def task(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "tasks" / f"t{uuid.uuid4().hex[:6]}"
    d.mkdir(parents=True)
    (d / "main.py").write_text(TASK.format(body=textwrap.indent(textwrap.dedent(body).strip("\n"), "    ")))
    return d


def plan(d: Path, tmp_path: Path, steps: list[dict], *, policy: IsolationPolicy | None = None, **limits: Any) -> RunPlan:
    return RunPlan(run_id=f"c-{uuid.uuid4().hex[:10]}", task_dir=str(d), agent=AgentSpec(name="replay", config={"steps": steps}),
                   image=TOOLS_IMAGE, policy=policy or IsolationPolicy(memory_bytes=512 * MIB),
                   limits=Limits(**{"grading_attempts": 2, "grading_backoff_s": 0.0, **limits}), runs_dir=str(tmp_path / "runs"))


def run(p: RunPlan, client: Any, provider: DockerProvider | None = None):
    result = asyncio.run(execute_run(p, provider=provider or DockerProvider(client)))
    assert our_containers(client, **{"ale.run_id": p.run_id}) == [], "a container outlived its run"
    report = verify_run_dir(p.run_dir)
    assert report.valid, report.reasons
    return result


def write(path: str, content: str) -> dict:
    return {"tool": "write_file", "args": {"path": path, "content": content}}


def shell(cmd: str) -> dict:
    return {"tool": "shell", "args": {"command": cmd}}


def assert_charged(result: Any, p: RunPlan, attempts: int = 2) -> None:
    assert result.status is RunStatus.GRADING_FAILED, (result.status, result.error)
    assert result.invalid_attribution is InvalidAttribution.AFTER_AGENT_START
    assert result.headline == 0.0 and not result.retryable and result.score is None
    recorded = json.loads((p.run_dir / "evidence" / "grading-attempts.json").read_text())
    assert [a["attempt"] for a in recorded] == list(range(1, attempts + 1)) and all(a.get("error") for a in recorded)


# A JSON array nested 200,000 deep: json.loads raises RecursionError.
DEEP = "[" * 200_000 + "]" * 200_000


def test_a_grader_that_chokes_on_the_output_is_charged_to_the_candidate(docker_client, tmp_path) -> None:
    d = task(tmp_path, "return [float(len(json.loads(raw)) > 0)]")
    p = plan(d, tmp_path, [write("/workspace/answer.json", DEEP)])
    result = run(p, docker_client)
    assert_charged(result, p)
    assert "RecursionError" in (result.error or "") + str(result.extra.get("grading_traceback"))


def test_a_grader_that_hangs_past_its_timeout_is_charged(docker_client, tmp_path) -> None:
    d = task(tmp_path, """
        if raw.strip() == "hang":
            time.sleep(600)
        return [1.0]
    """)
    p = plan(d, tmp_path, [write("/workspace/answer.json", "hang")], grading_timeout_s=3.0)
    assert_charged(run(p, docker_client), p)


def test_a_grader_whose_process_is_killed_is_charged(docker_client, tmp_path) -> None:
    d = task(tmp_path, """
        if raw.strip() == "die":
            os.kill(os.getpid(), 9)
        return [1.0]
    """)
    p = plan(d, tmp_path, [write("/workspace/answer.json", "die")])
    assert_charged(run(p, docker_client), p)


def test_a_grader_that_works_scores_on_the_first_attempt(docker_client, tmp_path) -> None:
    d = task(tmp_path, "return [1.0 if json.loads(raw) == {'ok': True} else 0.0]")
    p = plan(d, tmp_path, [write("/workspace/answer.json", '{"ok": true}')])
    result = run(p, docker_client)
    assert result.status is RunStatus.SCORED and result.score == 1.0
    assert len(json.loads((p.run_dir / "evidence" / "grading-attempts.json").read_text())) == 1


class GradingSandboxFails(DockerProvider):
    """An engine that cannot start the grading sandbox: the harness's failure."""

    async def create(self, spec: SandboxSpec):  # type: ignore[override]
        if spec.labels.get("ale.role") == "grader":
            raise SandboxError("injected: the grading sandbox could not be created")
        return await super().create(spec)


def test_a_grading_environment_that_fails_is_left_out_and_retried(docker_client, tmp_path) -> None:
    d = task(tmp_path, """
        r = await session.run_command("cat /workspace/answer.json")
        return [1.0 if "ok" in str(r) else 0.0]
    """)
    p = plan(d, tmp_path, [write("/workspace/answer.json", "ok")])
    result = run(p, docker_client, GradingSandboxFails(docker_client))
    assert result.status is RunStatus.GRADING_FAILED
    assert result.invalid_attribution is InvalidAttribution.GRADING_ENVIRONMENT
    assert result.headline is None and result.retryable
    assert len(json.loads((p.run_dir / "evidence" / "grading-attempts.json").read_text())) == 1  # not retried in the run


def test_the_counting_policy_in_one_place() -> None:
    charged = (RunStatus.GRADING_FAILED, InvalidAttribution.AFTER_AGENT_START)
    assert headline_score(*charged[:1], None, charged[1]) == 0.0 and not is_retryable(*charged)
    env = (RunStatus.GRADING_FAILED, InvalidAttribution.GRADING_ENVIRONMENT)
    assert headline_score(env[0], None, env[1]) is None and is_retryable(*env)
    assert headline_score(RunStatus.GRADING_FAILED, None, None) is None  # run folders from before the policy


# -- a sandbox the candidate brings down -------------------------------------------
SCORE_ANSWER = "return [1.0 if raw.strip() == 'left before' else 0.0]"


def test_a_sandbox_killed_by_its_candidate_is_graded_as_left(docker_client, tmp_path) -> None:
    """A /tmp as large as the memory (a policy written before tmpfs were fitted):
    filling it takes the memory the init needs, the kernel kills the container.
    The run is the agent's failure, graded on what it wrote before."""
    policy = IsolationPolicy(memory_bytes=256 * MIB).model_copy(  # unfitted on purpose
        update={"tmpfs": (TmpfsMount(options="rw,nosuid,nodev,size=1g"),)})
    d = task(tmp_path, SCORE_ANSWER)
    p = plan(d, tmp_path, [write("/workspace/answer.json", "left before"),
                           shell("head -c 400m /dev/zero > /tmp/fill; sleep 5"),
                           shell("echo still here")], policy=policy, wall_time_s=120)
    result = run(p, docker_client)
    assert result.status is RunStatus.AGENT_FAILED, (result.status, result.error, result.violations)
    assert result.score == 1.0 and "sandbox stopped" in (result.error or "")
    stopped = json.loads((p.run_dir / "evidence" / "sandbox-stopped.json").read_text())
    assert stopped["state"]["Running"] is False and stopped["state"]["Pid"] == 0


def test_a_fitted_tmp_cannot_bring_the_sandbox_down(docker_client, tmp_path) -> None:
    policy = IsolationPolicy(memory_bytes=256 * MIB)  # /tmp fitted: with /dev/shm, half the memory at most
    assert policy.tmpfs[0].size_bytes == 48 * MIB  # 128 MiB, less /dev/shm (64) and SysV (16)
    d = task(tmp_path, SCORE_ANSWER)
    p = plan(d, tmp_path, [shell("head -c 400m /dev/zero > /tmp/fill; df -m /tmp | tail -1"),
                           write("/workspace/answer.json", "left before")], policy=policy)
    result = run(p, docker_client)
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.status, result.error, result.violations)
    assert not (p.run_dir / "evidence" / "sandbox-stopped.json").exists()


def test_tmpfs_are_sized_to_the_memory_and_an_operator_policy_that_does_not_fit_is_refused(tmp_path) -> None:
    from ale.sandbox.policy import GIB, SHM_BYTES

    for mem in (256 * MIB, 1 * GIB, 8 * GIB):
        p = IsolationPolicy(memory_bytes=mem)
        assert sum(t.size_bytes or 0 for t in p.tmpfs) + SHM_BYTES + p.sysv_shm_bytes <= mem // 2 and p.tmpfs_problem() is None
    assert IsolationPolicy().tmpfs[0].size_bytes == GIB  # the default 8 GiB keeps its 1 GiB /tmp
    f = tmp_path / "policy.json"
    f.write_text(json.dumps({"memory_bytes": GIB, "tmpfs": [{"path": "/tmp", "options": "rw,size=1g"}]}))
    with pytest.raises(ValueError, match="size= that fits in 384 MiB"):  # 512, less /dev/shm and SysV (64 each)
        IsolationPolicy.load(f)
