"""Resume a whole run from its record (real containers, the built-in llm agent, the
fake model upstream on the trusted side): a 30-turn ``ale run`` killed with SIGKILL
once its gateway record holds 20 answers resumes in a fresh sandbox, the recorded
turns replayed without the model, finishes, scores as an uninterrupted run does and
verifies; a run whose replayed tool call returns something else in the new sandbox
(a file named at random) diverges at that turn and says so."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, RunPlan
from ale.record.verify import verify_run_dir
from ale.result import RunResult
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import IsolationPolicy
from ale.status import RunStatus
from tests.conftest import EXAMPLES, TOOLS_IMAGE
from tests.fake_model_api import FakeModelAPI

pytestmark = pytest.mark.docker

TASK = EXAMPLES / "files" / "word_count"
TURNS = 30
KILL_AT = 20
ANSWER = ("printf '{\"words\": %d, \"lines\": %d}' $(wc -w < /input/document.txt) $(wc -l < /input/document.txt) "
          "> /workspace/answer.json && cat /workspace/answer.json")


def turn_command(random_at: int | None = None):
    def command(n: int) -> str:
        if n == TURNS - 1:
            return ANSWER
        if n == random_at:  # a file the agent writes with a random name: another name in a new sandbox
            return "mktemp /workspace/note.XXXXXXXX"
        return f"echo turn {n} >> /workspace/turns.txt && wc -l < /workspace/turns.txt"
    return command


def _config(fake: FakeModelAPI) -> dict:
    return {"base_url": f"{fake.url}/v1", "model": "gpt-fake", "api_key": "test-key", "max_steps": 100}


def _responses(run_dir: Path) -> int:
    path = run_dir / "agent" / "gateway" / "records.jsonl"
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"type":"response"' in line)


def _kill_at(tmp_path: Path, fake: FakeModelAPI, n: int) -> Path:
    """``ale run`` as a subprocess, SIGKILLed (its whole group) once its record holds ``n`` answers."""
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "ale.cli", "run", str(TASK), "--agent", "llm", "--agent-config", json.dumps(_config(fake)),
            "--runs-dir", str(runs), "--signing-key", str(tmp_path / "key.pem"), "--image", TOOLS_IMAGE]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    run_dir: Path | None = None
    try:
        while time.monotonic() < deadline:
            dirs = [d for d in runs.iterdir() if d.is_dir() and not d.name.startswith(".")] if runs.is_dir() else []
            run_dir = dirs[0] if dirs else None
            if run_dir is not None and _responses(run_dir) >= n:
                break
            if proc.poll() is not None:
                raise AssertionError(f"ale run ended before turn {n}: {proc.stdout.read().decode() if proc.stdout else ''}")
            time.sleep(0.05)
        else:
            raise AssertionError(f"no {n} answers in time")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert run_dir is not None and not (run_dir / "result.json").exists()
    return run_dir


def _cleanup(docker_client, source: Path) -> None:
    """What a killed ``ale run`` leaves (``ale run --resume-from`` clears it): its sandbox, its scratch mounts."""
    from ale.sandbox.scratch import release_scratch

    DockerProvider(docker_client).remove_managed(run_id=source.name)
    release_scratch(source.parent / ".scratch" / source.name)


def _resume_plan(tmp_path: Path, source: Path, fake: FakeModelAPI) -> RunPlan:
    old = RunPlan.model_validate_json((source / "plan.json").read_text())
    return old.model_copy(update={"run_id": f"resumed-{uuid.uuid4().hex[:10]}", "runs_dir": str(tmp_path / "resumed"),
                                  "resume_from": str(source)})


def test_a_run_killed_at_turn_20_resumes_replays_its_turns_finishes_scores_and_verifies(docker_client, tmp_path):
    fake = FakeModelAPI(turns=TURNS, turn_command=turn_command(), latency_s=0.15).start()
    try:
        source = _kill_at(tmp_path, fake, KILL_AT)
        recorded = _responses(source)
        assert recorded >= KILL_AT
        before = fake.model_calls()
        # ale run --resume-from clears what the killed run left (its sandbox, its scratch) and resumes it.
        proc = subprocess.run([sys.executable, "-m", "ale.cli", "run", "--resume-from", str(source), "--runs-dir", str(tmp_path / "resumed")],
                              capture_output=True, text=True, timeout=300)
        live = fake.model_calls() - before
    finally:
        fake.stop()
        _cleanup(docker_client, source)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    result = RunResult.model_validate_json((run_dir / "result.json").read_text())
    plan = RunPlan.model_validate_json((run_dir / "plan.json").read_text())
    assert plan.resume_from == str(source.resolve()) and plan.agent == RunPlan.model_validate_json((source / "plan.json").read_text()).agent
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    # The recorded turns never reached the model: only turns past them did (30 tool calls, then "done").
    assert live == TURNS + 1 - recorded, (live, recorded)
    resumed = result.resumed
    assert resumed["replayed_turns"] == recorded and resumed["diverged_at"] is None and resumed["live_from"] == recorded + 1
    assert resumed["from_run"] == str(source.resolve()) and resumed["reexecuted_calls"] == recorded
    # The replayed turns cost nothing here; the source's answers are its attempt's.
    assert result.extra["billing"]["total"]["requests"] == live
    assert resumed["source_usage"]["requests"] == recorded
    # Each tool call was executed again in the new sandbox: every turn's line is there once.
    steps = json.loads((plan.run_dir / "trajectory.json").read_text())["steps"]
    assert len(steps) == TURNS and all(s["ok"] for s in steps)
    assert steps[TURNS - 2]["stdout"].strip() == str(TURNS - 1)
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
    assert {c["id"] for c in report.checks} >= {"gateway.resume_source", "gateway.resume_unbilled", "gateway.resume_result"}

    # An uninterrupted run of the same agent and model scores the same.
    fresh = FakeModelAPI(turns=TURNS, turn_command=turn_command()).start()
    try:
        whole = RunPlan(run_id=f"whole-{uuid.uuid4().hex[:10]}", task_dir=str(TASK), agent=AgentSpec(name="llm", config=_config(fresh)),
                        image=TOOLS_IMAGE, policy=IsolationPolicy(), runs_dir=str(tmp_path / "whole"), signing_key=str(tmp_path / "key.pem"))
        uninterrupted = asyncio.run(execute_run(whole, provider=DockerProvider(docker_client)))
    finally:
        fresh.stop()
    assert uninterrupted.status is RunStatus.SCORED and uninterrupted.scores == result.scores == [1.0, 1.0]


def test_a_replayed_tool_call_that_returns_something_else_diverges_at_that_turn(docker_client, tmp_path):
    fake = FakeModelAPI(turns=TURNS, turn_command=turn_command(random_at=5), latency_s=0.05).start()
    try:
        source = _kill_at(tmp_path, fake, 10)
        _cleanup(docker_client, source)
        before = fake.model_calls()
        plan = _resume_plan(tmp_path, source, fake)
        result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
        live = fake.model_calls() - before
    finally:
        fake.stop()
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    resumed = result.resumed
    # Turn 6 carries the result of call 5 (mktemp): another random name, so turn 6 goes live.
    assert resumed["replayed_turns"] == 6 and resumed["diverged_at"] == 7, resumed
    assert live == TURNS + 1 - resumed["replayed_turns"]
    assert "tool result 6" in resumed["divergence"] and "/workspace/note." in resumed["divergence"], resumed
    records = [json.loads(x) for x in (plan.run_dir / "agent" / "gateway" / "records.jsonl").read_text().splitlines()]
    went = [r for r in records if r["type"] == "resume.live"]
    assert len(went) == 1 and went[0]["why"] == "diverged" and went[0]["digest"] != went[0]["recorded_digest"]
    assert went[0]["diff"].count("/workspace/note.") == 2
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons

    # A result that hides the divergence, re-sealed with the run's own key: ale verify still catches it.
    from ale.record import evidence as ev
    from ale.record.signing import load_or_create_signing_key

    doc = json.loads((plan.run_dir / "result.json").read_text())
    doc["resumed"].update(diverged_at=None, divergence=None, replayed_turns=TURNS)
    (plan.run_dir / "result.json").write_text(json.dumps(doc))
    for name in ("manifest.json", "attestation.dsse.json"):
        (plan.run_dir / name).unlink()
    ev.write_manifest_and_sign(plan.run_dir, load_or_create_signing_key(Path(plan.signing_key or "")))
    report = verify_run_dir(plan.run_dir)
    assert not report.valid and "gateway.resume_result" in {c["id"] for c in report.checks if c["ok"] is not True}, report.reasons


def test_ale_exp_run_resume_turns_continues_an_attempt_killed_mid_run(docker_client, tmp_path):
    """``ale exp run`` SIGKILLed at turn 20; ``ale exp run --resume-turns`` moves the folder aside
    as before and continues that attempt from its record; the report marks it resumed."""
    from ale.sandbox.docker import remove_containers

    name = f"resume-{uuid.uuid4().hex[:8]}"
    fake = FakeModelAPI(turns=TURNS, turn_command=turn_command(), latency_s=0.15).start()
    exp = tmp_path / "exp.yaml"
    exp.write_text(json.dumps({
        "name": name, "tasks_root": str(TASK.parent), "output": "out", "concurrency": 1,
        "agents": [{"name": "llm", "config": _config(fake)}], "tasks": [{"path": TASK.name, "variants": [0]}],
    }))
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "ale.cli.exp", "run", str(exp), "--plain"]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
        deadline = time.monotonic() + 240
        try:
            while time.monotonic() < deadline:
                dirs = list((out / "runs").glob("*-a1")) if (out / "runs").is_dir() else []
                if dirs and _responses(dirs[0]) >= KILL_AT:
                    break
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        before = fake.model_calls()
        second = subprocess.run([*argv, "--resume-turns"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        live = fake.model_calls() - before
    finally:
        fake.stop()
        remove_containers(docker_client, experiment=name)
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stderr
    [run_dir] = list((out / "runs").glob("*-a1"))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "scored" and result["scores"] == [1.0, 1.0], result.get("error")
    resumed = result["resumed"]
    [source] = list((out / ".incomplete").iterdir())
    assert resumed["from_run"] == str(source.resolve()) and resumed["diverged_at"] is None
    assert live == TURNS + 1 - resumed["replayed_turns"] and resumed["replayed_turns"] >= KILL_AT
    report = json.loads((out / "report.json").read_text())
    assert report["resumed"]["runs"] == 1 and report["resumed"]["replayed_turns"] == resumed["replayed_turns"]
    assert "resumed" in (out / "report.html").read_text()
    # Every attempt's spend: the interrupted attempt's answers (kept) and the resumed run's live ones, each once.
    assert report["usage_all_attempts"]["requests"] == TURNS + 1
    assert verify_run_dir(run_dir).valid
    from ale.report.verify_experiment import verify_experiment

    checked = verify_experiment(out)
    assert not checked.problems, checked.problems
    shown = subprocess.run([sys.executable, "-m", "ale.cli.exp", "report", str(out)], capture_output=True, text=True, timeout=120)
    assert "1 resumed run(s)" in shown.stdout and f"{resumed['replayed_turns']} replayed" in shown.stdout, shown.stdout


def test_a_bridge_harness_resumes_from_its_record_without_knowing(docker_client, tmp_path):
    """The same through a bridge harness (the stand-in: its own agent loop over Anthropic
    Messages, its tool calls through the MCP bridge): the gateway replays, the harness cannot tell."""
    from tests.test_gateway_runs import _standin

    turns = 12
    fake = FakeModelAPI(turns=turns, latency_s=0.1, turn_command=lambda n: ANSWER if n == turns - 1 else
                        f"echo turn {n} >> /workspace/turns.txt && wc -l < /workspace/turns.txt").start()
    runs = tmp_path / "runs"
    cfg = _standin("loop", {}, fake)
    argv = [sys.executable, "-m", "ale.cli", "run", str(TASK), "--agent", "command", "--agent-config", json.dumps(cfg),
            "--runs-dir", str(runs), "--signing-key", str(tmp_path / "key.pem"), "--image", TOOLS_IMAGE]
    source: Path | None = None
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 240
        try:
            while time.monotonic() < deadline:
                dirs = [d for d in runs.iterdir() if d.is_dir() and not d.name.startswith(".")] if runs.is_dir() else []
                source = dirs[0] if dirs else None
                if source is not None and _responses(source) >= 6:
                    break
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        assert source is not None
        _cleanup(docker_client, source)
        recorded = _responses(source)
        before = fake.model_calls("/v1/messages")
        plan = _resume_plan(tmp_path, source, fake)
        result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
        live = fake.model_calls("/v1/messages") - before
    finally:
        fake.stop()
    assert result.status is RunStatus.SCORED and result.scores == [1.0, 1.0], (result.error, result.violations)
    resumed = result.resumed
    assert resumed["replayed_turns"] == recorded and resumed["diverged_at"] is None
    assert live == turns + 1 - recorded
    assert "LOOP turn 13: 0 call(s)" in (plan.run_dir / "agent" / "stdout.log").read_text()
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons


@pytest.mark.requires(__import__("shutil").which("npm") is not None, "native mode fetches the harness with the host's npm")
def test_a_native_claude_code_run_replays_from_its_record_without_knowing(docker_client, tmp_path):
    """A native harness (Claude Code inside the sandbox, its only way out the exec channel to the
    gateway): every recorded turn of its run is answered from the record, its own tool calls (Bash,
    Write) run again in the new sandbox, the model is not called, and the run scores and verifies."""
    from tests.test_harness_native import SHELL_THEN_WRITE
    from tests.test_harness_native import _plan as native_plan

    api = FakeModelAPI(script={"steps": SHELL_THEN_WRITE["claude-code"]}).start()
    try:
        plan = native_plan(tmp_path, api)
        source = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
        calls = api.model_calls("/v1/messages")
        again = plan.model_copy(update={"run_id": f"resumed-{uuid.uuid4().hex[:10]}", "resume_from": str(plan.run_dir)})
        result = asyncio.run(execute_run(again, provider=DockerProvider(docker_client)))
        live = api.model_calls("/v1/messages") - calls
    finally:
        api.stop()
    assert source.status is RunStatus.SCORED and result.status is RunStatus.SCORED and result.score == 1.0, result.error
    resumed = result.resumed
    assert live == 0 and resumed["replayed_turns"] == calls and resumed["live_from"] is None and resumed["reexecuted_calls"] == 2
    assert result.extra["billing"]["total"] == {}  # nothing billed: every answer was replayed
    steps = json.loads((again.run_dir / "trajectory.json").read_text())["steps"]
    assert [s["tool"] for s in steps] == ["Bash", "Write"] and all(s["ok"] for s in steps)
    report = verify_run_dir(again.run_dir)
    assert report.valid, report.reasons
