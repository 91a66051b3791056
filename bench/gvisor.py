"""runsc (gVisor) against runc, as ratios measured in one run, interleaved:

- a whole run: `ale run examples/tasks/files/word_count --agent oracle --no-software`
  (preflight to signed record, every check and probe);
- one tool call: a `sh -c 'echo ok'` exec in a running sandbox (the agent's tool path);
- sandbox start: create + start of a sealed sandbox (tools image);
- a desktop screenshot through the computer tool (1024x768), when the desktop image is there.

Writes the numbers to bench/results/gvisor.{json,md} (docs/benchmarks.md cites them).
The engine (DOCKER_HOST or the local socket) must have runsc registered.

    .venv/bin/python bench/gvisor.py [--runs 3] [--calls 30] [--shots 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))

from publish import publish  # noqa: E402

from ale.sandbox.base import Mount, SandboxSpec  # noqa: E402
from ale.sandbox.computer import Computer  # noqa: E402
from ale.sandbox.desktop import DEFAULT_DESKTOP_IMAGE, Desktop  # noqa: E402
from ale.sandbox.docker import DockerProvider, DockerSandbox, connect  # noqa: E402
from ale.sandbox.policy import MIB, IsolationPolicy  # noqa: E402

RUNTIMES = ("runc", "runsc")
TASK = REPO / "examples" / "tasks" / "files" / "word_count"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def whole_run(runtime: str, runs_dir: Path) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([str(REPO / ".venv" / "bin" / "ale"), "run", str(TASK), "--agent", "oracle", "--no-software",
                        "--runs-dir", str(runs_dir), "--runtime", runtime], capture_output=True, text=True)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"ale run under {runtime} failed: {r.stderr[-2000:]}")
    return took


def spec(root: Path, image: str, policy: IsolationPolicy) -> SandboxSpec:
    ws, inp = root / f"ws-{uuid.uuid4().hex[:6]}", root / f"in-{uuid.uuid4().hex[:6]}"
    ws.mkdir()
    inp.mkdir()
    ws.chmod(0o777)
    return SandboxSpec(name=f"ale-bench-gvisor-{uuid.uuid4().hex[:8]}", image=image, policy=policy,
                       mounts=(Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)),
                       labels={"ale.bench": "gvisor"}, workdir="/workspace")


async def calls(provider: DockerProvider, runtime: str, root: Path, n: int) -> tuple[float, list[float]]:
    policy = IsolationPolicy(memory_bytes=1024 * MIB).with_runtime(runtime)
    t0 = time.perf_counter()
    box = await provider.create(spec(root, "ale-tools:latest", policy))
    try:
        await box.start()
        start = time.perf_counter() - t0
        out = []
        for _ in range(n):
            t = time.perf_counter()
            r = await box.exec(["sh", "-c", "echo ok"], timeout=30)
            out.append(time.perf_counter() - t)
            assert r.stdout == b"ok\n", r
        return start, out
    finally:
        await box.remove()


async def shots(client, runtime: str, root: Path, n: int) -> list[float]:
    policy = IsolationPolicy().with_runtime(runtime)
    box = DockerSandbox.create(client, spec(root, DEFAULT_DESKTOP_IMAGE, policy))
    try:
        await box.start()
        desk = Desktop(box)
        await desk.start()
        comp = Computer(desk)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            shot = await comp.act({"action": "screenshot"})
            out.append(time.perf_counter() - t)
            assert shot.image, shot
        return out
    finally:
        await box.remove()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--shots", type=int, default=10)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    client = connect()
    provider = DockerProvider(client)
    provider.require_runtime("runsc")
    root = Path(tempfile.mkdtemp(prefix="ale-bench-gvisor-"))
    res: dict[str, dict[str, list[float]]] = {rt: {"run": [], "start": [], "call": [], "shot": []} for rt in RUNTIMES}
    desktop = True
    try:
        client.images.get(DEFAULT_DESKTOP_IMAGE)
    except Exception:
        desktop = False
    for i in range(a.runs):
        for rt in (RUNTIMES if i % 2 == 0 else RUNTIMES[::-1]):  # interleaved: load drifts hit both
            res[rt]["run"].append(whole_run(rt, root / "runs"))
            start, cs = asyncio.run(calls(provider, rt, root, a.calls))
            res[rt]["start"].append(start)
            res[rt]["call"] += cs
            if desktop and i == 0:
                try:
                    res[rt]["shot"] += asyncio.run(shots(client, rt, root, a.shots))
                except Exception as e:  # reported, not hidden
                    res[rt]["shot_error"] = [repr(e)]  # type: ignore[list-item]
    summary = {}
    for key, what in (("run", "whole run (word_count, oracle)"), ("start", "sandbox create + start"),
                      ("call", "one tool call (exec `echo ok`)"), ("shot", "desktop screenshot (1024x768)")):
        c, g = med(res["runc"][key]), med(res["runsc"][key])
        summary[key] = {"what": what, "runc_ms": round(c * 1000, 1), "runsc_ms": round(g * 1000, 1),
                        "ratio": round(g / c, 2) if c == c and g == g else None,
                        "n": [len(res["runc"][key]), len(res["runsc"][key])]}
    errors = {rt: res[rt].get("shot_error") for rt in RUNTIMES if res[rt].get("shot_error")}
    load = os.getloadavg()[0]
    print(json.dumps({"summary": summary, "errors": errors, "load_1m": load}, indent=1))
    if not a.no_write:
        write(summary, errors, load)


def write(summary: dict, errors: dict, load: float) -> None:
    rows = ["| what | runc (median) | runsc (median) | runsc / runc | n (runc, runsc) |",
            "| --- | --- | --- | --- | --- |"]
    for s in summary.values():
        ratio = f"{s['ratio']:.2f}x" if s["ratio"] is not None else "not measured"
        rows.append(f"| {s['what']} | {s['runc_ms']} ms | {s['runsc_ms']} ms | {ratio} | {s['n'][0]}, {s['n'][1]} |")
    body = ["`bench/gvisor.py`: the same work under both runtimes in one run, interleaved, on one engine",
            f"(Debian's runsc 0.0~20221219, ptrace platform; 2 cores, 1-minute load {load:.1f} while measured:",
            "other engineers' tests ran on the machine, so read the ratios, not the times).", "", *rows]
    if errors:
        body += ["", f"Errors: {json.dumps(errors)}"]
    print("wrote", *publish("gvisor", {"summary": summary, "errors": errors, "load_1m": load}, "\n".join(body)))

if __name__ == "__main__":
    main()
