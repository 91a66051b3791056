"""The same experiment locally and on a one-node Ray cluster on this machine.

1. ``--runs`` no-op runs (``bench/throughput.py``'s no-op task, the ``nop``
   agent) at ``--concurrency``, once with ``cluster: local`` and once on a Ray
   cluster of one node (``ale node start --head --slots C`` on the local engine,
   token auth on, node IP 127.0.0.1), interleaved over ``--rounds``. The per-run
   overhead ratio is cluster seconds ÷ local seconds (target ≤ 1.15x).
2. The driver's resident memory with ``--queued`` units queued on the cluster
   (measured in a child process while its first runs execute; target ≤ 300 MB).
   Ray's own processes (GCS, raylet, workers) are not the driver and not counted.

    .venv/bin/python bench/cluster.py --write
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from publish import publish  # noqa: E402
from throughput import write_experiment  # noqa: E402


def start_cluster(tmp: Path, slots: int) -> str:
    env = {**os.environ, "ALE_NODE_ROOT": str(tmp / "nodes"), "RAY_AUTH_TOKEN_PATH": str(tmp / "token")}
    os.environ.update({k: env[k] for k in ("ALE_NODE_ROOT", "RAY_AUTH_TOKEN_PATH")})
    p = subprocess.run([sys.executable, "-m", "ale.cli", "node", "start", "--head", "--port", "0",
                        "--slots", str(slots), "--name", f"bench{uuid.uuid4().hex[:4]}"],
                       capture_output=True, text=True, env=env, check=True, timeout=240)
    return p.stdout.strip().splitlines()[-1]


def stop_cluster() -> None:
    subprocess.run([sys.executable, "-m", "ale.cli", "node", "stop", "--all"], capture_output=True, timeout=120)


def bench_one(runs: int, concurrency: int, cluster: str) -> dict:
    from ale.runs.experiment import load_experiment
    from ale.runs.orchestrator import Orchestrator

    with tempfile.TemporaryDirectory(prefix="ale-bench-cl-") as tmp:
        exp = load_experiment(write_experiment(Path(tmp), f"benchcl-{uuid.uuid4().hex[:8]}", 10,
                                               runs // 10, concurrency))
        t0 = time.perf_counter()
        orch = Orchestrator(exp, cluster=cluster)
        summary = asyncio.run(orch.run())
        dt = time.perf_counter() - t0
        return {"runs": summary.total, "seconds": dt, "per_run_s": dt / summary.total, "statuses": summary.statuses}


def memory_child(queued: int, seconds: float, cluster: str) -> None:
    import psutil

    from ale.runs.experiment import load_experiment
    from ale.runs.orchestrator import Orchestrator

    proc = psutil.Process()
    base = proc.memory_info().rss
    with tempfile.TemporaryDirectory(prefix="ale-bench-clmem-") as tmp:
        exp = load_experiment(write_experiment(Path(tmp), f"benchclmem-{uuid.uuid4().hex[:8]}", 10, queued // 10, 2))
        orch = Orchestrator(exp, cluster=cluster)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--write", action="store_true", help="write bench/results/cluster.{json,md}")
    ap.add_argument("--memory-child", metavar="CLUSTER", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.queued, args.seconds, args.memory_child)
        return
    with tempfile.TemporaryDirectory(prefix="ale-bench-ray-") as tmp:
        try:
            address = start_cluster(Path(tmp), args.concurrency)
            cluster = f"ray:{address}"
            rounds = []
            for r in range(args.rounds):
                order = ("local", cluster) if r % 2 == 0 else (cluster, "local")
                got = {which: bench_one(args.runs, args.concurrency, which) for which in order}
                loc, cl = got["local"], got[cluster]
                ratio = cl["per_run_s"] / loc["per_run_s"]
                rounds.append((ratio, loc, cl))
                print(f"round {r + 1}: local {loc['per_run_s']:.3f} s/run {loc['statuses']}, "
                      f"cluster {cl['per_run_s']:.3f} s/run {cl['statuses']}: {ratio:.2f}x", flush=True)
            mem = json.loads(subprocess.run(
                [sys.executable, __file__, "--memory-child", cluster, "--queued", str(args.queued),
                 "--seconds", str(args.seconds)], capture_output=True, text=True, check=True,
                env=os.environ, timeout=600).stdout.strip().splitlines()[-1])
        finally:
            stop_cluster()
    rounds.sort(key=lambda x: x[0])
    ratio, loc, cl = rounds[len(rounds) // 2]
    all_ratios = ", ".join(f"{x[0]:.2f}" for x in rounds)
    print(f"per-run overhead: median {ratio:.2f}x [{all_ratios}] (target <= 1.15x)")
    print(f"driver memory with {mem['queued']} units queued on the cluster: peak RSS {mem['rss_peak_mb']:.0f} MB "
          f"(at start {mem['rss_start_mb']:.0f} MB; target <= 300 MB)")
    if args.write:
        import ray

        text = textwrap.dedent(f"""\
            ## Cluster

            `bench/cluster.py` ({time.strftime('%Y-%m-%d')}; Ray {ray.__version__}, {os.cpu_count()} CPUs,
            Python {platform.python_version()}). The no-op experiment of `bench/throughput.py`,
            {args.runs} runs at concurrency {args.concurrency}, in one process: `cluster: local` versus
            a one-node Ray cluster on this machine (`ale node start --head --slots {args.concurrency}`,
            the same engine, token auth on), {args.rounds} interleaved rounds; the median round
            (ratios of all rounds: {all_ratios}).

            | where | runs | seconds | s/run |
            | --- | ---: | ---: | ---: |
            | local | {loc['runs']} | {loc['seconds']:.1f} | {loc['per_run_s']:.3f} |
            | Ray cluster, one node | {cl['runs']} | {cl['seconds']:.1f} | {cl['per_run_s']:.3f} |

            Per-run overhead ratio: **{ratio:.2f}x** (target at most 1.15x). The cluster's seconds
            include joining the cluster (`ray.init`, registering the node) and shipping every
            run folder back as a tar with per-file sha256.

            Driver memory with {mem['queued']:,} units queued on the cluster: peak RSS
            **{mem['rss_peak_mb']:.0f} MB** (interpreter with ale and Ray imported at start:
            {mem['rss_start_mb']:.0f} MB; target at most 300 MB). Ray's daemons and workers are
            separate processes and not counted.
        """)
        figures = {"ratio": ratio, "rounds": [x[0] for x in rounds], "local": loc, "cluster": cl, "memory": mem,
                   "ray": ray.__version__, "runs": args.runs, "concurrency": args.concurrency}
        print("wrote", *publish("cluster", figures, text.split("\n", 2)[2]))


if __name__ == "__main__":
    main()
