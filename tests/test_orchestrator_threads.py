"""The orchestrator gives every run in flight its worker threads: N runs each blocked
in a thread at once (an exec's stream, a hash, a package build) all make progress."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from ale.plan import RunPlan
from ale.runs.orchestrator import Orchestrator
from tests.test_exp_orchestrator import FakeJanitor, FakeRunner, make_exp, run

N = 40  # above the default pool's most (32 threads): every run blocked in a thread at once


def test_runs_blocked_in_threads_do_not_starve_each_other(tmp_path: Path) -> None:
    barrier = threading.Barrier(N, timeout=30)  # broken (BrokenBarrierError) unless all N wait at once
    met: list[str] = []
    fake = FakeRunner(delay=0)

    async def runner(plan: RunPlan, cancel: asyncio.Event):
        await asyncio.to_thread(barrier.wait)
        met.append(plan.run_id)
        return await fake(plan, cancel)

    exp = make_exp(tmp_path, n_tasks=N)
    orch = Orchestrator(exp, runner=runner, janitor=FakeJanitor(), concurrency=N, ramp_after_s=0.001)
    summary = run(orch)
    assert orch.max_in_flight == N and len(met) == N
    assert summary.statuses == {"scored": N}
