"""What resuming a run from its record saves against running it again from turn 1.

The built-in llm agent on ``files/word_count`` (real containers), a fake model (the tests'
``FakeModelAPI``, Chat Completions, on 127.0.0.1) that calls the shell ``--turns`` times
with an artificial ``--latency`` per model answer (a model's own time), then answers.

- **rerun**: the run from turn 1, uninterrupted (what an interrupted attempt costs again
  today);
- **source**: ``ale run`` as a subprocess, SIGKILLed (its process group) once its gateway
  record holds ``--kill-at`` answers;
- **resume**: ``execute_run`` with ``resume_from`` the killed run: the recorded turns are
  answered by the gateway from the record (their tool calls run again in the new sandbox),
  the model is called from the first turn after them.

Per mode: the agent phase and the whole run (seconds), the model calls the upstream got,
the turns replayed; and the replay itself (from the first request to the record's
``resume.live``) against the same turns' time in the source run.

    .venv/bin/python bench/resume.py [--turns 30] [--kill-at 20] [--latency 1.0] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from publish import publish  # noqa: E402
from tests.fake_model_api import FakeModelAPI  # noqa: E402

from ale.plan import AgentSpec, RunPlan  # noqa: E402
from ale.runs.lifecycle import execute_run  # noqa: E402
from ale.sandbox.docker import DockerProvider  # noqa: E402
from ale.sandbox.scratch import release_scratch  # noqa: E402

TASK = HERE.parent / "examples" / "tasks" / "files" / "word_count"
IMAGE = os.environ.get("ALE_IMAGE", "ale-tools:latest")
ANSWER = ("printf '{\"words\": %d, \"lines\": %d}' $(wc -w < /input/document.txt) $(wc -l < /input/document.txt) "
          "> /workspace/answer.json && cat /workspace/answer.json")


def command_for(turns: int):
    def command(n: int) -> str:
        return ANSWER if n == turns - 1 else f"echo turn {n} >> /workspace/turns.txt && wc -l < /workspace/turns.txt"
    return command


def config(fake: FakeModelAPI) -> dict:
    return {"base_url": f"{fake.url}/v1", "model": "gpt-fake", "api_key": "bench", "max_steps": 1000}


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "agent" / "gateway" / "records.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def answers(run_dir: Path) -> int:
    path = run_dir / "agent" / "gateway" / "records.jsonl"
    return sum(1 for x in path.read_text().splitlines() if '"type":"response"' in x) if path.is_file() else 0


def phase(result, name: str) -> float:
    return next(p.seconds for p in result.phases if p.name == name)


def whole(result) -> float:
    return (result.ended_at - result.started_at).total_seconds()


def span(recs: list[dict], until: int) -> float:
    """Seconds from the first model request to the ``until``-th response."""
    reqs = [r for r in recs if r["type"] == "request"]
    resps = [r for r in recs if r["type"] == "response"]
    t0 = datetime.fromisoformat(reqs[0]["time"])
    return (datetime.fromisoformat(resps[until - 1]["time"]) - t0).total_seconds()


def kill_at(tmp: Path, fake: FakeModelAPI, n: int) -> Path:
    runs = tmp / "killed"
    argv = [sys.executable, "-m", "ale.cli", "run", str(TASK), "--agent", "llm", "--agent-config",
            json.dumps(config(fake)), "--runs-dir", str(runs), "--signing-key", str(tmp / "key.pem"), "--image", IMAGE]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")})
    try:
        while True:
            dirs = [d for d in runs.iterdir() if d.is_dir() and not d.name.startswith(".")] if runs.is_dir() else []
            if dirs and answers(dirs[0]) >= n:
                return dirs[0]
            if proc.poll() is not None:
                raise SystemExit(f"ale run ended before {n} answers")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def one(tmp: Path, provider: DockerProvider, turns: int, kill: int, latency: float) -> dict:
    out: dict = {}
    fake = FakeModelAPI(turns=turns, turn_command=command_for(turns), latency_s=latency).start()
    try:
        # rerun from turn 1
        plan = RunPlan(run_id=f"rerun-{uuid.uuid4().hex[:8]}", task_dir=str(TASK),
                       agent=AgentSpec(name="llm", config=config(fake)),
                       image=IMAGE, runs_dir=str(tmp / "rerun"), signing_key=str(tmp / "key.pem"))
        n0 = fake.model_calls()
        rerun = asyncio.run(execute_run(plan, provider=provider))
        out["rerun"] = {"status": rerun.status.value, "agent_s": phase(rerun, "agent"), "run_s": whole(rerun),
                        "model_calls": fake.model_calls() - n0, "replayed_turns": 0}
        # the interrupted source, then its resume
        source = kill_at(tmp, fake, kill)
        provider.remove_managed(run_id=source.name)
        release_scratch(source.parent / ".scratch" / source.name)
        recorded = answers(source)
        old = RunPlan.model_validate_json((source / "plan.json").read_text())
        plan = old.model_copy(update={"run_id": f"resumed-{uuid.uuid4().hex[:8]}", "runs_dir": str(tmp / "resumed"),
                                      "resume_from": str(source)})
        n0 = fake.model_calls()
        resumed = asyncio.run(execute_run(plan, provider=provider))
        info = resumed.resumed or {}
        out["resume"] = {"status": resumed.status.value, "agent_s": phase(resumed, "agent"), "run_s": whole(resumed),
                         "model_calls": fake.model_calls() - n0, "replayed_turns": info.get("replayed_turns")}
        recs = records(plan.run_dir)
        replayed = int(info.get("replayed_turns") or 0)
        out["replay_s"] = span(recs, replayed) if replayed else None
        out["source_same_turns_s"] = span(records(source), replayed) if replayed else None
        out["recorded"] = recorded
        out["scores_equal"] = rerun.scores == resumed.scores
    finally:
        fake.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--kill-at", type=int, default=20)
    ap.add_argument("--latency", type=float, default=1.0, help="seconds per model answer (the fake model's own time)")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    import docker

    provider = DockerProvider(docker.from_env())
    rows = []
    with tempfile.TemporaryDirectory(prefix="ale-bench-resume-") as d:
        for i in range(a.repeats):
            rows.append(one(Path(d) / str(i), provider, a.turns, a.kill_at, a.latency))
            print(json.dumps(rows[-1]), flush=True)

    def med(mode: str, key: str) -> float | int:
        v = round(statistics.median(r[mode][key] for r in rows), 2)
        return int(v) if key == "model_calls" else v

    figures = {"turns": a.turns, "kill_at": a.kill_at, "latency_s": a.latency, "repeats": a.repeats, "runs": rows,
               "median": {m: {k: med(m, k) for k in ("agent_s", "run_s", "model_calls")} for m in ("rerun", "resume")},
               "replay_s": round(statistics.median(r["replay_s"] for r in rows), 2),
               "source_same_turns_s": round(statistics.median(r["source_same_turns_s"] for r in rows), 2),
               "scores_equal": all(r["scores_equal"] for r in rows)}
    m = figures["median"]
    saved = round(m["rerun"]["agent_s"] - m["resume"]["agent_s"], 2)
    figures["saved_agent_s"] = saved
    md = (f"{a.turns} model turns, killed at {a.kill_at} answers (recorded: {[r['recorded'] for r in rows]}), "
          f"{a.latency:.1f} s per model answer; median of {a.repeats}.\n\n"
          "| mode | agent phase (s) | whole run (s) | model calls | turns replayed |\n| --- | --- | --- | --- | --- |\n"
          f"| rerun from turn 1 | {m['rerun']['agent_s']} | {m['rerun']['run_s']} | {m['rerun']['model_calls']} | 0 |\n"
          f"| resume from the record | {m['resume']['agent_s']} | {m['resume']['run_s']} | "
          f"{m['resume']['model_calls']} | {[r['resume']['replayed_turns'] for r in rows]} |\n\n"
          f"Saved: **{saved} s** of the agent phase. The replayed turns took {figures['replay_s']} s in "
          f"the resumed run (their tool calls only) against {figures['source_same_turns_s']} s in the interrupted run "
          f"(model and tools). Scores equal to the rerun's: {figures['scores_equal']}.\n")
    js, mdp = publish("resume", figures, md)
    print(mdp.read_text())


if __name__ == "__main__":
    main()
