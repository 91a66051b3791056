"""Run cua-bench's basic dataset (trycua/cua, libs/cua-bench/datasets/cua-bench-basic)
through `ale task check` (oracle 1.0 and nop 0 on every variant), unchanged.

    .venv/bin/python bench/cua_basic.py PATH/TO/cua-bench-basic [--runs-dir DIR]

Prints one line per task and a JSON summary (also written to bench/cua_basic.json).
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
    a = ap.parse_args()
    runs = a.runs_dir or Path(tempfile.mkdtemp(prefix="ale-cua-basic-"))
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    rows = []
    for task in sorted(p for p in a.dataset.iterdir() if (p / "main.py").is_file()):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "ale.cli", "task", "check", str(task), "--runs-dir", str(runs)],
                           capture_output=True, text=True, env=env)
        out = (r.stdout + r.stderr).strip().splitlines()
        rows.append({"task": task.name, "ok": r.returncode == 0, "seconds": round(time.perf_counter() - t0, 1),
                     "last": out[-1] if out else "", "failures": [ln for ln in out if ln.startswith(("FAIL", "fail"))][:5]})
        print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} {task.name:18s} {rows[-1]['seconds']:6.1f}s  {rows[-1]['last']}", flush=True)
    summary = {"tasks": len(rows), "passed": sum(r["ok"] for r in rows), "rows": rows, "runs_dir": str(runs)}
    (HERE / "cua_basic.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))


if __name__ == "__main__":
    main()
