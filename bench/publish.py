"""Where a benchmark's figures go: ``bench/results/<name>.json`` and ``<name>.md``.

Every script in ``bench/`` writes its figures here (both files, committed), never into
``docs/benchmarks.md``: that document is written by hand, cites these files and keeps
the context (what was measured, at what load, what it means) that a rewrite by a
script would drop. Re-running a benchmark replaces its two files only.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def publish(name: str, figures: dict[str, Any], markdown: str, *, results: Path = RESULTS) -> tuple[Path, Path]:
    """Write ``<name>.json`` (the figures, the command, when and where) and ``<name>.md``
    (the tables as the script renders them) under ``results``; return both paths."""
    results.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    record = {
        "benchmark": name,
        "command": " ".join(["python", *sys.argv]),
        "measured_at": when,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": sys.platform,
                 "load_average": [round(x, 2) for x in load] if load else None},
        "figures": figures,
    }
    js, md = results / f"{name}.json", results / f"{name}.md"
    js.write_text(json.dumps(record, indent=1, default=str) + "\n")
    load_note = f", load average {' / '.join(f'{x:.1f}' for x in load)}" if load else ""
    md.write_text(f"<!-- written by bench/{name}.py: re-run it rather than edit -->\n"
                  f"`{record['command']}`, {when}{load_note}:\n\n{markdown.rstrip()}\n")
    return js, md
