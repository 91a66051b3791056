"""Shared public packages: what staging costs a run with and without sharing.

A variant with a large input (default 1 GiB: eight 128 MiB files), a no-op task
and the nop agent; runs interleaved with sharing off (every run copies and hashes
its input) and on (the first run stages the shared entry; the others mount it).
Reports the medians of the phases that stage and hash the input (stage_input,
verify_before, deliverables: the input is hashed after start() and after the run)
and writes them to bench/results/shared_packages.{json,md} (docs/benchmarks.md cites them).

``--scale``: N = 1, 4 and 8 runs of one variant (default 2 GiB) as an experiment
through the orchestrator at concurrency 4, each N with a cold package cache, with
sharing on and off (every run copies its own: the baseline), interleaved in one
process run. Measures the experiment's wall time, the span during which any run
was staging (the union of the runs' stage_input phases), the per-run sums of the
phases that stage and hash, and the disk used under the runs folder and the
package cache (sampled every 0.2 s: peak; du -x, so an overlay is not counted
twice), and writes the ratios N=8 / N=1 to bench/results/shared_packages_scale.{json,md}.

    .venv/bin/python bench/shared_packages.py [--mib 1024] [--repeats 4]
    .venv/bin/python bench/shared_packages.py --scale [--mib 2048] [--ns 1,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from publish import publish  # noqa: E402

from ale.defaults import DEFAULT_TOOLS_IMAGE  # noqa: E402
from ale.plan import AgentSpec, RunPlan  # noqa: E402
from ale.runs.lifecycle import execute_run  # noqa: E402
from ale.sandbox.docker import DockerProvider, connect  # noqa: E402
from ale.sandbox.policy import IsolationPolicy  # noqa: E402

MAIN = '''
import cua_bench as cb

@cb.tasks_config
def load():
    return [cb.Task(description="nothing", task_id="big-0", metadata={"input_dir": "/input", "remote_output_dir": "/workspace",
                                                                      "variant": "base"})]

@cb.evaluate_task
async def evaluate(cfg, session):
    # the task reads its input: the small file, and the head of a large one
    ok = (await session.read_file("/input/check.txt")).strip() == "ale-bench"
    ok = ok and await session.file_exists("/input/part7.bin")
    return [1.0 if ok else 0.0]
'''  # noqa: E501
STAGING = ("stage_input", "verify_before", "deliverables")


def make(root: Path, mib: int) -> Path:
    task = root / "tasks" / "bench" / "big_input"
    task.mkdir(parents=True)
    (task / "main.py").write_text(MAIN)
    (task / "task_card.json").write_text(json.dumps({"title": "big input", "data_source": "local:../../../data"}))
    inp = root / "data" / "tasks" / "bench" / "big_input" / "base" / "input"
    inp.mkdir(parents=True)
    (inp / "check.txt").write_text("ale-bench\n")
    chunk = os.urandom(1024 * 1024)
    for i in range(8):
        with open(inp / f"part{i}.bin", "wb") as f:
            for _ in range(mib // 8):
                f.write(chunk)
    return task


def one(task: Path, runs: Path, provider: DockerProvider, shared: bool) -> dict[str, float]:
    os.environ["ALE_SHARED_PACKAGES"] = "on" if shared else "off"
    plan = RunPlan(run_id=f"s-{uuid.uuid4().hex[:8]}", task_dir=str(task), agent=AgentSpec(name="nop"),
                   image=DEFAULT_TOOLS_IMAGE, policy=IsolationPolicy(memory_bytes=1024**3), runs_dir=str(runs))
    result = asyncio.run(execute_run(plan, provider=provider))
    if result.status.value != "scored" or result.score != 1.0:
        raise SystemExit(f"{plan.run_id}: {result.status.value}: {result.error}")
    times = {p.name: p.seconds for p in result.phases}
    times["total"] = (result.ended_at - result.started_at).total_seconds()
    return times


def du_x(root: Path) -> int:
    """Bytes allocated under ``root`` on its own file system (``du -x``: an overlay
    or tmpfs mounted below is not walked, so a shared package is counted once)."""
    try:
        dev = os.lstat(root).st_dev
    except OSError:
        return 0
    total, seen, stack = 0, set(), [str(root)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_dev != dev or (st.st_ino in seen):
                        continue
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
        except OSError:
            continue
    return total


class DiskSampler:
    """Peak of du -x over some folders, sampled in a thread."""

    def __init__(self, *roots: Path, every: float = 0.2):
        self.roots, self.every, self.peak = roots, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(du_x(r) for r in self.roots))
            self._stop.wait(self.every)

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, sum(du_x(r) for r in self.roots))


def union_seconds(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def experiment(root: Path, task: Path, n: int, shared: bool, concurrency: int) -> dict[str, float]:
    """N runs of the task (nop agent, one variant) through the orchestrator, with a
    cold package cache; what staging cost in time and disk."""
    from ale.runs.experiment import load_experiment
    from ale.runs.orchestrator import Orchestrator

    name = f"scale-{n}-{'shared' if shared else 'copy'}-{uuid.uuid4().hex[:6]}"
    work = root / name
    work.mkdir()
    cache = work / "package-cache"
    os.environ["ALE_PACKAGE_CACHE"] = str(cache)
    os.environ["ALE_SHARED_PACKAGES"] = "on" if shared else "off"
    f = work / "exp.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: {name}
        tasks_root: {task.parent}
        agents: [{{name: nop}}]
        tasks: [{{path: {task.name}}}]
        repeats: {n}
        concurrency: {concurrency}
        environment:
          policy: {{memory_bytes: 1073741824}}
        output: {work / "out"}
    """))
    orch = Orchestrator(load_experiment(f))
    runs = work / "out"
    with DiskSampler(runs, cache) as disk:
        t0 = time.perf_counter()
        summary = asyncio.run(orch.run())
        wall = time.perf_counter() - t0
    results = [json.loads(p.read_text()) for p in runs.glob("runs/*/result.json")]
    if summary.statuses != {"scored": n} or any(r.get("score") != 1.0 for r in results if r["status"] == "scored"):
        # kept in the numbers (the run staged like the others), said in the output
        print(f"{name}: {summary.statuses}: " + "; ".join(f"{r['run_id']}: {r.get('error')} {r.get('violations')}"
                                                        for r in results if r["status"] != "scored"), flush=True)
    shared_keys = {json.loads(p.read_text()).get("shared_package", {}).get("key")
                   for p in runs.glob("runs/*/evidence/input-staged.json")}
    if shared != (None not in shared_keys) or (shared and len(shared_keys) != 1):
        raise SystemExit(f"{name}: shared package keys {shared_keys}")
    spans, sums = [], {k: 0.0 for k in STAGING}
    for r in results:
        for ph in r["phases"]:
            if ph["name"] in sums:
                sums[ph["name"]] += ph["seconds"]
            if ph["name"] == "stage_input":
                spans.append((datetime.fromisoformat(ph["started_at"]).timestamp(),
                              datetime.fromisoformat(ph["ended_at"]).timestamp()))
    span = union_seconds(spans)
    build = 0.0
    if shared:  # the entry's build: from the first run's staging start to the entry's creation
        created = {json.loads(p.read_text())["shared_package"]["created_at"]
                   for p in runs.glob("runs/*/evidence/input-staged.json")}
        if len(created) != 1:
            raise SystemExit(f"{name}: the shared entry was built {len(created)} times")
        build = datetime.fromisoformat(created.pop()).timestamp() - min(a for a, _ in spans)
    row = {"wall": wall, "staging_span": span, "build": build, "beyond_build": span - build, "disk_peak": disk.peak,
           **{f"sum_{k}": v for k, v in sums.items()}, "max_in_flight": orch.max_in_flight,
           "scored": summary.statuses.get("scored", 0)}
    from ale.sandbox.scratch import remove_tree
    remove_tree(work)
    return row


def scale(args: argparse.Namespace) -> None:
    ns = [int(x) for x in args.ns.split(",")]
    with tempfile.TemporaryDirectory(prefix="ale-bench-scale-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        task = make(root, args.mib)
        samples: dict[tuple[str, int], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            for i, n in enumerate(ns):
                # alternate which mode goes first, so drift favours neither
                for mode in (("copy", "shared") if (i + r) % 2 == 0 else ("shared", "copy")):
                    os.sync()  # the previous experiment's writes flushed: they do not slow this one's
                    time.sleep(2)
                    row = experiment(root, task, n, mode == "shared", args.concurrency)
                    samples.setdefault((mode, n), []).append(row)
                    print(f"round {r + 1} {mode:6} N={n}: " + ", ".join(
                        f"{k} {v / 2**20:.0f} MiB" if k.startswith("disk") else f"{k} {v:.2f}"
                        for k, v in row.items()), flush=True)
    rows = {k: {key: statistics.median(x[key] for x in v) for key in v[0]} for k, v in samples.items()}
    lo, hi = ns[0], ns[-1]

    def ratio(mode: str, key: str) -> float:
        return rows[(mode, hi)][key] / max(rows[(mode, lo)][key], 1e-9)

    lines = [
        "### N runs of one variant",
        "",
        f"`bench/shared_packages.py --scale` ({time.strftime('%Y-%m-%d')}): a {args.mib} MiB variant, N "
        f"runs of it with the nop agent as one experiment through the orchestrator at concurrency {args.concurrency} "
        "(its evaluate() reads the input), each N with a cold package cache and the page cache's dirty data flushed "
        f"first, sharing on and off interleaved in one process run, {args.rounds} round(s), medians. Staging span: the "
        "time during which any run was in `stage_input` (a run waiting for the shared entry's build included); Σ: the "
        "runs' phase times summed; disk: the peak of `du -x` over the runs folder and the package cache, sampled every "
        "0.2 s.",
        "",
        "| mode | N | experiment (s) | staging span (s) | of it the entry's build (s) | Σ stage_input (s) "
        "| Σ verify_before (s) | Σ deliverables (s) | peak disk (MiB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in ("copy", "shared"):
        for n in ns:
            r = rows[(mode, n)]
            lines.append(f"| {'each run copies' if mode == 'copy' else 'shared package'} | {n} | {r['wall']:.1f} | "
                         f"{r['staging_span']:.1f} | {r['build']:.1f} | {r['sum_stage_input']:.1f} | "
                         f"{r['sum_verify_before']:.1f} | {r['sum_deliverables']:.1f} | {r['disk_peak'] / 2**20:.0f} |")
    lines += [
        "",
        f"N={hi} / N={lo} (target ≤ 1.2 for staging time and disk): "
        f"shared package: staging span **{ratio('shared', 'staging_span'):.2f}x** (staging beyond the one build: "
        f"{rows[('shared', lo)]['beyond_build']:.1f} s at N={lo}, "
        f"{rows[('shared', hi)]['beyond_build']:.1f} s at N={hi}), disk **{ratio('shared', 'disk_peak'):.2f}x**, "
        f"whole experiment {ratio('shared', 'wall'):.2f}x; each run copies: staging span "
        f"{ratio('copy', 'staging_span'):.2f}x, disk {ratio('copy', 'disk_peak'):.2f}x, whole experiment "
        f"{ratio('copy', 'wall'):.2f}x.",
        "",
    ]
    print("\n".join(lines))
    if not args.no_write:
        print("wrote", *publish("shared_packages_scale", {"rows": {f"{m} {n}": r for (m, n), r in rows.items()}},
                                "\n".join(lines[1:] if lines[0].startswith("#") else lines)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=None, help="the input's size (default 1024; 2048 with --scale)")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--scale", action="store_true", help="N runs of one variant at --concurrency, shared and copied")
    ap.add_argument("--ns", default="1,4,8")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="--scale: rounds, medians reported")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("shared packages need root (overlay mounts)")
    if args.scale:
        args.mib = args.mib or 2048
        scale(args)
        return
    args.mib = args.mib or 1024
    provider = DockerProvider(connect())
    with tempfile.TemporaryDirectory(prefix="ale-bench-share-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        os.environ["ALE_PACKAGE_CACHE"] = str(root / "cache")
        task = make(root, args.mib)
        first = one(task, root / "runs", provider, True)  # builds the shared entry
        off: list[dict[str, float]] = []
        on: list[dict[str, float]] = []
        for _ in range(args.repeats):
            off.append(one(task, root / "runs", provider, False))
            on.append(one(task, root / "runs", provider, True))

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in rows)

    staging_off = med(off, "stage_input") + med(off, "verify_before") + med(off, "deliverables")
    staging_on = med(on, "stage_input") + med(on, "verify_before") + med(on, "deliverables")
    lines = [
        "## Shared public packages",
        "",
        f"`bench/shared_packages.py`: a {args.mib} MiB input, the nop agent, {args.repeats} interleaved repeats "
        "each way, medians (seconds).",
        "",
        "| phase | each run stages its own | shared package (later runs) | first run (builds the entry) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key in (*STAGING, "total"):
        lines.append(f"| {key} | {med(off, key):.3f} | {med(on, key):.3f} | {first.get(key, 0.0):.3f} |")
    lines += ["", f"Staging and hashing per run: **{staging_off:.2f} s → {staging_on:.2f} s** "
                  f"({staging_off / max(staging_on, 1e-6):.0f}x less), and no per-run copy on disk.", ""]
    print("\n".join(lines))
    if not args.no_write:
        figures = {"mib": args.mib, "repeats": args.repeats, "first": first, "copied": off, "shared": on}
        print("wrote", *publish("shared_packages", figures, "\n".join(lines[2:])))


if __name__ == "__main__":
    main()
