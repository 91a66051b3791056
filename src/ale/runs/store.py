"""The run store: run folders on disk, plus a SQLite index over them.

The folders are the truth (``<output>/runs/<run_id>/result.json``); the index at
``<output>/index.sqlite`` is a cache for quick queries over thousands of runs,
updated as results land and rebuildable from the folders at any time.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ale import layout
from ale.result import RunResult

INDEX_NAME = layout.RUNS_INDEX
RUNS_SUBDIR = layout.RUNS_DIR
UNITS_NAME = layout.UNITS

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id   TEXT PRIMARY KEY,
    unit_id  TEXT NOT NULL,
    task     TEXT NOT NULL,
    variant  INTEGER NOT NULL,
    agent    TEXT NOT NULL,
    repeat   INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    status   TEXT NOT NULL,
    score    REAL,
    started  TEXT,
    ended    TEXT,
    path     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_unit ON runs(unit_id);
CREATE INDEX IF NOT EXISTS runs_agent_task ON runs(agent, task);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status);
"""


@dataclass(frozen=True)
class UnitInfo:
    """What the plan knows about a run that its result.json does not."""

    unit_id: str
    task: str
    variant: int
    agent: str
    repeat: int


@dataclass(frozen=True)
class IndexedRun:
    run_id: str
    unit_id: str
    task: str
    variant: int
    agent: str
    repeat: int
    attempt: int
    status: str
    score: float | None
    started: str | None
    ended: str | None
    path: str


def runs_root(output: Path) -> Path:
    return Path(output) / RUNS_SUBDIR


def read_result(run_dir: Path) -> RunResult | None:
    """The run's final result, or None when it has none (yet) or it is unreadable."""
    path = run_dir / layout.RESULT
    try:
        return RunResult.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return None


def iter_results(output: Path) -> Iterator[tuple[Path, RunResult]]:
    root = runs_root(output)
    if not root.is_dir():
        return
    for run_dir in sorted(root.iterdir()):
        if run_dir.is_dir():
            result = read_result(run_dir)
            if result is not None:
                yield run_dir, result


def write_units(output: Path, units: dict[str, UnitInfo]) -> None:
    """Record the planned units (run ids map back to them for rebuilds and reports)."""
    data = {
        uid: {"task": u.task, "variant": u.variant, "agent": u.agent, "repeat": u.repeat}
        for uid, u in units.items()
    }
    tmp = Path(output) / (UNITS_NAME + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(Path(output) / UNITS_NAME)


def read_units(output: Path) -> dict[str, UnitInfo]:
    path = Path(output) / UNITS_NAME
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {
        uid: UnitInfo(uid, d["task"], int(d["variant"]), d["agent"], int(d["repeat"]))
        for uid, d in data.items()
    }


def unit_of(result: RunResult, units: dict[str, UnitInfo]) -> UnitInfo:
    """The unit a result belongs to: from the plan when known, else from the result."""
    suffix = f"-a{result.attempt}"
    unit_id = result.run_id[: -len(suffix)] if result.run_id.endswith(suffix) else result.run_id
    if unit_id in units:
        return units[unit_id]
    repeat = 0
    tail = unit_id.rsplit("-r", 1)
    if len(tail) == 2 and tail[1].isdigit():
        repeat = int(tail[1])
    return UnitInfo(unit_id, Path(result.task_dir).name or result.task_id, result.variant, result.agent, repeat)


class RunIndex:
    """``<output>/index.sqlite``; one connection per call keeps it safe across threads."""

    def __init__(self, output: Path):
        self.output = Path(output)
        self.path = self.output / INDEX_NAME
        self.output.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def record(self, result: RunResult, unit: UnitInfo, run_dir: Path) -> None:
        self.record_many([(result, unit, run_dir)])

    def record_many(self, rows: list[tuple[RunResult, UnitInfo, Path]]) -> None:
        values = [
            (
                r.run_id,
                u.unit_id,
                u.task,
                u.variant,
                u.agent,
                u.repeat,
                r.attempt,
                str(r.status),
                r.score,
                r.started_at.isoformat(),
                r.ended_at.isoformat(),
                str(Path(d).resolve().relative_to(self.output.resolve()))
                if Path(d).resolve().is_relative_to(self.output.resolve())
                else str(d),
            )
            for r, u, d in rows
        ]
        with closing(self._connect()) as db, db:
            db.executemany(
                "INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", values
            )

    def query(self, where: str = "", params: tuple = ()) -> list[IndexedRun]:
        sql = ("SELECT run_id, unit_id, task, variant, agent, repeat, attempt, status, score, started, ended, path "
               "FROM runs")
        if where:
            sql += " WHERE " + where
        sql += " ORDER BY run_id"
        with closing(self._connect()) as db:
            return [IndexedRun(*row) for row in db.execute(sql, params)]

    def count_by_status(self) -> dict[str, int]:
        """Counts over the final attempt of each unit."""
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT status, COUNT(*) FROM runs r WHERE attempt = "
                "(SELECT MAX(attempt) FROM runs s WHERE s.unit_id = r.unit_id) GROUP BY status"
            ).fetchall()
        return {s: n for s, n in rows}

    def clear(self) -> None:
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM runs")


def rebuild_index(output: Path) -> RunIndex:
    """Recreate the index from the run folders alone (the folders are the truth)."""
    index = RunIndex(output)
    units = read_units(output)
    rows = [(r, unit_of(r, units), d) for d, r in iter_results(output)]
    index.clear()
    index.record_many(rows)
    return index
