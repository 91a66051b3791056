"""`ale task check` before and after a change, on the example tasks.

Each round runs, interleaved, on each task: `ale task check --json` as it was (a
source tree given with --before, e.g. `git archive HEAD src | tar -x -C /tmp/head`),
the same with `--full-adversarial` (this tree: every adversarial output a full
sandbox lifecycle; --no-full leaves it out), and as it is now. Prints wall seconds
per run with each stage's wall time (oracle, nop, adversarial, missing-reference,
per variant, as the check reports them), the medians, and whether every
strategy's verdict agrees.

    python bench/task_check.py --before /tmp/head/src --rounds 2 [--task files/word_count ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("files/word_count", "physics/cloth_sim", "secrets/echo_secret")


def check(task: str, runs: Path, *, src: Path | None, extra: list[str]) -> tuple[float, dict]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ale.cli", "task", "check", str(ROOT / "examples" / "tasks" / task),
                        "--runs-dir", str(runs), "--json", *extra], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if not p.stdout.strip():
        raise SystemExit(f"{task}: no JSON (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return seconds, json.loads(p.stdout)


def verdicts(doc: dict) -> dict[tuple[int, str], str]:
    return {(v["variant"], o["strategy"]): o["verdict"]
            for v in doc["variants"] for o in ((v.get("adversarial") or {}).get("outcomes") or [])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, help="the src/ folder of the version to compare with")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--task", action="append")
    ap.add_argument("--no-full", action="store_true", help="skip --full-adversarial (before and after only)")
    ap.add_argument("--without", action="append", default=[], help="leave this strategy out (repeatable)")
    args = ap.parse_args()
    from ale.grading.adversarial import strategy_names

    only = [a for n in strategy_names() if n not in args.without for a in ("--strategy", n)] if args.without else []
    modes: dict[str, tuple[Path | None, list[str]]] = {"after": (None, only)}
    if not args.no_full:
        modes["full"] = (None, ["--full-adversarial", *only])
    if args.before is not None:
        modes["before"] = (args.before, only)
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="ale-bench-check-") as tmp:
        for r in range(args.rounds):
            for task in args.task or TASKS:
                seen = {}
                for mode, (src, extra) in modes.items():
                    s, doc = check(task, Path(tmp) / f"{mode}-{r}", src=src, extra=extra)
                    times.setdefault((task, mode), []).append(s)
                    seen[mode] = verdicts(doc)
                    stages = ", ".join(f"v{st['variant']} {st['stage']} {st['started']:.1f}+{st['seconds']:.1f}s"
                                       for st in (doc.get("timing") or {}).get("stages") or [])
                    print(f"round {r} {task} {mode}: {s:.1f}s ok={doc['ok']} load={os.getloadavg()[0]:.1f}"
                          + (f"; stages (start+wall): {stages}" if stages else ""), flush=True)
                same = all(v == seen["after"] for v in seen.values())
                print(f"round {r} {task}: verdicts {'agree' if same else 'DIFFER'} ({len(seen['after'])} each)",
                      flush=True)
                if not same:
                    for mode, v in seen.items():
                        print(f"  {mode}: {sorted(v.items())}")
    print("\n| task | " + " | ".join(modes) + " | before / after |")
    print("| --- |" + " ---: |" * (len(modes) + 1))
    for task in args.task or TASKS:
        med = {m: statistics.median(times[(task, m)]) for m in modes}
        ratio = med.get("before", med.get("full", med["after"])) / med["after"]
        print(f"| `{task}` | " + " | ".join(f"{med[m]:.1f} s" for m in modes) + f" | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
