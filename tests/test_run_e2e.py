"""Whole runs through the lifecycle, on real containers: the claims of a sealed run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, Limits, RunPlan
from ale.runs.lifecycle import PreflightError, execute_run
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import IsolationPolicy
from ale.status import RunStatus
from tests.conftest import EXAMPLES, REPO, TOOLS_IMAGE, our_containers

pytestmark = pytest.mark.docker

POLICY = IsolationPolicy(memory_bytes=512 * 1024**2)


def plan_for(task_dir: Path, runs_dir: Path, agent: str = "oracle", variant: int = 0, steps: list | None = None,
             data: str | None = None, image: str = TOOLS_IMAGE, wall: float | None = None) -> RunPlan:
    config = {"steps": steps} if steps is not None else {}
    return RunPlan(
        run_id=f"t-{uuid.uuid4().hex[:12]}",
        task_dir=str(task_dir),
        variant=variant,
        agent=AgentSpec(name=agent, config=config),
        data_source=data,
        image=image,
        policy=POLICY,
        limits=Limits(wall_time_s=wall),
        runs_dir=str(runs_dir),
    )


def run(plan: RunPlan, client):
    result = asyncio.run(execute_run(plan, provider=DockerProvider(client)))
    assert our_containers(client, **{"ale.run_id": plan.run_id}) == [], "a container outlived its run"
    assert not (Path(plan.runs_dir) / ".scratch" / plan.run_id).exists(), "scratch folder left behind"
    return result


def shell(cmd: str) -> dict:
    return {"tool": "shell", "args": {"command": cmd}}


def trajectory(plan: RunPlan) -> list[dict]:
    return json.loads((plan.run_dir / "trajectory.json").read_text())["steps"]


@pytest.mark.parametrize("task", ["files/word_count", "physics/cloth_sim", "secrets/echo_secret"])
def test_examples_oracle_scores_one_and_nop_zero(task, docker_client, tmp_path):
    from ale.record.verify import verify_run_dir

    oracle_plan = plan_for(EXAMPLES / task, tmp_path)
    oracle = run(oracle_plan, docker_client)
    assert oracle.status is RunStatus.SCORED, (oracle.error, oracle.violations)
    assert oracle.scores and all(s == 1.0 for s in oracle.scores)
    nop_plan = plan_for(EXAMPLES / task, tmp_path, agent="nop")
    nop = run(nop_plan, docker_client)
    assert nop.status is RunStatus.SCORED, (nop.error, nop.violations)
    assert nop.score == 0.0
    # Every example run proves it was sealed, re-checked from its folder alone.
    for p in (oracle_plan, nop_plan):
        report = verify_run_dir(p.run_dir)
        assert report.valid, report.reasons


@pytest.fixture
def marker_task(tmp_path) -> tuple[Path, str]:
    """A task whose reference alone holds a unique marker; the agent's score is
    1.0 when its search output says 'none'."""
    marker = f"REFMARK_{uuid.uuid4().hex}"
    root = tmp_path / "tree"
    task = root / "tasks" / "probe" / "marker"
    task.mkdir(parents=True)
    var = root / "data" / "tasks" / "probe" / "marker" / "v0"
    (var / "input").mkdir(parents=True)
    (var / "reference").mkdir(parents=True)
    (var / "input" / "readme.txt").write_text("nothing to see\n")
    (var / "reference" / "secret.txt").write_text(marker + "\n")
    (task / "main.py").write_text(textwrap.dedent('''
        import cua_bench as cb

        @cb.tasks_config
        def load():
            return [cb.Task(description="search", task_id="probe/marker/v0", metadata={"variant": "v0"})]

        @cb.evaluate_task
        async def evaluate(cfg, session):
            ref = (await session.read_file("/reference/secret.txt")).strip()
            ok = await session.file_exists("/workspace/found.txt")
            found = (await session.read_file("/workspace/found.txt")) if ok else "missing"
            return [1.0 if ref and ref not in found and found.strip() == "none" else 0.0]
    '''))
    (task / "task_card.json").write_text(json.dumps({"data_source": "local:../../../data", "vm": {"timeout_s": 120}}))
    return task, marker


def test_reference_is_absent_from_the_candidate_container(marker_task, docker_client, tmp_path):
    task, marker = marker_task
    half = len(marker) // 2
    a, b = marker[:half], marker[half:]
    search = (
        f"A={a}; B={b}; "
        "hits=$(grep -rlsF \"$A$B\" / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -5); "
        "envhits=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -cF \"$A$B\"); "
        "if [ -z \"$hits\" ]; then echo none > /workspace/found.txt; else echo \"$hits\" > /workspace/found.txt; fi; "
        "echo \"files=[$hits] env=$envhits\""
    )
    plan = plan_for(task, tmp_path / "runs", agent="replay", steps=[shell(search)])
    result = run(plan, docker_client)
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores == [1.0]
    step = trajectory(plan)[0]
    # grep's own /proc entries are excluded above; the only match it could see there is itself.
    assert "files=[]" in step["stdout"], step["stdout"]
    assert marker not in (plan.run_dir / "deliverables" / "found.txt").read_text()


def test_background_process_cannot_change_deliverables(docker_client, tmp_path):
    steps = [
        shell("echo early > /workspace/out.txt"),
        shell("nohup sh -c 'sleep 2; echo late >> /workspace/out.txt' >/dev/null 2>&1 &"),
        shell("setsid sh -c 'sleep 2; echo late2 >> /workspace/out.txt' >/dev/null 2>&1 &"),
    ]
    plan = plan_for(EXAMPLES / "secrets" / "echo_secret", tmp_path, agent="replay", steps=steps)
    result = run(plan, docker_client)
    assert result.status is RunStatus.SCORED
    import time

    time.sleep(3)
    assert (plan.run_dir / "deliverables" / "out.txt").read_text() == "early\n"
    events = [json.loads(line) for line in (plan.run_dir / "events.jsonl").read_text().splitlines()]
    killed = next(e for e in events if e["type"] == "agent.processes_killed")
    assert killed["data"]["remaining"] == 0


def test_attacks_from_inside_fail_and_the_run_is_graded(docker_client, tmp_path, monkeypatch):
    judge_key = f"sk-judge-{uuid.uuid4().hex}"
    monkeypatch.setenv("ALE_JUDGE_API_KEY", judge_key)
    steps = [
        shell("echo tampered > /input/secret.txt"),
        shell("touch /input/new-file"),
        shell("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -iE 'key|token|secret|passw|aws|google' ; echo exit=$?"),
        shell("cat /proc/net/dev; echo ROUTES; cat /proc/net/route; echo V6; cat /proc/net/ipv6_route; echo END"),
        shell("cp /input/secret.txt /workspace/secret.txt"),
    ]
    plan = plan_for(EXAMPLES / "secrets" / "echo_secret", tmp_path, agent="replay", steps=steps)
    result = run(plan, docker_client)
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores == [1.0]
    t = trajectory(plan)
    assert t[0]["exit_code"] != 0 and "Read-only file system" in t[0]["stderr"]
    assert t[1]["exit_code"] != 0
    assert "exit=1" in t[2]["stdout"] and judge_key not in json.dumps(t)
    net = t[3]["stdout"]
    ifaces = [line.split(":")[0].strip() for line in net.split("ROUTES")[0].splitlines()[2:] if ":" in line]
    assert ifaces == ["lo"], net
    v4 = net.split("ROUTES")[1].split("V6")[0].strip().splitlines()
    assert len(v4) == 1 and v4[0].startswith("Iface"), v4  # the header only: no IPv4 route at all
    v6 = net.split("V6")[1].split("END")[0].strip().splitlines()
    assert all(r.split()[-1] == "lo" for r in v6), v6  # loopback's own entries only
    staged = json.loads((plan.run_dir / "evidence" / "input-after-run.json").read_text())
    assert set(staged["files"]) == {"README.md", "secret.txt"} or "new-file" not in staged["files"]


def test_agent_wall_time_ends_the_turn_and_still_grades(docker_client, tmp_path):
    steps = [shell("cp /input/secret.txt /workspace/secret.txt"), shell("sleep 600")]
    plan = plan_for(EXAMPLES / "secrets" / "echo_secret", tmp_path, agent="replay", steps=steps, wall=3)
    result = run(plan, docker_client)
    assert result.status is RunStatus.TIMEOUT
    assert result.scores == [1.0]


# -- bad input: a clear error, nothing left behind ---------------------------------
def _ale(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ale.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)


def test_a_relative_runs_dir_works_for_the_grading_sandbox_too(docker_client, tmp_path):
    """`--runs-dir runs` from the current folder: every bind-mount source is absolute,
    the grading sandbox's scratch folders included (found running real ALE tasks)."""
    task = tmp_path / "tasks" / "graded"
    task.mkdir(parents=True)
    (task / "main.py").write_text(textwrap.dedent("""\
        import cua_bench as cb

        @cb.tasks_config
        def load():
            return [cb.Task(description="nothing to do")]

        @cb.evaluate_task
        async def evaluate(cfg, session):
            r = await session.run_command("echo graded > /tmp/x && cat /tmp/x")
            return [1.0 if r["stdout"].strip() == "graded" else 0.0]
    """))
    p = _ale("run", "tasks/graded", "--agent", "nop", "--runs-dir", "runs", "--image", TOOLS_IMAGE, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    run_dir = tmp_path / p.stdout.strip().splitlines()[-1]
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["status"], result["scores"]) == ("scored", [1.0]), result
    assert not list((tmp_path / "runs" / ".scratch").glob("*")), "scratch folder left behind"
    assert _ale("verify", str(run_dir)).returncode == 0


def test_a_relative_data_path_on_the_command_line_is_the_current_folders(docker_client, tmp_path):
    """`--data local:data` names ./data, not a folder inside the task."""
    (tmp_path / "data" / "tasks" / "word_count" / "0" / "input").mkdir(parents=True)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    p = _ale("run", str(EXAMPLES / "files" / "word_count"), "--agent", "nop", "--data", "local:../data",
             "--runs-dir", "runs", "--image", TOOLS_IMAGE, cwd=cwd)
    run_dir = cwd / p.stdout.strip().splitlines()[-1]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["data_source"] == f"local:{tmp_path.resolve() / 'data'}"


def _ale_containers(client) -> set[str]:
    return {c.id for c in our_containers(client)}


@pytest.mark.parametrize(
    "case",
    ["syntax_error", "no_evaluate", "empty_load", "variant_out_of_range", "image_missing", "no_docker"],
)
def test_bad_input_is_a_clear_error(case, docker_client, tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    good = "import cua_bench as cb\n@cb.tasks_config\ndef load():\n    return [cb.Task(description='x')]\n@cb.evaluate_task\nasync def evaluate(c, s):\n    return [0.0]\n"
    body, args, env, expect = good, [], None, ""
    if case == "syntax_error":
        body, expect = "def load(:\n", "main.py"
    elif case == "no_evaluate":
        body, expect = "import cua_bench as cb\n@cb.tasks_config\ndef load():\n    return [cb.Task(description='x')]\n", "evaluate"
    elif case == "empty_load":
        body, expect = good.replace("[cb.Task(description='x')]", "[]"), "load()"
    elif case == "variant_out_of_range":
        args, expect = ["--variant", "3"], "variant 3 does not exist"
    elif case == "image_missing":
        args, expect = ["--image", "ale-no-such-image:none"], "docker pull ale-no-such-image:none"
    elif case == "no_docker":
        env, expect = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}, "Docker engine"
    (task / "main.py").write_text(body)
    before = _ale_containers(docker_client)
    p = _ale("run", str(task), "--agent", "nop", "--runs-dir", str(tmp_path / "runs"), *args, env=env)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert expect in p.stderr, p.stderr
    assert _ale_containers(docker_client) - before == set()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_missing_data_is_an_infrastructure_error_naming_the_folder(docker_client, tmp_path):
    plan = plan_for(EXAMPLES / "files" / "word_count", tmp_path, agent="nop", data=f"local:{tmp_path}/nowhere")
    result = run(plan, docker_client)
    assert result.status is RunStatus.INFRASTRUCTURE_ERROR
    assert "nowhere" in (result.error or "")
    assert not result.retryable  # another attempt finds the same: recorded once


def test_missing_variant_folder_is_a_clear_error(docker_client, tmp_path):
    data = tmp_path / "data"
    (data / "tasks" / "files" / "word_count").mkdir(parents=True)
    plan = plan_for(EXAMPLES / "files" / "word_count", tmp_path, agent="nop", data=f"local:{data}")
    result = run(plan, docker_client)
    assert result.status is RunStatus.INFRASTRUCTURE_ERROR
    assert "essay" in (result.error or ""), result.error
    assert not result.retryable


def test_preflight_error_creates_nothing(docker_client, tmp_path):
    plan = plan_for(EXAMPLES / "files" / "word_count", tmp_path, agent="nop", variant=9)
    with pytest.raises(PreflightError, match="out of range"):
        asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert not plan.run_dir.exists()


def test_fork_bomb_is_contained_and_the_run_still_graded(docker_client, tmp_path):
    """Zombies of a fork bomb hold pid slots unless PID 1 reaps them: after the kill,
    the after-run probes must still be able to fork, so the run stays valid."""
    steps = [
        shell("cp /input/secret.txt /workspace/secret.txt"),
        {"tool": "shell", "args": {"command": "b() { b & b & }; b", "timeout": 5}},
    ]
    plan = plan_for(EXAMPLES / "secrets" / "echo_secret", tmp_path, agent="replay", steps=steps)
    result = run(plan, docker_client)
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores == [1.0]
    probes = (plan.run_dir / "evidence" / "probes-after.txt").read_text()
    assert "Cannot fork" not in probes


def test_capped_workspace_stops_a_disk_filling_agent(docker_client, tmp_path):
    from ale.sandbox.scratch import mounts_under

    steps = [
        shell("cp /input/secret.txt /workspace/secret.txt"),
        shell("head -c 8000000 /dev/zero > /workspace/fill.bin; echo exit=$?"),
    ]
    plan = plan_for(EXAMPLES / "secrets" / "echo_secret", tmp_path, agent="replay", steps=steps)
    plan = plan.model_copy(update={"limits": plan.limits.model_copy(update={"workspace_max_bytes": 2 * 1024 * 1024})})
    result = run(plan, docker_client)
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores == [1.0]
    fill = trajectory(plan)[1]
    assert "No space left on device" in fill["stderr"] and "exit=1" in fill["stdout"]
    assert mounts_under(tmp_path) == []  # the tmpfs went with the run
    from ale.record.verify import verify_run_dir

    assert verify_run_dir(plan.run_dir).valid


def test_an_error_with_brackets_is_printed_as_written(docker_client, tmp_path):
    """A grader's message is any text: "[/output/x]" once crashed the status line's markup."""
    task = tmp_path / "bracketed"
    task.mkdir()
    (task / "main.py").write_text(textwrap.dedent("""\
        import cua_bench as cb

        @cb.tasks_config
        def load():
            return [cb.Task(description="nothing to do", task_id="[b]id[/b]")]

        @cb.evaluate_task
        async def evaluate(cfg, session):
            raise RuntimeError("[check] cannot read [/output/network.net.xml] [bold]")
    """))
    p = _ale("run", str(task), "--agent", "nop", "--runs-dir", str(tmp_path / "runs"), "--image", TOOLS_IMAGE)
    assert "Traceback" not in p.stderr and "MarkupError" not in p.stderr, p.stderr
    assert "[check] cannot read [/output/network.net.xml] [bold]" in p.stderr
    assert "task=[b]id[/b]" in p.stderr
    assert Path(p.stdout.strip().splitlines()[-1]).is_dir()


def test_a_copy_limit_keeps_the_answer_beside_a_deep_cache_and_says_so(docker_client, tmp_path):
    """A folder's files are copied before its subfolders; what a limit left out is a
    warning in result.json and on the status line, not a silent 0."""
    steps = [
        shell("mkdir -p /workspace/a_cache && for i in $(seq 20); do echo $i > /workspace/a_cache/f$i; done"),
        shell("cp /input/secret.txt /workspace/secret.txt"),
    ]
    plan = plan_for(EXAMPLES / "secrets" / "echo_secret", tmp_path, agent="replay", steps=steps)
    plan = plan.model_copy(update={"limits": Limits(deliverable_max_files=5)})
    result = run(plan, docker_client)
    assert result.status is RunStatus.SCORED and result.scores == [1.0], (result.error, result.violations)
    (warning,) = result.extra["warnings"]
    assert "16 entries of the workspace not copied at a limit (file count cap of 5 reached" in warning


def test_the_grader_works_on_a_writable_copy_of_the_output(docker_client, tmp_path):
    """ALE graders delete, regenerate and re-run files in output/ (as on ALE's VM): the
    grading sandbox and the host calls share a writable working copy; the signed
    deliverables stay as the candidate left them."""
    task = tmp_path / "regrade"
    task.mkdir()
    (task / "main.py").write_text(textwrap.dedent("""\
        import cua_bench as cb

        @cb.tasks_config
        def load():
            return [cb.Task(description="write 'first' to /workspace/answer.txt", metadata={"out": "/workspace"})]

        @cb.solve_task(split="train")
        async def solve(cfg, session):
            await session.write_file("/workspace/answer.txt", "first")
            await session.run_command("mkdir -p /workspace/sub && echo keep > /workspace/sub/k.txt && chmod 440 /workspace/sub/k.txt",
                                      check=True)

        @cb.evaluate_task
        async def evaluate(cfg, session):
            r = await session.run_command(
                "rm /workspace/answer.txt && echo regenerated > /workspace/answer.txt && mkdir /workspace/artifacts "
                "&& cat /workspace/sub/k.txt && stat -c %a /workspace/sub/k.txt")
            seen = (await session.read_file("/workspace/answer.txt")).strip()
            await session.write_file("/workspace/artifacts/host.txt", "from the host")
            back = await session.run_command("cat /workspace/artifacts/host.txt")
            ok = r["return_code"] == 0 and r["stdout"].split() == ["keep", "440"] and seen == "regenerated"  # modes kept
            return [1.0 if ok and back["stdout"] == "from the host" else 0.0]
    """))
    plan = plan_for(task, tmp_path / "runs", agent="oracle")
    result = run(plan, docker_client)
    assert result.status is RunStatus.SCORED and result.scores == [1.0], (result.error, result.violations)
    assert (plan.run_dir / "deliverables" / "answer.txt").read_text() == "first"
    assert not (plan.run_dir / "deliverables" / "artifacts").exists()
    assert _ale("verify", str(plan.run_dir)).returncode == 0
