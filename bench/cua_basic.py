"""Run cua-bench's basic dataset (trycua/cua, libs/cua-bench/datasets/cua-bench-basic)
through `ale task check` (oracle 1.0 and nop 0 on every variant), unchanged.

    .venv/bin/python bench/cua_basic.py PATH/TO/cua-bench-basic [--runs-dir DIR] [--image REF] [--out FILE]

Prints one line per task and a JSON summary (also written to bench/cua_basic.json,
or --out): per task, per variant, the oracle's and nop's status and scores, and the
check's own problems (a task flaw names itself: "task flaw: ...").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--runs-dir", type=Path, default=None)
    ap.add_argument("--image", default=None, help="the desktop image (default: ale-desktop:latest)")
    ap.add_argument("--out", type=Path, default=HERE / "cua_basic.json")
    ap.add_argument("--adversarial", action="store_true", help="also the adversarial outputs (slow)")
    a = ap.parse_args()
    runs = a.runs_dir or Path(tempfile.mkdtemp(prefix="ale-cua-basic-"))
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    rows = []
    for task in sorted(p for p in a.dataset.iterdir() if (p / "main.py").is_file()):
        t0 = time.perf_counter()
        argv = [sys.executable, "-m", "ale.cli", "task", "check", str(task), "--runs-dir", str(runs), "--json"]
        argv += ["--image", a.image] if a.image else []
        argv += [] if a.adversarial else ["--no-adversarial"]
        r = subprocess.run(argv, capture_output=True, text=True, env=env)
        out = r.stderr.strip().splitlines()
        try:
            report = json.loads(r.stdout)
        except ValueError:
            report = {"variants": [], "problems": out[-5:]}
        variants = [{"variant": v["variant"],
                     **{k: {"status": v[k]["status"], "scores": v[k]["scores"], "ok": v[k]["ok"]}
                        for k in ("oracle", "nop") if k in v}}
                    for v in report.get("variants", [])]
        rows.append({"task": task.name, "ok": r.returncode == 0, "seconds": round(time.perf_counter() - t0, 1),
                     "last": out[-1] if out else "", "problems": report.get("problems", []), "variants": variants})
        print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} {task.name:18s} {rows[-1]['seconds']:6.1f}s  "
              f"{rows[-1]['last']}", flush=True)
    summary = {"tasks": len(rows), "passed": sum(r["ok"] for r in rows), "image": a.image or "ale-desktop:latest",
               "rows": rows, "runs_dir": str(runs)}
    a.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))


if __name__ == "__main__":
    main()
