"""A score the candidate cannot bend: no void, no reroll; invalid runs attributed
and counted; the workspace cannot fill the host's disk. Real containers."""

from __future__ import annotations

import asyncio
import json
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ale.isolation import rules
from ale.isolation.checks import Check
from ale.record.verify import verify_run_dir
from ale.report import aggregate
from ale.result import RunResult
from ale.runs.experiment import load_experiment
from ale.runs.orchestrator import Orchestrator
from ale.runs.store import runs_root
from ale.status import InvalidAttribution, RunStatus
from tests.conftest import EXAMPLES, TOOLS_IMAGE, our_containers

WORD_COUNT = EXAMPLES / "files" / "word_count"


def _experiment(tmp: Path, name: str, script: Path | None = None, agent: str = "replay", extra: str = "") -> Path:
    cfg = f", config: {{script: {script}}}" if script else ""
    f = tmp / f"{name}.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: {name}
        agents: [{{name: {agent}{cfg}}}]
        tasks: [{{path: {WORD_COUNT}, variants: [0]}}]
        environment:
          image: {TOOLS_IMAGE}
          policy: {{cpus: 1, memory_bytes: 536870912}}
        retry: {{max_attempts: 3, backoff_initial_s: 0, backoff_max_s: 0}}
        output: {tmp / name}
        {extra}
    """))
    return f


def _run_experiment(path: Path) -> list[RunResult]:
    exp = load_experiment(path)
    asyncio.run(Orchestrator(exp).run())
    root = runs_root(exp.output_dir)
    return [RunResult.model_validate_json((d / "result.json").read_text()) for d in sorted(root.iterdir()) if (d / "result.json").is_file()]


def _script(tmp: Path, *commands: str) -> Path:
    p = tmp / "calls.json"
    p.write_text(json.dumps([{"tool": "shell", "args": {"command": c}} for c in commands]))
    return p


# -- the candidate cannot void its own run ----------------------------------------
@pytest.mark.docker
def test_a_candidate_that_locks_its_workspace_and_fills_tmp_still_counts(tmp_path, docker_client) -> None:
    script = _script(
        tmp_path,
        "echo '{\"words\": 1, \"lines\": 1}' > /workspace/answer.json",
        "head -c 64m /dev/zero > /tmp/fill 2>/dev/null; i=0; while [ $i -lt 2000 ]; do : > /tmp/f$i; i=$((i+1)); done; true",
        "chmod 000 /workspace",
    )
    results = _run_experiment(_experiment(tmp_path, "void", script))
    assert len(results) == 1, [r.run_id for r in results]  # exactly one attempt: nothing to reroll
    (r,) = results
    assert r.status in (RunStatus.SCORED, RunStatus.AGENT_FAILED), (r.status, r.error, r.violations)
    assert r.score is not None and r.score < 1.0  # it failed, and its failure counts
    run_dir = runs_root(tmp_path / "void") / r.run_id
    assert verify_run_dir(run_dir).valid
    assert our_containers(docker_client, **{"ale.experiment": "void"}) == []


# -- attribution ---------------------------------------------------------------------
def _inject(monkeypatch, target: str) -> None:
    """A sealed container whose inspect check fails in one phase (`before` or `after`)."""
    real = rules.judge

    def check(moment, **kw):
        checks = real(moment, **kw)
        if moment == target and "inspect" in kw:
            checks.append(Check("test.drift", False, "sealed", "drifted", "injected by the test"))
        return checks

    monkeypatch.setattr(rules, "judge", check)


@pytest.mark.docker
def test_a_violation_after_the_agent_started_is_charged_to_it_and_never_retried(tmp_path, docker_client, monkeypatch) -> None:
    _inject(monkeypatch, "after")
    results = _run_experiment(_experiment(tmp_path, "after", agent="oracle"))
    assert len(results) == 1
    (r,) = results
    assert r.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT
    assert r.invalid_attribution is InvalidAttribution.AFTER_AGENT_START and r.headline == 0.0 and not r.retryable
    assert verify_run_dir(runs_root(tmp_path / "after") / r.run_id).valid


@pytest.mark.docker
def test_a_seal_not_proven_before_the_agent_is_the_harness_s_and_retried(tmp_path, docker_client, monkeypatch) -> None:
    _inject(monkeypatch, "before")
    results = _run_experiment(_experiment(tmp_path, "before", agent="oracle"))
    assert [r.attempt for r in results] == [1, 2, 3]
    assert all(r.invalid_attribution is InvalidAttribution.BEFORE_AGENT and r.headline is None for r in results)
    assert all(not (runs_root(tmp_path / "before") / r.run_id / "trajectory.json").exists() for r in results)


# -- the workspace cannot fill the disk -----------------------------------------------
@pytest.mark.docker
def test_the_watchdog_ends_a_turn_that_overfills_the_workspace(tmp_path, docker_client, monkeypatch) -> None:
    # The default limit (a plain host folder watched; a tmpfs cap would give ENOSPC first).
    monkeypatch.setattr("ale.runs.watchdog.DEFAULT_MAX_BYTES", 8388608)
    script = _script(tmp_path, "head -c 40m /dev/urandom > /workspace/big; sleep 60")
    exp = _experiment(tmp_path, "disk", script, extra="limits: {wall_time_s: 120}")
    t0 = datetime.now(UTC)
    (r,) = _run_experiment(exp)
    assert (datetime.now(UTC) - t0).total_seconds() < 50  # the sleep did not run out
    assert r.status is RunStatus.AGENT_FAILED and "over its limit of 8388608" in (r.error or ""), r.error
    run_dir = runs_root(tmp_path / "disk") / r.run_id
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e.get("type") == "workspace.limit" for e in events), events
    assert verify_run_dir(run_dir).valid


# -- counting ------------------------------------------------------------------------------
def _result(run_id: str, agent: str, task: str, status: RunStatus, score: float | None,
            attribution: InvalidAttribution | None = None) -> RunResult:
    now = datetime.now(UTC)
    return RunResult(run_id=run_id, task_id=task, task_dir=f"/t/{task}", variant=0, agent=agent, status=status,
                     scores=None if score is None else [score], score=score, started_at=now, ended_at=now,
                     harness_version="test", invalid_attribution=attribution)


def test_runs_invalid_after_the_agent_started_count_as_zero_and_are_flagged() -> None:
    after, before = InvalidAttribution.AFTER_AGENT_START, InvalidAttribution.BEFORE_AGENT
    results = [
        _result("a1", "voider", "t1", RunStatus.SCORED, 1.0),
        _result("a2", "voider", "t2", RunStatus.SCORED, 1.0),
        _result("a3", "voider", "t3", RunStatus.INVALID_EVALUATION_ENVIRONMENT, None, after),
        _result("a4", "voider", "t4", RunStatus.INVALID_EVALUATION_ENVIRONMENT, None, after),
        _result("b1", "honest", "t1", RunStatus.SCORED, 1.0),
        _result("b2", "honest", "t2", RunStatus.SCORED, 0.0),
        _result("b3", "honest", "t3", RunStatus.INVALID_EVALUATION_ENVIRONMENT, None, before),
        _result("b4", "honest", "t4", RunStatus.SCORED, 1.0),
    ]
    report = aggregate(results)
    by = {a.agent: a for a in report.agents}
    assert by["voider"].mean == 0.5 and by["voider"].valid_mean == 1.0 and by["voider"].flagged == 2
    assert by["voider"].pass_rate == 0.5
    assert by["honest"].mean == pytest.approx(2 / 3) and by["honest"].flagged == 0  # before_agent: left out
    assert {r.run_id for r in report.flagged_runs} == {"a3", "a4"}
    # Tiers use valid runs only: t3 has no valid run from anyone.
    assert "t3@v0" in report.tiers["unclassified"]
    from ale.report import to_html

    html = to_html(report)
    from html import escape

    assert "flagged for review: 2" in html and "counted as 0" in html and escape(report.counting_policy) in html
