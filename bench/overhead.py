"""Overhead of a full `ale run` against a bare docker create/start/exec/rm.

Both sides use the same image and the same flags (the policy's), in one process,
interleaved, repeated. Reports the median of each, their ratio, and the share
of a run spent on verification and evidence (probes, inspect checks, hashing,
signing). Writes the numbers to bench/results/overhead.{json,md} (docs/benchmarks.md cites them).

    .venv/bin/python bench/overhead.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from publish import publish  # noqa: E402

from ale.defaults import DEFAULT_TOOLS_IMAGE  # noqa: E402
from ale.plan import AgentSpec, RunPlan  # noqa: E402
from ale.record import evidence as ev  # noqa: E402
from ale.runs.lifecycle import execute_run, prepare  # noqa: E402
from ale.sandbox.base import Mount, SandboxSpec  # noqa: E402
from ale.sandbox.docker import DockerProvider, DockerSandbox, connect, remove_containers  # noqa: E402
from ale.sandbox.policy import IsolationPolicy  # noqa: E402


async def bare(client, policy: IsolationPolicy, tmp: Path) -> float:
    """docker create/start/exec/kill/rm of the same image and flags, nothing else."""
    rid = uuid.uuid4().hex[:10]
    inp, ws = tmp / f"in-{rid}", tmp / f"ws-{rid}"
    inp.mkdir()
    ws.mkdir()
    t0 = time.perf_counter()
    sb = DockerSandbox.create(
        client, SandboxSpec(name=f"ale-bench-{rid}", image=DEFAULT_TOOLS_IMAGE, policy=policy,
        mounts=[Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)],
        labels={"ale.run_id": f"bench-{rid}", "ale.experiment": "bench-overhead"}, workdir="/workspace"))
    await sb.start()
    await sb.exec(["true"])
    await sb.stop()
    await sb.remove()
    return time.perf_counter() - t0


_SIGN_TIMES: list[float] = []
_real_sign = ev.write_manifest_and_sign


def _timed_sign(run_dir, key):
    t0 = time.perf_counter()
    try:
        return _real_sign(run_dir, key)
    finally:
        _SIGN_TIMES.append(time.perf_counter() - t0)


ev.write_manifest_and_sign = _timed_sign  # the lifecycle calls it through the module


async def full(client, policy: IsolationPolicy, runs_dir: Path) -> tuple[float, dict]:
    plan = RunPlan(
        run_id=f"bench-{uuid.uuid4().hex[:10]}", task_dir=str(HERE / "tasks" / "noop"),
        agent=AgentSpec(name="nop"), policy=policy, runs_dir=str(runs_dir), experiment="bench-overhead",
    )
    t0 = time.perf_counter()
    result = await execute_run(plan, provider=DockerProvider(client))
    elapsed = time.perf_counter() - t0
    assert result.status.value == "scored", (result.status, result.error, result.violations)
    costs = dict(result.extra.get("costs", {}))
    # The manifest and signature come after result.json, so the run cannot record them.
    costs["evidence"] = costs.get("evidence", 0.0) + _SIGN_TIMES[-1]
    return elapsed, costs


async def main(repeats: int) -> None:
    client = connect()
    policy = IsolationPolicy(memory_bytes=512 * 1024**2)
    warm = await prepare(RunPlan(run_id="warm", task_dir=str(HERE / "tasks" / "noop"), agent=AgentSpec(name="nop")),
                         DockerProvider(client))
    await warm.process.close()
    b, f, costs = [], [], []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        try:
            await bare(client, policy, tmp)  # warm caches
            for _ in range(repeats):
                b.append(await bare(client, policy, tmp))
                t, c = await full(client, policy, tmp / "runs")
                f.append(t)
                costs.append(c)
        finally:
            remove_containers(client, experiment="bench-overhead")
    mb, mf = statistics.median(b), statistics.median(f)
    verify = statistics.median([c.get("verify", 0.0) for c in costs])
    evidence = statistics.median([c.get("evidence", 0.0) for c in costs])
    lines = [
        f"`bench/overhead.py`, {repeats} interleaved repeats, medians:",
        "",
        "| what | seconds |",
        "| --- | --- |",
        f"| bare docker create/start/exec/kill/rm | {mb:.3f} |",
        f"| full `ale run` (nop agent, no-op task) | {mf:.3f} |",
        f"| of which verification (inspect checks + probes, before and after) | {verify:.3f} |",
        f"| of which evidence (hashing, event log, manifest, signature) | {evidence:.3f} |",
        "",
        f"Ratio full / bare: **{mf / mb:.2f}x** (target at most 2.0x). Verification + evidence: "
        f"**{(verify + evidence) * 1000:.0f} ms** per run (target at most 300 ms).",
    ]
    print("\n".join(lines))
    figures = {"repeats": repeats, "bare_s": mb, "full_s": mf, "ratio": mf / mb, "verify_s": verify,
               "evidence_s": evidence}
    print(json.dumps(figures))
    print("wrote", *publish("overhead", figures, "\n".join(lines)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    asyncio.run(main(ap.parse_args().repeats))
