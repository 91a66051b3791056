"""A named harness's start-up, native against bridge, and what its heaviest features
use of the sandbox's limits.

Start-up (default): for each CLI (claude-code, codex, gemini-cli), whole runs of
examples/tasks/files/word_count in ``native`` mode (the harness inside the sealed
sandbox, its only way out the exec channel) and in ``bridge`` mode (outside,
confined with bubblewrap, the four MCP tools), interleaved (native, bridge, native,
...), against tests/fake_model_api.py answering with one shell call. Per run: the
time from the agent phase's start (``phase.start`` in events.jsonl) to the gateway's
first model request (its record's ``time``), the agent phase, and the whole run
(result.json's ``started_at`` to ``ended_at``). Medians of ``--repeats``, and the
ratio native / bridge.

    .venv/bin/python bench/harness_startup.py [--repeats 3] [--harness claude-code ...]

Limits (``--limits``): one native run per CLI in which the fake model makes the
harness use its heaviest features (``tests.fake_model_api.heavy_script``: Claude Code
two sub-agents that each run Bash and Grep, three parallel Bash calls, Grep and
Glob; Codex four parallel exec_command calls; Gemini CLI three parallel shell calls,
glob, search and read_file), at the default policy; the sandbox's peak pids, memory
and /tmp against its limits, as the run records them (agent/confinement.json's
``resources``). ``--pids N`` / ``--memory-mib N`` run them under a tighter limit
instead, with the rule that would refuse such a policy (``HarnessAgent.fit_policy``)
switched off, to see how the harness itself fails there.

Prints Markdown tables for docs/benchmarks.md ("## Native harness channel").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent))

import docker  # noqa: E402
from tests.fake_model_api import FakeModelAPI, heavy_script  # noqa: E402
from tests.test_harness_native import ANSWER  # noqa: E402

from ale.plan import AgentSpec, Limits, RunPlan  # noqa: E402
from ale.runs.lifecycle import execute_run  # noqa: E402
from ale.sandbox.docker import DockerProvider  # noqa: E402
from ale.sandbox.policy import MIB, IsolationPolicy  # noqa: E402

TASK = HERE.parent / "examples" / "tasks" / "files" / "word_count"
HARNESS_NAMES = ("claude-code", "codex", "gemini-cli")
MODELS = {"claude-code": ("claude-fake-1", "ALE_GATEWAY_ANTHROPIC_UPSTREAM", ""),
          "codex": ("gpt-fake-1", "ALE_GATEWAY_OPENAI_UPSTREAM", "/v1"),
          "gemini-cli": ("gemini-fake-1", "ALE_GATEWAY_GEMINI_UPSTREAM", "")}


def plan_for(harness: str, mode: str, api: FakeModelAPI, runs: Path, policy: IsolationPolicy,
             wall_s: float = 600) -> RunPlan:
    model, var, suffix = MODELS[harness]
    cfg = {"mode": mode, "model": model, var: api.url + suffix,
           "prices": {model: {"input_per_mtok": 1.0, "output_per_mtok": 10.0}}}
    return RunPlan(run_id=f"hs-{harness}-{mode}-{uuid.uuid4().hex[:8]}", task_dir=str(TASK), variant=0,
                   agent=AgentSpec(name=harness, config=cfg), policy=policy, runs_dir=str(runs),
                   signing_key=str(runs / "key.pem"), limits=Limits(wall_time_s=wall_s))


def _time(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def timings(run_dir: Path) -> dict[str, float]:
    """Seconds: agent start to first model request, the agent phase, the whole run."""
    from ale.agents.gateway.record import read_records

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    phase = {(e["type"], e["data"].get("phase")): _time(e["time"]) for e in events if e["type"].startswith("phase.")}
    start, end = phase[("phase.start", "agent")], phase[("phase.end", "agent")]
    records, _ = read_records(run_dir)
    first = min(_time(r["time"]) for r in records if r.get("type") == "request" and r.get("model_call"))
    result = json.loads((run_dir / "result.json").read_text())
    return {"first_request_s": first - start, "agent_s": end - start,
            "run_s": _time(result["ended_at"]) - _time(result["started_at"])}


def run_one(plan: RunPlan, provider: DockerProvider) -> tuple[Any, Path]:
    result = asyncio.run(execute_run(plan, provider=provider))
    return result, plan.run_dir


def startup(harnesses: list[str], repeats: int, provider: DockerProvider, runs: Path) -> None:
    api = FakeModelAPI(native_command=ANSWER, command=ANSWER).start()
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    try:
        for harness in harnesses:  # one warm-up each (images, caches), not counted
            for mode in ("native", "bridge"):
                result, _ = run_one(plan_for(harness, mode, api, runs,
                                             IsolationPolicy(memory_bytes=2 * 1024**3)), provider)
                print(f"  {harness} {mode} warm-up: {result.status.value} {result.score} {(result.error or '')[:300]}",
                      file=sys.stderr)
        for i in range(repeats):
            for harness in harnesses:
                for mode in ("native", "bridge") if i % 2 == 0 else ("bridge", "native"):
                    result, run_dir = run_one(plan_for(harness, mode, api, runs,
                                                       IsolationPolicy(memory_bytes=2 * 1024**3)), provider)
                    if result.status.value != "scored" or result.score != 1.0:  # left out of the medians, said
                        print(f"  {harness} {mode} #{i + 1}: {result.status.value} {result.score} {result.error}",
                              file=sys.stderr)
                        continue
                    t = timings(run_dir)
                    rows.setdefault((harness, mode), []).append(t)
                    print(f"  {harness} {mode} #{i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()),
                          file=sys.stderr)
    finally:
        api.stop()
    print("| harness | agent start → first model request, native / bridge (s) | ratio | agent's turn (s) | ratio | "
          "whole run (s) | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for harness in harnesses:
        cells = []
        if not rows.get((harness, "native")) or not rows.get((harness, "bridge")):
            print(f"| {harness} | no scored run in one mode (see the log) | | | | | |")
            continue
        for key in ("first_request_s", "agent_s", "run_s"):
            n = statistics.median(r[key] for r in rows[(harness, "native")])
            b = statistics.median(r[key] for r in rows[(harness, "bridge")])
            cells += [f"{n:.2f} / {b:.2f}", f"{n / b:.2f}"]
        print(f"| {harness} | " + " | ".join(cells) + " |")


def limits(harnesses: list[str], provider: DockerProvider, runs: Path, policy: IsolationPolicy, wall_s: float) -> None:
    print("| harness | outcome | pids peak / limit | memory peak / limit (MiB) | /tmp peak / size (MiB) | "
          "model requests |")
    print("| --- | --- | --- | --- | --- | --- |")
    for harness in harnesses:
        api = FakeModelAPI(script=heavy_script(ANSWER)[harness]).start()
        try:
            result, run_dir = run_one(plan_for(harness, "native", api, runs, policy, wall_s), provider)
        finally:
            api.stop()
        conf = json.loads((run_dir / "agent" / "confinement.json").read_text())
        res = conf.get("resources") or {}
        tools = sorted({t for r in api.requests for t in _called(r)})
        outcome = f"{result.status.value} {result.score}" if result.score is not None else result.status.value
        if not res.get("available"):
            print(f"| {harness} | {outcome} | unavailable: {res.get('reason')} | | | {len(api.requests)} |")
            continue
        p, m, t = res["pids"], res["memory"], res["tmpfs"].get("/tmp", {})
        print(f"| {harness} | {outcome} | {p['peak']} / {p['limit']} (refused {p['refused_forks']}) | "
              f"{m['peak_bytes'] // MIB} / {(m['limit_bytes'] or 0) // MIB} (OOM kills {m['oom_kills']}) | "
              f"{t.get('peak_bytes', 0) / MIB:.1f} / {t.get('size_bytes', 0) // MIB} | {len(api.requests)} |")
        print(f"  {harness}: {run_dir}; model called {tools}; error: {(result.error or '')[:600]}", file=sys.stderr)


def _called(request: dict[str, Any]) -> list[str]:
    """The tool results a request carries back: which tools the harness ran."""
    text = json.dumps(request.get("body") or {})
    return [n for n in ("Agent", "Bash", "Grep", "Glob", "exec_command", "run_shell_command", "glob",
                        "search_file_content", "read_file") if f'"{n}"' in text]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--harness", action="append", choices=HARNESS_NAMES)
    ap.add_argument("--limits", action="store_true", help="the heaviest features' peak pids, memory and /tmp")
    ap.add_argument("--pids", type=int, help="with --limits: this pids limit instead of the default")
    ap.add_argument("--memory-mib", type=int, help="with --limits: this memory limit instead of the default")
    ap.add_argument("--wall", type=float, default=600, help="with --limits: the agent's wall time (s)")
    ap.add_argument("--keep", type=Path, help="keep the run folders here")
    args = ap.parse_args()
    harnesses = args.harness or list(HARNESS_NAMES)
    provider = DockerProvider(docker.from_env(timeout=300))
    with tempfile.TemporaryDirectory(prefix="ale-harness-bench-") as tmp:
        runs = args.keep or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        if args.limits:
            update: dict[str, Any] = {}
            if args.pids:
                update["pids_limit"] = args.pids
            if args.memory_mib:
                update["memory_bytes"] = args.memory_mib * MIB
            if update:  # the harness's own failure there: its needs' rule (which would refuse this policy) switched off
                from ale.agents.harness import HarnessAgent

                HarnessAgent.fit_policy = lambda self, policy: policy  # type: ignore[method-assign]
            limits(harnesses, provider, runs, IsolationPolicy(**update), args.wall)
        else:
            startup(harnesses, args.repeats, provider, runs)


if __name__ == "__main__":
    main()
