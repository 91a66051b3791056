"""Warm task processes (``TaskProcessPool``): each run a fork of a process that has
run ``load()``, starting from that state and leaving nothing for the next run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ale.tasks.process import TaskProcessError, TaskProcessPool
from tests.ale_tree import write

TASK = '''
    import os, sys, tempfile
    import cua_bench as cb
    STATE = {"evaluated": 0}
    LOADED = []
    @cb.tasks_config
    def load():
        LOADED.append(os.getpid())
        return [cb.Task(description="x"), cb.Task(description="y")]
    @cb.evaluate_task
    async def evaluate(cfg, session):
        STATE["evaluated"] += 1
        kind = await session.read_file("/kind")
        print(f"evaluating {kind} for variant {cfg.description}", file=sys.stderr)
        left = os.path.join(tempfile.gettempdir(), "left-by-a-run.txt")
        seen = os.path.exists(left)
        with open(left, "w") as f:
            f.write("x")
        if kind == "crash":
            os._exit(3)
        if kind == "daemon":
            import subprocess
            subprocess.Popen(["sleep", "60"])
        if kind == "tamper":  # the warm process's memory, through /proc
            try:
                open(f"/proc/{os.getppid()}/mem", "r+b").close()
                return {"tampered": True}
            except OSError as e:
                return {"tampered": False, "errno": e.errno}
        return {"evaluated": STATE["evaluated"], "saw_a_file_of_another_run": seen, "loads": len(LOADED)}
'''


class Kind:
    def __init__(self, kind: str):
        self.kind = kind

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        return self.kind


async def _run(pool: TaskProcessPool, kind: str, variant: int, log: Path) -> Any:
    p = pool.lend(log_path=log)
    await p.start()
    try:
        return await p.call("evaluate", variant, Kind(kind))
    except TaskProcessError as e:
        return f"error: {e}"
    finally:
        await p.close()


def test_each_run_is_a_fork_that_starts_as_loaded_and_leaves_nothing_behind(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", TASK).parent
    logs = tmp_path / "logs"
    logs.mkdir()

    async def go() -> tuple[list[Any], list[int], list[Any], int]:
        pool = TaskProcessPool(d)
        try:
            seq = []
            for i, kind in enumerate(["ok", "ok", "crash", "ok", "daemon", "ok"]):
                seq.append(await _run(pool, kind, i % 2, logs / f"{i}.log"))
                if i == 3:
                    counts = [pool.spawned]
            counts.append(pool.spawned)
            at_once = await asyncio.gather(*(_run(pool, "ok", i % 2, logs / f"c{i}.log") for i in range(3)))
            return seq, counts, list(at_once), pool.spawned
        finally:
            await pool.close()

    seq, counts, at_once, spawned = asyncio.run(go())
    fresh = {"evaluated": 1, "saw_a_file_of_another_run": False, "loads": 1}
    # every run: its module state as after load() (one load, in the warm process), no file of another run
    assert [seq[i] for i in (0, 1, 3, 4, 5)] == [fresh] * 5 and at_once == [fresh] * 3
    # a run that kills its interpreter ends its own call, as a process of its own would
    assert isinstance(seq[2], str) and "exited (exit code 3)" in seq[2] and "evaluating crash" in seq[2]
    # one warm process served the first four runs (the crash left it as loaded); the run that
    # left a process behind retired it, so the next run had a new one
    assert counts == [1, 2] and spawned >= 3
    # each run's log holds what it printed, nothing of another run's
    assert (logs / "0.log").read_text() == "evaluating ok for variant x\n"
    assert (logs / "1.log").read_text() == "evaluating ok for variant y\n"
    assert "evaluating crash" in (logs / "2.log").read_text()
    assert all((logs / f"c{i}.log").read_text().count("evaluating") == 1 for i in range(3))


def test_a_run_cannot_reach_into_the_warm_process_it_was_forked_from(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", TASK).parent

    async def go() -> Any:
        pool = TaskProcessPool(d)
        try:
            return await _run(pool, "tamper", 0, tmp_path / "log")
        finally:
            await pool.close()

    got = asyncio.run(go())
    assert got["tampered"] is False, got


def test_a_timeout_kills_the_warm_process_with_its_run(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", '''
        import time
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="x")]
        @cb.evaluate_task
        def evaluate(cfg, session):
            time.sleep(60)
    ''').parent

    async def go() -> tuple[bool, int]:
        pool = TaskProcessPool(d)
        try:
            p = pool.lend()
            await p.start()
            try:
                await p.call("evaluate", 0, Kind("x"), timeout=1)
            except TaskProcessError as e:
                assert "did not finish within 1s" in str(e)
            await p.close()
            q = pool.lend()
            await q.start()  # a new warm process
            alive = q.alive
            await q.close()
            return alive, pool.spawned
        finally:
            await pool.close()

    assert asyncio.run(go()) == (True, 2)
