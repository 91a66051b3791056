"""Shared public packages: what staging costs a run with and without sharing.

A variant with a large input (default 1 GiB: eight 128 MiB files), a no-op task
and the nop agent; runs interleaved with sharing off (every run copies and hashes
its input) and on (the first run stages the shared entry; the others mount it).
Reports the medians of the phases that stage and hash the input (stage_input,
verify_before, deliverables: the input is hashed after start() and after the run)
and writes them into docs/benchmarks.md under "## Shared public packages".

    .venv/bin/python bench/shared_packages.py [--mib 1024] [--repeats 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

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
    return [0.0]
'''
STAGING = ("stage_input", "verify_before", "deliverables")


def make(root: Path, mib: int) -> Path:
    task = root / "tasks" / "bench" / "big_input"
    task.mkdir(parents=True)
    (task / "main.py").write_text(MAIN)
    (task / "task_card.json").write_text(json.dumps({"title": "big input", "data_source": "local:../../../data"}))
    inp = root / "data" / "tasks" / "bench" / "big_input" / "base" / "input"
    inp.mkdir(parents=True)
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
    if result.status.value != "scored":
        raise SystemExit(f"{plan.run_id}: {result.status.value}: {result.error}")
    times = {p.name: p.seconds for p in result.phases}
    times["total"] = (result.ended_at - result.started_at).total_seconds()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("shared packages need root (overlay mounts)")
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
        doc = HERE.parent / "docs" / "benchmarks.md"
        text = doc.read_text()
        section = "\n".join(lines).rstrip("\n")
        pattern = re.compile(r"## Shared public packages\n.*?(?=\n## |\Z)", re.S)
        text = pattern.sub(section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section + "\n"
        doc.write_text(text)


if __name__ == "__main__":
    main()
