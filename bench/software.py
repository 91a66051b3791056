"""What a cached task environment adds to a run, against the tools image.

The same no-op task (its evaluate() returns 0 at once; the nop agent) declares
software on its card (pandas, jq: an environment image, built once before timing),
and is run interleaved with provisioning on (its cached environment image) and off
(the tools image), in one process. Reports the medians and their ratio (target: at
most 1.05) and writes them to bench/results/software.{json,md} (docs/benchmarks.md cites them).

    .venv/bin/python bench/software.py [--repeats 10]
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
from ale.runs.lifecycle import execute_run  # noqa: E402
from ale.runs.software import build_for, resolve  # noqa: E402
from ale.sandbox.docker import DockerProvider, connect  # noqa: E402
from ale.sandbox.policy import IsolationPolicy  # noqa: E402

MAIN = '''
import cua_bench as cb

@cb.tasks_config
def load():
    return [cb.Task(description="nothing", task_id="noop-0", metadata={"input_dir": "/input", "remote_output_dir": "/workspace"})]

@cb.evaluate_task
async def evaluate(cfg, session):
    return [0.0]
'''  # noqa: E501


def make_task(root: Path) -> Path:
    task = root / "noop_software"
    task.mkdir()
    (task / "main.py").write_text(MAIN)
    (task / "task_card.json").write_text(json.dumps({"title": "no-op", "software": ["pandas", "jq"]}))
    return task


async def one(task: Path, runs: Path, provider: DockerProvider, software: bool) -> float:
    plan = RunPlan(run_id=f"b-{uuid.uuid4().hex[:10]}", task_dir=str(task), agent=AgentSpec(name="nop"),
                   image=DEFAULT_TOOLS_IMAGE, policy=IsolationPolicy(memory_bytes=1024**3), runs_dir=str(runs),
                   provision_software=software)
    t0 = time.perf_counter()
    result = await execute_run(plan, provider=provider)
    elapsed = time.perf_counter() - t0
    if result.status.value != "scored":
        raise SystemExit(f"run {plan.run_id} ended {result.status.value}: {result.error}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    client = connect()
    provider = DockerProvider(client)
    with tempfile.TemporaryDirectory(prefix="ale-bench-sw-") as tmp:
        root = Path(tmp)
        task = make_task(root)
        t0 = time.perf_counter()
        image, doc = build_for(resolve(task, input_dir=None, overlay=None), DEFAULT_TOOLS_IMAGE, print)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        build_for(resolve(task, input_dir=None, overlay=None), DEFAULT_TOOLS_IMAGE, lambda _: None)
        lookup = time.perf_counter() - t0
        on: list[float] = []
        off: list[float] = []
        asyncio.run(one(task, root / "warm", provider, True))  # warm both paths once
        asyncio.run(one(task, root / "warm", provider, False))
        for _ in range(args.repeats):
            on.append(asyncio.run(one(task, root / "runs", provider, True)))
            off.append(asyncio.run(one(task, root / "runs", provider, False)))
    m_on, m_off = statistics.median(on), statistics.median(off)
    ratio = m_on / m_off
    size_mb = (doc.get("size") or 0) / 1e6
    lines = [
        "## Task environments",
        "",
        f"`bench/software.py`, {args.repeats} interleaved repeats, medians: a no-op task whose card declares "
        "pandas and jq, run with its cached environment image against the same task on the tools image.",
        "",
        "| what | seconds |",
        "| --- | --- |",
        f"| run on the tools image (`--no-software`) | {m_off:.3f} |",
        f"| run on its cached environment image | {m_on:.3f} |",
        f"| finding the cached image (resolve needs + lookup) | {lookup:.3f} |",
        f"| first build of that image (this run of the bench; cached if built before) | {first:.1f} |",
        "",
        f"Ratio environment / tools image: **{ratio:.3f}x** (target at most 1.05). Image `{image}`, "
        f"{size_mb:.0f} MB.",
        "",
    ]
    print("\n".join(lines))
    if not args.no_write:
        figures = {"repeats": args.repeats, "tools_image_s": m_off, "env_image_s": m_on, "ratio": ratio,
                   "lookup_s": lookup, "first_build_s": first, "image": image, "size_mb": size_mb}
        print("wrote", *publish("software", figures, "\n".join(lines[2:])))


if __name__ == "__main__":
    main()
