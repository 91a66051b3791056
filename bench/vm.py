"""The qemu provider against the Docker provider on the same task, interleaved in one
run (these machines are noisy: only the ratios mean much): a whole `files/word_count`
oracle run under each (the VM booted, and restored from a saved booted guest:
``ALE_QEMU_BOOT=warm``, whose one-time save is made before the timed runs), its provision
phase (create + boot to ready: for a VM, QEMU launched until ale's guest agent answers), the
seal's own cost (the verify cost the run records), and the disk a VM run adds (its overlay,
the only per-run file; the base is shared and read-only). Writes bench/results/vm.{json,md}
(docs/benchmarks.md cites them).

    .venv/bin/python bench/vm.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
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
from ale.plan import AgentSpec, Limits, RunPlan  # noqa: E402
from ale.runs.lifecycle import execute_run  # noqa: E402
from ale.sandbox.docker import DockerProvider, connect  # noqa: E402
from ale.sandbox.policy import MIB, IsolationPolicy  # noqa: E402
from ale.sandbox.qemu.image import build_vm_image, vm_root  # noqa: E402
from ale.sandbox.qemu.provider import QemuProvider  # noqa: E402
from ale.sandbox.qemu.sandbox import state_root  # noqa: E402

TASK = HERE.parent / "examples" / "tasks" / "files" / "word_count"
POLICY = IsolationPolicy(memory_bytes=768 * MIB, cpus=1.0)


def _overlay_bytes() -> int:
    """The largest overlay of a live VM (sampled during the run)."""
    best = 0
    for p in state_root().glob("*/overlay.qcow2") if state_root().is_dir() else []:
        with contextlib.suppress(OSError):
            best = max(best, os.stat(p).st_blocks * 512)
    return best


async def one(kind: str, runs: Path) -> dict:
    vm = kind.startswith("qemu")
    provider = QemuProvider(accel="tcg", boot="warm" if kind == "qemu-warm" else "cold") if vm \
        else DockerProvider(connect())
    plan = RunPlan(run_id=f"bench-vm-{kind}-{uuid.uuid4().hex[:8]}", task_dir=str(TASK),
                   agent=AgentSpec(name="oracle"), image="ale-vm:latest" if vm else DEFAULT_TOOLS_IMAGE,
                   policy=POLICY, limits=Limits(), runs_dir=str(runs), provider="qemu" if vm else kind,
                   experiment="bench-vm")
    overlay = 0
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal overlay
        while not stop.is_set():
            overlay = max(overlay, await asyncio.to_thread(_overlay_bytes))
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample()) if vm else None
    t0 = time.perf_counter()
    result = await execute_run(plan, provider=provider)
    wall = time.perf_counter() - t0
    stop.set()
    if sampler is not None:
        await sampler
    phases = {p["name"]: p for p in json.loads((plan.run_dir / "evidence" / "phases.json").read_text())}

    def dur(name: str) -> float | None:
        p = phases.get(name)
        if not p:
            return None
        from datetime import datetime

        return round((datetime.fromisoformat(p["ended_at"])
                      - datetime.fromisoformat(p["started_at"])).total_seconds(), 2)

    return {"kind": kind, "status": result.status.value, "score": result.score, "run_s": round(wall, 2),
            "provision_s": dur("provision"), "verify_before_s": dur("verify_before"), "stop_s": dur("stop"),
            "verify_cost_s": (result.extra.get("costs") or {}).get("verify"), "overlay_bytes": overlay or None}


def med(rows: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return round(statistics.median(xs), 2) if xs else None


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("ALE_QEMU_ACCEL", "tcg")
    build_vm_image(say=lambda m: print(m, flush=True))
    kinds = ("docker", "qemu", "qemu-warm")
    rows: dict[str, list[dict]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="ale-bench-vm-") as tmp:
        print("saving the booted guest for qemu-warm (once, not timed):", (await one("qemu-warm", Path(tmp)))["status"])
        for _ in range(args.repeats):
            for kind in kinds:
                row = await one(kind, Path(tmp))
                rows[kind].append(row)
                print(row, flush=True)
    figures: dict = {kind: {"runs": r, **{k: med(r, k) for k in ("run_s", "provision_s", "verify_before_s", "stop_s",
                                                                  "verify_cost_s", "overlay_bytes")}}
                     for kind, r in rows.items()}
    d = figures["docker"]
    keys = ("run_s", "provision_s", "verify_before_s", "stop_s", "verify_cost_s")

    def over(a: dict, b: dict) -> dict:
        return {k: round(a[k] / b[k], 2) if a.get(k) and b.get(k) else None for k in keys}

    ratio = figures["qemu_over_docker"] = over(figures["qemu"], d)
    warm = figures["qemu_warm_over_docker"] = over(figures["qemu-warm"], d)
    cut = figures["qemu_warm_over_qemu"] = over(figures["qemu-warm"], figures["qemu"])
    figures["vm_guest"] = str(vm_root())
    lines = ["| | whole run | provision (create, boot to ready) | verify before | stop step | seal's own cost | "
             "disk per run |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for kind in kinds:
        f = figures[kind]
        disk = f"{f['overlay_bytes'] / 2**20:.1f} MiB (overlay)" if f.get("overlay_bytes") else "the container's layer"
        lines.append(f"| {kind} (median of {len(rows[kind])}) | {f['run_s']} s | {f['provision_s']} s | "
                     f"{f['verify_before_s']} s | {f['stop_s']} s | {f['verify_cost_s']} s | {disk} |")
    for name, r in (("qemu / docker", ratio), ("qemu-warm / docker", warm), ("qemu-warm / qemu", cut)):
        lines.append(f"| {name} | {r['run_s']}x | {r['provision_s']}x | {r['verify_before_s']}x | "
                     f"{r['stop_s']}x | {r['verify_cost_s']}x | |")
    statuses = sorted({(r["kind"], r["status"], r["score"]) for rs in rows.values() for r in rs})
    lines.append("")
    lines.append(f"Every run: {statuses} (TCG here: KVM does not run a guest on this nested host).")
    publish("vm", figures, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
