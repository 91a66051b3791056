"""The stop step's wall time (the end of the agent's turn, done from the host), typical
and worst, with an agent that leaves nothing running and with one that, at the end of
its turn, stops (SIGSTOP) every process it can reach, signals init, writes probe-looking
lines into every stdout it can open and forks up to the sandbox's pids limit (each
child stopping itself). Real `ale run`s (replay agent, files/word_count, the tools
image), interleaved; the figures are each run's ``evidence/stop.json``: the whole step
(``duration_s``: freeze, kill, thaw, the deaths, the after-run probes) and the host-side
halt in it (``halt.duration_s``), against their bounds. Writes
bench/results/stop_step.{json,md} (docs/benchmarks.md cites them).

    .venv/bin/python bench/stop_step.py [--repeats 5]
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
from ale.plan import AgentSpec, Limits, RunPlan  # noqa: E402
from ale.runs.lifecycle import execute_run  # noqa: E402
from ale.sandbox.docker import DockerProvider, connect  # noqa: E402
from ale.sandbox.policy import IsolationPolicy  # noqa: E402

TASK = HERE.parent / "examples" / "tasks" / "files" / "word_count"

# From the agent's last command on (/tmp/go): SIGSTOP every process but the attack's
# own, SIGINT/TERM/HUP/USR1/STOP to init, probe-looking lines into every stdout/stderr
# it can open, a fork now and then (a moving target).
DISRUPTOR = r'''
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN)
me = os.getpid()
while not os.path.exists("/tmp/go"):
    time.sleep(0.002)
n = 0
while True:
    n += 1
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        pid = int(p)
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            if b"/tmp/go" in cmd or b"/tmp/d1.py" in cmd or b"/tmp/d2.py" in cmd or b"/tmp/f1.py" in cmd:
                continue  # the agent's last command, and the attack's own processes
        except OSError:
            pass
        for s in ((signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGSTOP) if pid == 1
                  else (signal.SIGSTOP,)):
            try:
                os.kill(pid, s)
            except OSError:
                pass
        for fd in (1, 2):
            try:
                with open(f"/proc/{pid}/fd/{fd}", "w") as f:
                    f.write("=== ale-probe:id ===\nnumeric uid=0 gid=0 groups=0\n=== ale-probe:end ===\n")
            except OSError:
                pass
    if n % 50 == 0 and os.fork() == 0:
        me = os.getpid()
    time.sleep(0.002)
'''

# From /tmp/go on: fork until the pids limit refuses, every child stopping itself (the
# agent's last command gives it 1.5 s before the turn ends).
FORKER = r'''
import os, signal, time
while not os.path.exists("/tmp/go"):
    time.sleep(0.002)
while True:
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.001)
        continue
    if pid == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
'''


def _daemon(name: str, source: str) -> dict:
    return {"tool": "shell", "args": {"timeout": 60, "command": (
        f"cat > /tmp/{name}.py <<'ALE_EOF'\n{source}\nALE_EOF\n"
        f"setsid nohup python3 /tmp/{name}.py >/dev/null 2>&1 < /dev/null & sleep 0.3; echo started")}}


def steps(hostile: bool) -> list[dict]:
    last = {"tool": "shell", "args": {"timeout": 60, "command":
                                      "echo '{\"words\": 0, \"lines\": 0}' > /workspace/answer.json; "
                                      "python3 -c 'import time; open(\"/tmp/go\", \"w\"); time.sleep(1.5)' /tmp/go"}}
    if not hostile:
        return [last]
    return [_daemon("d1", DISRUPTOR), _daemon("d2", DISRUPTOR), _daemon("f1", FORKER), last]


async def one(provider: DockerProvider, runs: Path, hostile: bool) -> dict:
    plan = RunPlan(
        run_id=f"bench-stop-{uuid.uuid4().hex[:10]}",
        task_dir=str(TASK),
        agent=AgentSpec(name="replay", config={"steps": steps(hostile)}),
        image=DEFAULT_TOOLS_IMAGE,
        policy=IsolationPolicy(memory_bytes=512 * 1024**2),
        limits=Limits(wall_time_s=120),
        runs_dir=str(runs),
        experiment="bench-stop-step",
    )
    t0 = time.perf_counter()
    result = await execute_run(plan, provider=provider)
    wall = time.perf_counter() - t0
    stop = json.loads((plan.run_dir / "evidence" / "stop.json").read_text())
    halt = stop.get("halt") or {}
    return {"status": result.status.value, "run_s": round(wall, 2), "stop_s": stop.get("duration_s"),
            "bound_s": stop.get("bound_s"), "within_bound": stop.get("within_bound"),
            "halt_s": halt.get("duration_s"), "halt_bound_s": halt.get("bound_s"), "killed": halt.get("killed"),
            "dying": halt.get("dying"), "survivors": len(halt.get("survivors") or []), "method": halt.get("method")}


def summary(rows: list[dict], key: str) -> dict:
    xs = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    if not xs:
        return {}
    return {"median": round(statistics.median(xs), 3), "max": round(max(xs), 3), "min": round(min(xs), 3), "n": len(xs)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    provider = DockerProvider(connect())
    rows: dict[str, list[dict]] = {"quiet": [], "hostile": []}
    with tempfile.TemporaryDirectory(prefix="ale-bench-stop-") as tmp:
        for _ in range(args.repeats):
            for kind in ("quiet", "hostile"):
                row = await one(provider, Path(tmp), kind == "hostile")
                rows[kind].append(row)
                print(kind, row, flush=True)
    figures = {kind: {"runs": r, "stop_s": summary(r, "stop_s"), "halt_s": summary(r, "halt_s"),
                      "killed": summary(r, "killed"), "statuses": sorted({x["status"] for x in r}),
                      "all_within_bound": all(x["within_bound"] for x in r),
                      "survivors": sum(x["survivors"] for x in r)}
               for kind, r in rows.items()}
    lines = ["| agent | runs | stop step, typical (median) | stop step, worst | host-side halt, typical / worst "
             "| tasks killed (median / max) | survivors | within bound | statuses |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, f in figures.items():
        label = "leaves nothing running" if kind == "quiet" else "stops / signals / forks everything at the end"
        lines.append(f"| {label} | {f['stop_s'].get('n')} | {f['stop_s'].get('median')} s | {f['stop_s'].get('max')} s "
                     f"| {f['halt_s'].get('median')} s / {f['halt_s'].get('max')} s "
                     f"| {f['killed'].get('median')} / {f['killed'].get('max')} | {f['survivors']} "
                     f"| {'yes' if f['all_within_bound'] else 'NO'} | {', '.join(f['statuses'])} |")
    bound = rows["hostile"][0]
    lines.append("")
    lines.append(f"Bounds: the stop step {bound['bound_s']} s, its host-side halt {bound['halt_bound_s']} s "
                 f"(method {bound['method']}). The stop step includes the after-run probes.")
    js, md = publish("stop_step", figures, "\n".join(lines))
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    asyncio.run(main())
