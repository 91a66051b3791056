"""The one cleanup of every kind: everything a run-like thing took, released on every path out."""

from __future__ import annotations

import asyncio
import contextlib

from ale.runs.state import RunState
from ale.sandbox.scratch import release_scratch


async def cleanup(state: RunState) -> None:
    """The one cleanup of every kind, on every path out: close the trajectory, the
    task processes, the grader, remove the sandbox, sweep by label what a handle
    cannot reach, drop the scratch folders (and their mounts), release the shared
    package. Shielded so that Ctrl-C still removes what was created."""

    async def _do() -> None:
        if state.live.trajectory is not None:
            with contextlib.suppress(Exception):
                state.live.trajectory.close(
                    usage=(state.live.agent_outcome.usage if state.live.agent_outcome else {}),
                    end=(state.live.agent_outcome.end.value if state.live.agent_outcome else "interrupted"),
                )
        # Independent of each other: done at once.
        jobs = [state.prep.process.close()]
        if state.live.task_process is not None:
            jobs.append(state.live.task_process.close())
        if state.live.sandbox is not None:
            jobs.append(state.sandbox.remove())
        if state.live.grader is not None:
            jobs.append(state.live.grader.close())
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
        # A removal that failed, a run interrupted mid-way or a create that was
        # still in flight when it was: sweep by the run's label, which finds what a
        # handle cannot (only this run's sandboxes carry it).
        task = asyncio.current_task()
        interrupted = task is not None and task.cancelling() > 0
        sweep = []
        if interrupted or (state.live.provisioning and (
                state.live.sandbox is None or any(isinstance(o, BaseException) for o in outcomes))):
            sweep.append(state.plan.run_id)
        if interrupted and state.live.start_sandbox is not None:
            sweep.append(state.live.start_sandbox)
        for run_id in sweep:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(state.prep.provider.remove_managed, run_id=run_id)
        await asyncio.to_thread(release_scratch, state.folder.scratch)
        release_package(state)

    await asyncio.shield(_do())


def release_package(state: RunState) -> None:
    """Let go of the shared public package this run staged from (its lock, so the
    cache may evict the entry). Idempotent."""
    if state.live.package is not None:
        state.live.package.release()
