"""A task's software, provided before the seal, used by a real agent inside it.

A task tree we write declares pandas and a Debian tool (jq) on its card; its variant
ships ``input/runtime_env/requirements.txt`` (tomli); its grader runs ``uv run --with
pandas`` in the grading sandbox. A replay agent uses all of it inside the sealed
sandbox, offline: imports, the executable, ``pip install`` of a declared package, a
``uv pip install`` into a venv of its own from the store, then writes its answer.
The run scores 1.0, nop scores 0, both folders verify, and the evidence names the
environment with each need's origin."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import MIB, IsolationPolicy
from ale.status import RunStatus
from tests.conftest import TOOLS_IMAGE

pytestmark = pytest.mark.docker

MAIN = '''
import json
import cua_bench as cb

@cb.tasks_config
def load():
    return [cb.Task(description="Sum column b of /input/table.csv into /workspace/answer.json as {\\"sum\\": N}.",
                    task_id="soft-0", metadata={"input_dir": "/input", "remote_output_dir": "/workspace",
                                                "reference_dir": "/reference", "variant": "base"})]

@cb.evaluate_task
async def evaluate(cfg, session):
    want = json.loads(await session.read_file("/reference/answer.json"))["sum"]
    r = await session.run_command(
        "uv run --with pandas python -c \\"import json, pandas; "
        "print(json.load(open('/workspace/answer.json'))['sum'])\\"", check=False)
    out = (r.get("stdout") or "").strip()
    return [1.0 if out == str(want) else 0.0]
'''

STEPS = [
    {"tool": "shell", "args": {"command": "python3 -c 'import pandas; print(pandas.__version__)'"}},
    {"tool": "shell", "args": {"command": "jq --version"}},
    {"tool": "shell", "args": {"command": "pip install pandas 2>&1 | tail -1"}},
    {"tool": "shell", "args": {"command": "uv venv -q /tmp/mine && uv pip install -q --python /tmp/mine -r /input/runtime_env/requirements.txt "
                                          "&& /tmp/mine/bin/python -c 'import tomli; print(\"tomli\", tomli.__name__)'"}},
    {"tool": "shell", "args": {"command": "mkdir -p ~/.config/tool && echo settings > ~/.config/tool/rc && echo home=$HOME"}},
    {"tool": "shell", "args": {"command": "python3 -c \"import json, pandas; s=int(pandas.read_csv('/input/table.csv')['b'].sum()); "
                                          "json.dump({'sum': s}, open('/workspace/answer.json', 'w'))\" && jq .sum /workspace/answer.json"}},
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("soft")
    task = root / "tasks" / "data" / "pandas_sum"
    task.mkdir(parents=True)
    (task / "main.py").write_text(MAIN)
    (task / "task_card.json").write_text(json.dumps({
        "title": "sum a column", "software": ["pandas", "jq", "uv"], "data_source": "local:../../../data",
        "vm": {"memory_gb": 1, "timeout_s": 300}}))
    variant = root / "data" / "tasks" / "data" / "pandas_sum" / "base"
    (variant / "input" / "runtime_env").mkdir(parents=True)
    (variant / "input" / "table.csv").write_text("a,b\n1,2\n3,4\n5,36\n")
    (variant / "input" / "runtime_env" / "requirements.txt").write_text("tomli\n")
    (variant / "reference").mkdir()
    (variant / "reference" / "answer.json").write_text('{"sum": 42}')
    return task


def _run(task: Path, tmp_path: Path, agent: str, docker_client) -> tuple[RunPlan, object]:
    plan = RunPlan(run_id=f"s-{agent}-{uuid.uuid4().hex[:8]}", task_dir=str(task),
                   agent=AgentSpec(name=agent, config={"steps": STEPS} if agent == "replay" else {}),
                   image=TOOLS_IMAGE, policy=IsolationPolicy(memory_bytes=1024 * MIB), runs_dir=str(tmp_path))
    return plan, asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))


def test_a_replay_agent_uses_the_declared_software_offline_and_scores(tree, tmp_path, docker_client) -> None:
    plan, result = _run(tree, tmp_path, "replay", docker_client)
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.status, result.error, result.violations)
    steps = json.loads((plan.run_dir / "trajectory.json").read_text())["steps"]
    outs = [s["stdout"] + s["stderr"] for s in steps]
    assert all(s["exit_code"] == 0 for s in steps), outs
    assert outs[1].startswith("jq-") and "already satisfied" in outs[2] and "tomli tomli" in outs[3]
    assert "home=/tmp" in outs[4]  # a writable HOME for tools that keep settings there
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
    assert {c["id"] for c in report.checks if c.get("area") == "environment"} == {"environment.image", "environment.record"}
    env = json.loads((plan.run_dir / "evidence" / "environment.json").read_text())
    assert env["kind"] == "environment image" and env["image"].startswith("ale-env:")
    origins = {n["name"]: n["origin"] for n in env["needs"]}
    assert origins["pandas"].startswith("task_card.json") and origins["jq"].startswith("task_card.json")
    assert any("runtime_env" in o for o in origins.values()), origins
    assert "pandas" in {p["name"].lower() for p in env["record"]["python"]["packages"]}  # what the image holds
    assert env["record"]["store"]["digest"] and env["record"]["debian"]
    assert env["missing"] == []


def test_nop_scores_zero_with_the_same_environment(tree, tmp_path, docker_client) -> None:
    plan, result = _run(tree, tmp_path, "nop", docker_client)
    assert result.status is RunStatus.SCORED and result.score == 0.0, (result.status, result.error)
    assert verify_run_dir(plan.run_dir).valid


def test_an_environment_recorded_for_another_image_fails_verify(tree, tmp_path, docker_client) -> None:
    from ale.record import evidence as ev
    from ale.record.signing import load_or_create_signing_key

    plan, result = _run(tree, tmp_path, "nop", docker_client)
    env_path = plan.run_dir / "evidence" / "environment.json"
    env = json.loads(env_path.read_text())
    env["image_id"] = "sha256:" + "0" * 64
    env_path.write_text(json.dumps(env))
    for name in ("manifest.json", "attestation.dsse.json"):
        (plan.run_dir / name).unlink()
    ev.write_manifest_and_sign(plan.run_dir, load_or_create_signing_key(None))  # re-signed: only the claim is wrong
    report = verify_run_dir(plan.run_dir)
    assert not report.valid and any("environment.image" in r for r in report.reasons), report.reasons


def test_env_build_reads_the_variants_runtime_env_and_builds_the_runs_image(tree, tmp_path, docker_client) -> None:
    """`ale env build` reads each variant's input/runtime_env/ from the card's data
    source (here local), so the image it builds ahead is the one the run uses."""
    from typer.testing import CliRunner

    from ale.cli.main import app

    plan, result = _run(tree, tmp_path, "nop", docker_client)
    run_image = json.loads((plan.run_dir / "evidence" / "environment.json").read_text())["image"]
    r = CliRunner().invoke(app, ["env", "build", str(tree), "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    assert row["variants"] == [{"variant": 0, "image": run_image, "provisioned": row["provisioned"], "missing": []}]
    assert "requirements.txt" in row["provisioned"] and "tomli" in row["provisioned"], row
