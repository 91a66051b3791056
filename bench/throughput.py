"""Throughput of the orchestrator against a bare Docker loop, and its memory.

1. ``--runs`` no-op runs (a task that does nothing, the ``nop`` agent) at
   ``--concurrency`` through the orchestrator and the real lifecycle
   (plan, stage, create, verify, probes, agent, stop, deliverables, grade,
   evidence, signing).
2. A bare loop of the same containers at the same concurrency: create (same
   flags: the policy's ``container_create_kwargs``, two bind mounts), start, one
   exec, kill, remove. No verification, no evidence: the floor Docker itself sets.
3. The orchestrator's resident memory with ``--queued`` runs planned and queued
   (measured in a child process while its first runs execute).

The ratio is orchestrator runs/s ÷ bare runs/s (target ≥ 0.6); the memory
target is ≤ 300 MB RSS. Results are printed and, with ``--write``, put under
bench/results/throughput.{json,md} (docs/benchmarks.md cites them).

4. ``--profile N``: N runs at ``--concurrency`` through the orchestrator with every
   call that talks to the engine, the task process, the hashing and the signing
   timed (``time.perf_counter`` wrappers; py-spy is not available here): where one
   run's seconds go, per run on average (calls overlap with the other runs').

    .venv/bin/python bench/throughput.py --write
    .venv/bin/python bench/throughput.py --profile 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from publish import publish  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

NOOP_TASK = textwrap.dedent("""\
    import cua_bench as cb


    @cb.tasks_config
    def load():
        return [cb.Task(description="Do nothing.", task_id="noop")]


    @cb.evaluate_task
    async def evaluate(cfg, session):
        return [0.0]
""")


def write_experiment(root: Path, name: str, n_tasks: int, repeats: int, concurrency: int) -> Path:
    for i in range(n_tasks):
        d = root / "tasks" / f"noop{i:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "main.py").write_text(NOOP_TASK)
    f = root / "exp.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: {name}
        tasks_root: tasks
        agents: [{{name: nop}}]
        tasks: [{{glob: "noop*"}}]
        repeats: {repeats}
        concurrency: {concurrency}
        environment:
          policy: {{cpus: 1, memory_bytes: 268435456}}
        output: out
    """))
    return f


def bench_orchestrator(runs: int, concurrency: int) -> dict:
    from ale.runs.experiment import load_experiment
    from ale.runs.orchestrator import Orchestrator

    with tempfile.TemporaryDirectory(prefix="ale-bench-") as tmp:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        exp = load_experiment(write_experiment(Path(tmp), name, 10, runs // 10, concurrency))
        orch = Orchestrator(exp)
        t0 = time.perf_counter()
        summary = asyncio.run(orch.run())
        dt = time.perf_counter() - t0
        return {
            "runs": summary.total,
            "seconds": dt,
            "runs_per_s": summary.total / dt,
            "statuses": summary.statuses,
            "max_in_flight": orch.max_in_flight,
        }


def bench_bare(runs: int, concurrency: int) -> dict:
    import docker

    from ale.defaults import DEFAULT_TOOLS_IMAGE
    from ale.sandbox.base import Mount
    from ale.sandbox.docker import (
        LABEL_EXPERIMENT,
        LABEL_MANAGED,
        container_create_kwargs,
        remove_containers,
    )
    from ale.sandbox.policy import IsolationPolicy

    client = docker.from_env(timeout=120)
    policy = IsolationPolicy(cpus=1, memory_bytes=268435456)
    label = f"bench-bare-{uuid.uuid4().hex[:8]}"

    def one(i: int, tmp: Path) -> None:
        inp, ws = tmp / f"in{i}", tmp / f"ws{i}"
        inp.mkdir()
        ws.mkdir()
        os.chown(ws, policy.uid, policy.gid)
        kwargs = container_create_kwargs(
            name=f"{label}-{i}",
            image=DEFAULT_TOOLS_IMAGE,
            policy=policy,
            mounts=[Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)],
            labels={LABEL_MANAGED: "1", LABEL_EXPERIMENT: label},
            workdir="/workspace",
        )
        c = client.containers.create(**kwargs)
        try:
            c.start()
            c.exec_run(["true"], user=policy.user)
            c.kill()
            c.wait(timeout=60)
        finally:
            c.remove(force=True)

    async def main(tmp: Path) -> None:
        sem = asyncio.Semaphore(concurrency)

        async def guarded(i: int) -> None:
            async with sem:
                await asyncio.to_thread(one, i, tmp)

        await asyncio.gather(*(guarded(i) for i in range(runs)))

    with tempfile.TemporaryDirectory(prefix="ale-bench-bare-") as tmp:
        t0 = time.perf_counter()
        try:
            asyncio.run(main(Path(tmp)))
        finally:
            remove_containers(client, experiment=label)
        dt = time.perf_counter() - t0
    return {"runs": runs, "seconds": dt, "runs_per_s": runs / dt}


def memory_child(queued: int, seconds: float) -> None:
    """In a fresh process: plan ``queued`` runs, start the orchestrator, sample RSS."""
    import psutil

    from ale.runs.experiment import load_experiment
    from ale.runs.orchestrator import Orchestrator

    proc = psutil.Process()
    base = proc.memory_info().rss
    with tempfile.TemporaryDirectory(prefix="ale-bench-mem-") as tmp:
        name = f"benchmem-{uuid.uuid4().hex[:8]}"
        exp = load_experiment(write_experiment(Path(tmp), name, 10, queued // 10, 2))
        orch = Orchestrator(exp)
        peak = [proc.memory_info().rss]

        async def main() -> None:
            task = asyncio.create_task(orch.run())
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                await asyncio.sleep(0.25)
                peak[0] = max(peak[0], proc.memory_info().rss)
            orch.request_stop()
            await task

        asyncio.run(main())
    print(json.dumps({"queued": len(orch.units), "rss_start_mb": base / 2**20, "rss_peak_mb": peak[0] / 2**20}))


def bench_memory(queued: int, seconds: float) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", "--queued", str(queued), "--seconds", str(seconds)],
        capture_output=True, text=True, check=True, cwd=REPO,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


PROFILED: dict[str, list[float]] = {}


def _timed(label: str, fn: Any, classify: Any = None) -> Any:
    """``fn`` wrapped: each call's wall time is added under its label."""
    import functools
    import inspect

    def key(args: tuple, kwargs: dict) -> str:
        return label if classify is None else f"{label}: {classify(args, kwargs)}"

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                PROFILED.setdefault(key(args, kwargs), []).append(time.perf_counter() - t0)
        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PROFILED.setdefault(key(args, kwargs), []).append(time.perf_counter() - t0)
    return wrapper


def _exec_kind(args: tuple, kwargs: dict) -> str:
    argv = args[1] if len(args) > 1 else kwargs.get("argv", [])
    text = " ".join(str(a) for a in argv)[:400]
    if "ale-probe" in text and "kill" in text:
        return "kill + probes after"
    if "ale-probe" in text:
        return "probes"
    if "/proc/uptime" in text:
        return "uptime"
    return str(argv[0]) if argv else "?"


def instrument() -> None:
    """Wrap the calls one run makes with timers (the bench's process only)."""
    from ale.data import local
    from ale.grading import grader
    from ale.record import evidence as ev
    from ale.runs import lifecycle, software
    from ale.runs.steps import cleanup as steps_cleanup
    from ale.runs.steps import deliverables as steps_deliverables
    from ale.sandbox import docker as dk
    from ale.sandbox import scratch
    from ale.tasks import process

    sb = dk.DockerSandbox
    for name in ("create",):
        setattr(sb, name, classmethod(_timed(f"docker {name}", getattr(sb, name).__func__)))
    for name in ("inspect", "start", "stop", "remove", "kill_user_processes_then", "_raise_if_gone"):
        setattr(sb, name, _timed(f"docker {name}", getattr(sb, name)))
    sb.exec = _timed("docker exec", sb.exec, _exec_kind)
    sb._exec_state = _timed("docker exec_inspect", sb._exec_state)
    dp = dk.DockerProvider
    for name in ("image_inspect", "engine_record", "ping"):
        setattr(dp, name, _timed(f"provider {name}", getattr(dp, name)))
    tp = process.TaskProcess
    tp.start = _timed("task process start + load()", tp.start)
    tp.close = _timed("task process close", tp.close)
    tp.call = _timed("task process call", tp.call, lambda a, k: a[1] if len(a) > 1 else k.get("name"))
    ev.hash_tree = _timed("hash_tree", ev.hash_tree)
    ev.write_manifest_and_sign = _timed("manifest + sign", ev.write_manifest_and_sign)
    steps_cleanup.release_scratch = _timed("release scratch", scratch.release_scratch)
    lifecycle.prepare = _timed("prepare (preflight)", lifecycle.prepare)
    lifecycle._record_static_evidence = _timed("static evidence", lifecycle._record_static_evidence)
    lifecycle._finish_record = _timed("finish record (checks, result, sign)", lifecycle._finish_record)
    lifecycle.cleanup = _timed("cleanup", lifecycle.cleanup)
    lifecycle.execute_run = _timed("execute_run (whole)", lifecycle.execute_run)
    steps_deliverables.extract_deliverables = _timed("extract deliverables", steps_deliverables.extract_deliverables)
    software.provide = _timed("provide software", software.provide)
    grader.Grader.close = _timed("grader close", grader.Grader.close)
    grader.Grader.grade = _timed("grader grade", grader.Grader.grade)
    local.LocalSource.commit_reference = _timed("commit reference", local.LocalSource.commit_reference)
    import re

    import docker.api.client as api

    def route(args: tuple, kwargs: dict) -> str:  # the engine's endpoint, ids elided
        path = "/" + str(args[1]).split("://", 1)[-1].split("/", 1)[-1]
        path = re.sub(r"^/v[0-9.]+/", "/", path)
        return re.sub(r"/[0-9a-f]{64}|/ale-[^/?]+|/sha256:[0-9a-f]+|/ale-tools[^/?]*", "/<id>", path)

    for verb in ("_get", "_post", "_delete", "_put"):
        setattr(api.APIClient, verb, _timed(f"HTTP {verb[1:].upper()}", getattr(api.APIClient, verb), route))
    real_fsync = os.fsync
    os.fsync = _timed("os.fsync", real_fsync)


def profile(runs: int, concurrency: int) -> None:
    """Where a no-op run's seconds go: the phases (result.json) and the timed calls."""
    import statistics as st

    from ale.runs import orchestrator

    instrument()
    from ale.runs import lifecycle
    orchestrator.execute_run = lifecycle.execute_run
    with tempfile.TemporaryDirectory(prefix="ale-bench-prof-") as tmp:
        name = f"prof-{uuid.uuid4().hex[:8]}"
        from ale.runs.experiment import load_experiment
        from ale.runs.orchestrator import Orchestrator

        exp = load_experiment(write_experiment(Path(tmp), name, 10, max(1, runs // 10), concurrency))
        orch = Orchestrator(exp)
        t0 = time.perf_counter()
        summary = asyncio.run(orch.run())
        dt = time.perf_counter() - t0
        phases: dict[str, list[float]] = {}
        for f in (Path(tmp) / "out" / "runs").glob("*/result.json"):
            r = json.loads(f.read_text())
            for ph in r["phases"]:
                phases.setdefault(ph["name"], []).append(ph["seconds"])
            for k, v in (r.get("extra", {}).get("costs") or {}).items():
                phases.setdefault(f"cost:{k}", []).append(v)
    n = summary.total
    print(f"{n} runs at concurrency {concurrency} in {dt:.1f} s ({n / dt:.2f} runs/s) {summary.statuses}")
    print("phase (result.json)                          median s   mean s")
    for k, v in phases.items():
        print(f"  {k:42} {st.median(v):8.3f} {st.mean(v):8.3f}")
    print("timed calls                                  calls/run  s/run   median s/call")
    for k, v in sorted(PROFILED.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {k:42} {len(v) / n:8.2f} {sum(v) / n:8.3f} {st.median(v):8.3f}")


def orch_child(src: Path, runs: int, concurrency: int) -> dict:
    """``bench_orchestrator`` in a child process importing ale from ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, __file__, "--orch-child", "--runs", str(runs), "--concurrency",
                          str(concurrency)],
                         capture_output=True, text=True, check=True, cwd=REPO, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> None:
    """Rounds of: the bare loop, this checkout's orchestrator, another checkout's
    (both in child processes), in a rotating order; the ratios of each round."""
    import statistics as st

    loops = {"bare": lambda: bench_bare(args.runs, args.concurrency),
             "after": lambda: orch_child(REPO / "src", args.runs, args.concurrency),
             "before": lambda: orch_child(Path(args.compare).resolve(), args.runs, args.concurrency)}
    names = list(loops)
    ratios: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = names[r % 3:] + names[:r % 3]
        got = {name: loops[name]() for name in order}
        for k in ratios:
            ratios[k].append(got[k]["runs_per_s"] / got["bare"]["runs_per_s"])
        print(f"round {r + 1} ({', '.join(order)}): bare {got['bare']['runs_per_s']:.2f} runs/s; before "
              f"{got['before']['runs_per_s']:.2f} ({ratios['before'][-1]:.2f}x) {got['before']['statuses']}; after "
              f"{got['after']['runs_per_s']:.2f} ({ratios['after'][-1]:.2f}x) {got['after']['statuses']}", flush=True)
    for k, v in ratios.items():
        print(f"{k}: median {st.median(v):.2f}x [{', '.join(f'{x:.2f}' for x in v)}]")
    after_over_before = [a / b for a, b in zip(ratios["after"], ratios["before"], strict=True)]
    print(f"after / before, per round: median {st.median(after_over_before):.2f} "
          f"[{', '.join(f'{x:.2f}' for x in after_over_before)}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--queued", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=8.0, help="memory sampling time")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds (this machine is noisy): the median ratio counts")
    ap.add_argument("--write", action="store_true", help="write bench/results/throughput.{json,md}")
    ap.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="time the calls of N runs and print where they go")
    ap.add_argument("--compare", metavar="SRC",
                    help="also run the orchestrator of another checkout's src/ (e.g. the commit before a change) in "
                         "each round, in a child process like this checkout's: before/after, interleaved")
    ap.add_argument("--orch-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.orch_child:
        print(json.dumps(bench_orchestrator(args.runs, args.concurrency)))
        return
    if args.profile:
        profile(args.profile, args.concurrency)
        return
    if args.compare:
        compare(args)
        return
    if args.memory_child:
        memory_child(args.queued, args.seconds)
        return

    rounds = []
    for r in range(args.rounds):
        # Alternate which loop goes first, so drift over the run favours neither.
        order = ("bare", "orch") if r % 2 == 0 else ("orch", "bare")
        got = {}
        for which in order:
            got[which] = bench_bare(args.runs, args.concurrency) if which == "bare" \
                else bench_orchestrator(args.runs, args.concurrency)
        bare, orch = got["bare"], got["orch"]
        ratio = orch["runs_per_s"] / bare["runs_per_s"]
        rounds.append((ratio, bare, orch))
        print(f"round {r + 1}: bare {bare['runs_per_s']:.2f} runs/s, orchestrator {orch['runs_per_s']:.2f} runs/s "
              f"{orch['statuses']} (max in flight {orch['max_in_flight']}): {ratio:.2f}x", flush=True)
    rounds.sort(key=lambda x: x[0])
    ratio, bare, orch = rounds[len(rounds) // 2]
    all_ratios = ", ".join(f"{x[0]:.2f}" for x in rounds)
    print(f"ratio: median {ratio:.2f}x over {args.rounds} round(s) [{all_ratios}] (target >= 0.6x)", flush=True)
    mem = bench_memory(args.queued, args.seconds)
    print(f"memory with {mem['queued']} runs queued: peak RSS {mem['rss_peak_mb']:.0f} MB "
          f"(interpreter at start {mem['rss_start_mb']:.0f} MB; target <= 300 MB)", flush=True)

    if args.write:
        import docker

        info = docker.from_env().version()
        text = textwrap.dedent(f"""\
            `bench/throughput.py` ({time.strftime('%Y-%m-%d')}; Docker {info.get('Version')},
            {os.cpu_count()} CPUs, Python {platform.python_version()}). A no-op task (its
            `evaluate` returns 0 at once) with the `nop` agent, {args.runs} runs at concurrency
            {args.concurrency}, both loops in the same process run, same containers (the
            policy's create flags, two bind mounts), {args.rounds} interleaved rounds; the
            table shows the median round (ratios of all rounds: {all_ratios}).

            | what | runs | seconds | runs/s |
            | --- | ---: | ---: | ---: |
            | bare Docker loop (create, start, 1 exec, kill, rm) | {bare['runs']} | {bare['seconds']:.1f} | {bare['runs_per_s']:.2f} |
            | orchestrator + full lifecycle | {orch['runs']} | {orch['seconds']:.1f} | {orch['runs_per_s']:.2f} |

            **Ratio: {ratio:.2f}x** of the bare loop, median of {args.rounds} rounds (target ≥ 0.6x). The orchestrator's runs
            each also inspect the container twice, run the isolation probes before and after,
            hash input and deliverables, grade, and write and sign the evidence.
            Final statuses: {orch['statuses']}; at most {orch['max_in_flight']} runs in flight.

            **Memory with {mem['queued']} runs queued**: peak RSS {mem['rss_peak_mb']:.0f} MB
            (the interpreter before importing ale: {mem['rss_start_mb']:.0f} MB; target ≤ 300 MB),
            sampled every 0.25 s for {args.seconds:.0f} s while the first runs execute.
            """)  # noqa: E501
        figures = {"ratio": ratio, "rounds": [x[0] for x in rounds], "bare": bare, "orchestrator": orch, "memory": mem}
        print("wrote", *publish("throughput", figures, text))


if __name__ == "__main__":
    main()
