"""An experiment's output folder: its record (``experiment.json``) and its lock.

The record keeps the experiment as it was run, its content hash and the history
of hashes it replaced; a changed experiment is refused unless the operator allows
it, so that one folder never silently mixes two experiments. The lock (``flock``
on ``<output>/.lock``) keeps two orchestrators off one folder; the kernel drops it
when the process dies, SIGKILL included.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ale
from ale import layout
from ale.runs.experiment import Experiment, PlannedUnit, content_hash
from ale.runs.store import UnitInfo, write_units


class ExperimentChanged(RuntimeError):
    """The experiment differs from the one that started this output folder."""


class OutputBusy(RuntimeError):
    """Another orchestrator holds this output folder."""


def utc_now() -> str:
    return datetime.now(UTC).isoformat()


class OutputLock:
    """An exclusive, non-blocking lock on an output folder (``OutputBusy`` if held)."""

    def __init__(self, output: Path):
        self.output = output
        self.path = output / layout.LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        self.output.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            raise OutputBusy(f"another `ale exp run` is using {self.output} (lock {self.path})") from e
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
            self._fd = None


def write_experiment_record(
    exp: Experiment, units: list[PlannedUnit], output: Path, *, allow_changed: bool = False
) -> None:
    """Refuse a changed experiment (``ExperimentChanged``); write the record of this one."""
    record_path = output / layout.EXPERIMENT_RECORD
    digest = content_hash(exp, units)
    history: list[dict[str, Any]] = []
    if record_path.is_file():
        try:
            old = json.loads(record_path.read_text())
        except ValueError as e:
            raise ExperimentChanged(f"{record_path} is unreadable ({e}); move it aside to start over") from e
        if old.get("name") != exp.name and not allow_changed:
            raise ExperimentChanged(
                f"{output} holds experiment {old.get('name')!r}, not {exp.name!r}; use another output folder"
            )
        if old.get("content_hash") != digest and not allow_changed:
            raise ExperimentChanged(
                f"the experiment changed since {output} was started "
                f"(content hash {str(old.get('content_hash'))[:12]} -> {digest[:12]}). "
                "Runs already done would mix two experiments. Use a new output folder, "
                "or pass --allow-changed to continue anyway."
            )
        history = list(old.get("history", []))
        if old.get("content_hash") != digest:
            history.append({"content_hash": old.get("content_hash"), "replaced_at": utc_now()})
    record = {
        "name": exp.name,
        "content_hash": digest,
        "source": exp.source,
        "units": len(units),
        "harness_version": ale.__version__,
        "updated_at": utc_now(),
        "history": history,
        "experiment": json.loads(exp.model_dump_json()),
    }
    tmp = record_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(record_path)
    write_units(output, {u.unit_id: unit_info(u) for u in units})


def unit_info(unit: PlannedUnit) -> UnitInfo:
    return UnitInfo(unit.unit_id, unit.task, unit.variant, unit.agent, unit.repeat)
