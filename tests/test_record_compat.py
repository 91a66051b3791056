"""Run folders keep their shape: a folder written by ale 0.1 (before the sandbox
contract refactor) still verifies, and a new run writes the same set of files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ale.plan import AgentSpec, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider
from ale.status import RunStatus
from tests.conftest import EXAMPLES, TOOLS_IMAGE

OLD_RUN = Path(__file__).parent / "fixtures" / "runs" / "v0.1-word_count-oracle"


def _shape(run_dir: Path) -> dict[str, list[str]]:
    files = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    keys = {}
    for rel in files:
        if rel.endswith(".json") and not rel.startswith("deliverables/") and not rel.startswith("trajectory-files/"):
            data = json.loads((run_dir / rel).read_text())
            keys[rel] = sorted(data) if isinstance(data, dict) else [type(data).__name__]
    return {"files": [f for f in files if not f.startswith("trajectory-files/")], **keys}


def test_a_run_folder_written_by_ale_0_1_still_verifies() -> None:
    report = verify_run_dir(OLD_RUN)
    assert report.valid, report.violations


def test_a_new_run_folder_has_the_shape_of_an_old_one(docker_client, tmp_path) -> None:
    plan = RunPlan(
        run_id="shape", task_dir=str(EXAMPLES / "files" / "word_count"), agent=AgentSpec(name="oracle"),
        image=TOOLS_IMAGE, runs_dir=str(tmp_path),
    )
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.SCORED, result.error
    new, old = _shape(tmp_path / "shape"), _shape(OLD_RUN)
    # Since 0.1: plan.json names the sandbox provider and the judge credentials
    # evaluate() gets (by name), and the evidence records
    # how the task code ran (its own process). Everything else is as it was.
    # The staged-input record names the data layout it found; result.json says
    # who an invalid run is charged to, the model failure that ended a run and the limit
    # that stopped the agent (ale.status.ModelFailure, AgentLimit).
    added = "evidence/task-process.json"
    # plan.json also says whether the task's software is provided, and the overlay.
    assert new.pop("plan.json") == sorted([*old.pop("plan.json"), "provider", "judge_env", "provision_software",
                                           "software_overlay"])
    assert new.pop("result.json") == sorted([*old.pop("result.json"), "invalid_attribution", "model_failure",
                                                                 "agent_limit"])
    # The trajectory holds the model side (from the model gateway) where there is one,
    # and says where its steps came from (the toolbox, or the gateway for a native
    # harness) and where the harness's own transcript is.
    assert new.pop("trajectory.json") == sorted([*old.pop("trajectory.json"), "model_turns", "steps_source",
                                                 "steps_derivation", "harness_transcript"])
    # harness.json names the run's shape, whose phase table ale verify reads.
    assert new.pop("evidence/harness.json") == sorted([*old.pop("evidence/harness.json"), "run_shape"])
    # ... and, as root, the shared package its overlay sits on (ale.runs.packages).
    staged = [k for k in new.pop("evidence/input-staged.json") if k != "shared_package"]
    assert staged == sorted([*old.pop("evidence/input-staged.json"), "layout", "location"])
    # The deliverables manifest records its folders, limits and how the walk ended, and
    # how the run folder compares names (case and Unicode folding, probed).
    assert new.pop("deliverables.json") == sorted([*old.pop("deliverables.json"), "directories", "entries_visited",
                                                   "folding", "limits", "seconds", "stopped"])
    # Since the wave of 2026-12: the run's software (environment.json), and each grading attempt.
    # The prompt the agent received is part of the signed record (agent/prompt.txt).
    # The end of the turn, done from the host, and its bound (evidence/stop.json).
    # What start() changed in the public package (evidence/start-writes.json), for a regrade.
    for name in (added, "evidence/environment.json", "evidence/grading-attempts.json", "agent/prompt.txt",
                 "evidence/stop.json", "evidence/start-writes.json"):
        assert (name.endswith(".txt") or new.pop(name)) and name in new["files"] and name in new["manifest.json"], name
        new["files"].remove(name)
        new["manifest.json"].remove(name)
    # The task log notes every command the task ran (the oracle runs `wc`), so it is
    # there even for a task that prints nothing; it always was for one that printed.
    assert "task.log" in new["files"] and "task.log" not in old["files"]
    new["files"].remove("task.log")
    new["manifest.json"].remove("task.log")
    new.pop("task.log", None)
    # The engine's registered OCI runtimes (the gVisor tier).
    # The policy bounds SysV shared memory and core files (read as off in a record made before).
    assert new.pop("evidence/policy.json") == sorted([*old.pop("evidence/policy.json"), "no_core_dumps",
                                                      "sysv_shm_limits"])
    # ... and the host kernel's core_pattern (a pipe runs a handler as root for a sandbox's crash).
    assert new.pop("evidence/engine.json") == sorted([*old.pop("evidence/engine.json"), "runtimes", "core_pattern",
                                                      "core_pattern_pipe"])
    # What start() wrote into the reference is kept (copied once the candidate's sandbox
    # is gone) and listed, so a regrade needs no second start() (ale.runs.start_writes).
    assert new.pop("evidence/reference-check.json") == sorted([*old.pop("evidence/reference-check.json"), "kept"])
    assert new == old
