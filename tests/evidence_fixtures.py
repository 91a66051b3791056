"""A complete, signed run folder built without Docker, for tests of `ale verify`.

The container evidence is the real capture in tests/fixtures (inspect after
create and after kill, the tools image, the probe output of the running
container; policy 1 GiB, 1 CPU; binds /tmp/ale-fixture/input -> /input ro and
/tmp/ale-fixture/workspace -> /workspace rw). Everything else is written the way
the run lifecycle writes it, through the evidence writer API, and signed last.

``build_run_folder(tmp_path / "run")`` gives a run that verifies; its keyword
arguments and ``before_sign`` make the signed-but-wrong variants.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import ale
from ale import layout
from ale.record import evidence as ev
from ale.redaction import redact
from ale.sandbox.base import Mount
from ale.sandbox.policy import GIB, IsolationPolicy, TmpfsMount

FIX = Path(__file__).parent / "fixtures"
CAPTURES = ("inspect_good.json", "inspect_good_after.json", "image_good.json", "probe_good.txt")
# The captures were recorded before tmpfs were fitted to the memory: their policy names its 1 GiB /tmp.
POLICY = IsolationPolicy(memory_bytes=1 * GIB, cpus=1, tmpfs=(TmpfsMount(options="rw,nosuid,nodev,size=1g"),))
MOUNTS = [
    Mount("/tmp/ale-fixture/input", "/input", True),
    Mount("/tmp/ale-fixture/workspace", "/workspace", False),
]


# The real container captures the isolation checks run on are committed with the
# repository: without them a test fails (tests/conftest.py ``committed``), never skips.
requires_captures = pytest.mark.committed(*(FIX / n for n in CAPTURES))


def load_fixture(name: str) -> Any:
    text = (FIX / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


def _t(value: str) -> datetime:
    from ale.record.verify import parse_time

    t = parse_time(value)
    assert t is not None, value
    return t


@dataclass
class RunFolder:
    run_dir: Path
    key: Ed25519PrivateKey
    public_key_path: Path  # the operator's public key, kept outside the run folder
    run_id: str

    def rel(self, name: str) -> Path:
        return self.run_dir / name

    def edit_json(self, name: str, fn: Callable[[Any], Any]) -> None:
        """Rewrite a run file (after signing: that is tampering)."""
        p = self.rel(name)
        data = json.loads(p.read_text())
        new = fn(data)
        p.write_text(json.dumps(data if new is None else new, indent=2))


def build_run_folder(
    run_dir: Path,
    *,
    status: str = "scored",
    scores: tuple[float, ...] | list[float] | None = (1.0, 0.5),
    score: float | None = None,
    violations: list[str] | None = None,
    inspect_before: dict | None = None,
    inspect_after: dict | None = None,
    probes_before: str | None = None,
    probes_after: str | None = None,
    deliverables: dict[str, bytes] | None = None,
    key: Ed25519PrivateKey | None = None,
    before_sign: Callable[[Path], None] | None = None,
    sign: bool = True,
) -> RunFolder:
    """Write a whole run folder as the lifecycle does, and sign it.

    ``scores`` None means no score; ``score`` defaults to their mean.
    ``before_sign(run_dir)`` edits the folder before it is sealed, to make runs
    whose record is authentic but whose claims are wrong.
    """
    from ale.grading.deliverables import extract_deliverables
    from ale.isolation.checks import check_inspect, diff_captures
    from ale.isolation.probes import parse_probes, workspace_listing
    from ale.plan import AgentSpec, RunPlan
    from ale.result import PhaseTiming, RunResult

    scores = list(scores) if scores is not None else None
    if score is None and scores:
        score = sum(scores) / len(scores)
    key = key or Ed25519PrivateKey.generate()
    run_dir = Path(run_dir)
    scratch = run_dir.parent / f".scratch-{run_dir.name}"
    (scratch / "input" / "data").mkdir(parents=True)
    (scratch / "input" / "data" / "table.csv").write_text("a,b\n1,2\n")
    (scratch / "input" / "brief.md").write_text("Summarise the table.\n")
    (scratch / "workspace").mkdir()
    (scratch / "setup-reference").mkdir()
    run_dir.mkdir(parents=True)

    before = inspect_before if inspect_before is not None else load_fixture("inspect_good.json")
    after = inspect_after if inspect_after is not None else load_fixture("inspect_good_after.json")
    image = load_fixture("image_good.json")
    pb = probes_before if probes_before is not None else load_fixture("probe_good.txt")
    pa = probes_after if probes_after is not None else load_fixture("probe_good.txt")

    plan = RunPlan(
        run_id="20261130T225306-report-v0-oracle-0123abcd",
        task_dir="/tasks/finance/report",
        agent=AgentSpec(name="oracle", config={"model": "none", "api_key": "sk-test-1234567890abcdef"}),
        policy=POLICY,
        runs_dir=str(run_dir.parent),
    )
    (run_dir / "plan.json").write_text(plan.model_dump_json(indent=2))
    events = ev.EventLog(run_dir / layout.EVENTS)
    store = ev.EvidenceStore(run_dir)
    events.append("run.start", run_id=plan.run_id, plan_digest=plan.digest())
    store.write_json("policy.json", json.loads(POLICY.model_dump_json()))
    store.write_json("harness.json", {
        "ale_version": ale.__version__, "python": platform.python_version(), "task_dir": plan.task_dir,
        "task_code_sha256": "ab" * 32, "plan_sha256": plan.digest(),
    })
    store.write_json("engine.json", {
        "version": {"Version": "20.10.24", "ApiVersion": "1.41"},
        "security_options": ["name=seccomp,profile=default", "name=cgroupns"],
        "cgroup_version": "1", "driver": "overlay2", "default_runtime": "runc",
    })

    # Times of the lifecycle's phases, around the container's real times.
    created, started = _t(before["Created"]), _t(after["State"]["StartedAt"])
    finished = _t(after["State"]["FinishedAt"])
    ms = timedelta(milliseconds=1)
    spans = [
        ("stage_input", created - 2000 * ms, created - 1500 * ms),
        ("provision", created - 1400 * ms, started + 10 * ms),
        ("task_start", started + 20 * ms, started + 30 * ms),
        ("verify_before", started + 31 * ms, started + 40 * ms),
        ("agent", started + 41 * ms, started + 50 * ms),
        ("stop", started + 51 * ms, finished + 10 * ms),
        ("deliverables", finished + 20 * ms, finished + 30 * ms),
    ]
    graded = status in ("scored", "agent_failed", "timeout")
    if graded:
        spans.append(("grade", finished + 40 * ms, finished + 1000 * ms))
    phases = [PhaseTiming(name=n, started_at=s, ended_at=e, seconds=(e - s).total_seconds()) for n, s, e in spans]

    mounts_rec = [
        {"source": m.source, "inode": os.stat(scratch / ("input" if m.read_only else "workspace")).st_ino,
         "target": m.target, "read_only": m.read_only}
        for m in MOUNTS
    ]
    store.write_json("mounts.json", mounts_rec)
    at_creation = workspace_listing(scratch / "workspace")
    store.write_json("inspect-before.json", before)
    store.write_json("image.json", image)
    checks: list[dict] = []

    def add(phase: str, cs: list[Any]) -> None:
        checks.extend({"phase": phase, **c.to_dict()} for c in cs)

    add("inspect-before", check_inspect(before, POLICY, MOUNTS, phase="before", image_inspect=image))
    events.append("sandbox.created", name=f"ale-{plan.run_id}", id=before.get("Id"))
    events.append("sandbox.started")
    store.write_text("probes-before.txt", pb)
    add("probes-before", parse_probes(pb, POLICY, input_dir="/input", workspace_dir="/workspace"))
    store.write_json("input-after-start.json", ev.hash_tree(scratch / "input"))
    store.write_json("workspace-empty.json", {
        "at_creation": at_creation, "at_agent_start": workspace_listing(scratch / "workspace"),
    })
    reference_sha = ev.sha256_bytes(b"reference.7z bytes")
    setup_tree = ev.hash_tree(scratch / "setup-reference")
    store.write_json("reference-commit.json", {
        "source": {"kind": "7z", "sha256": reference_sha, "files": 3},
        "setup_written": setup_tree,
        "committed_at": (started + 35 * ms).isoformat(),
    })
    events.append("reference.committed", sha256=reference_sha, setup_digest=setup_tree["digest"])
    store.write_json("agent.json", {
        "name": plan.agent.name, "config": redact(plan.agent.config), "allowlist": list(plan.agent.allowlist),
    })
    store.write_json("network.json", {"network_mode": "none", "controller": "outside the sandbox"})
    # The agent's one step, through the recorder a run uses (trajectory.jsonl and .json agree).
    from ale.agents.trajectory import TrajectoryWriter

    writer = TrajectoryWriter(run_dir, plan.run_id, plan.agent.name)
    writer.record({"index": 1, "tool": "shell", "args": {"command": "ls"}, "ok": True, "exit_code": 0,
                   "started_at": "2026-11-30T22:53:10+00:00", "ended_at": "2026-11-30T22:53:10.5+00:00", "seconds": 0.5})
    writer.close(end="finished")

    for name, data in (deliverables if deliverables is not None else {"report.txt": b"total: 3\n"}).items():
        p = scratch / "workspace" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    events.append("agent.ended", end="finished", detail="")
    store.write_text("probes-after.txt", pa)
    add("probes-after", parse_probes(pa, POLICY, input_dir="/input", workspace_dir="/workspace"))
    store.write_json("inspect-after.json", after)
    add("inspect-after", check_inspect(after, POLICY, MOUNTS, phase="after") + diff_captures(before, after))
    manifest = extract_deliverables(scratch / "workspace", run_dir / "deliverables", max_files=100, max_bytes=10**6)
    (run_dir / "deliverables.json").write_text(manifest.model_dump_json(indent=2))
    events.append("deliverables.collected", files=len(manifest.files), digest=manifest.digest)
    store.write_json("input-after-run.json", ev.hash_tree(scratch / "input"))
    if graded:
        store.write_json("reference-check.json", {
            "source_sha256": reference_sha, "setup_written_digest": setup_tree["digest"],
            "staged_tree": {"files": {}, "digest": "", "count": 0},
            "unpacked_at": (finished + 50 * ms).isoformat(),
        })
        events.append("reference.staged")

    store.write_json("checks.json", checks)
    store.write_json("phases.json", [p.model_dump(mode="json") for p in phases])
    result = RunResult(
        run_id=plan.run_id, task_id="finance/report", task_dir=plan.task_dir, variant=0, agent="oracle",
        status=status, scores=scores, score=score, violations=violations or [], phases=phases,
        started_at=spans[0][1], ended_at=spans[-1][2], harness_version=ale.__version__,
    )
    events.append("run.end", status=result.status.value, score=result.score)
    (run_dir / "result.json").write_text(result.model_dump_json(indent=2))
    if before_sign is not None:
        before_sign(run_dir)
    if sign:
        ev.write_manifest_and_sign(run_dir, key)
    pub = run_dir.parent / f"{run_dir.name}-operator.pub.pem"
    from ale.record.signing import public_key_pem

    pub.write_bytes(public_key_pem(key))
    return RunFolder(run_dir=run_dir, key=key, public_key_path=pub, run_id=plan.run_id)
