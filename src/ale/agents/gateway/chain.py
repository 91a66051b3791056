"""The gateway's record as a hash chain: its canonical encoding, each record's hash,
and reading it back (bodies and records, with every problem named). The low layer
both the recorder and summary (``record``) and the replay of a resumed run
(``resume``) read, so neither imports the other's module to get at it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ale import layout

GATEWAY_DIR = layout.GATEWAY_DIR
RECORDS = layout.Gateway.RECORDS
GENESIS = "0" * 64


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def record_hash(rec: dict[str, Any]) -> str:
    return hashlib.sha256(canonical({k: v for k, v in rec.items() if k != "hash"})).hexdigest()


def read_body(run_dir: Path, ref: dict[str, Any]) -> tuple[Any, list[str]]:
    """A recorded body as parsed JSON (None when empty or not JSON), and the problems found."""
    if not ref or not ref.get("bytes"):
        return None, []
    if "json" in ref:
        return ref["json"], []
    rel = ref.get("file")
    if not isinstance(rel, str) or ".." in Path(rel).parts or not rel.startswith(GATEWAY_DIR + "/"):
        return None, [f"body reference {rel!r} is not a file of the gateway's record"]
    try:
        data = (Path(run_dir) / rel).read_bytes()
    except OSError as e:
        return None, [f"body file {rel} cannot be read: {e}"]
    if hashlib.sha256(data).hexdigest() != ref.get("sha256") or len(data) != ref.get("bytes"):
        return None, [f"body file {rel} does not match the sha256 and size its record names"]
    try:
        return json.loads(data), []
    except (ValueError, RecursionError):
        return None, []


def read_records(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    path = Path(run_dir) / GATEWAY_DIR / RECORDS
    problems: list[str] = []
    records: list[dict[str, Any]] = []
    prev, seq = GENESIS, 0
    try:
        lines = path.read_bytes().decode().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return [], [f"{GATEWAY_DIR}/{RECORDS} cannot be read: {e}"]
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            problems.append(f"records.jsonl:{n}: not JSON")
            continue
        if not isinstance(rec, dict):
            problems.append(f"records.jsonl:{n}: not an object")
            continue
        if rec.get("seq") != seq + 1 or rec.get("prev") != prev:
            problems.append(f"records.jsonl:{n}: does not follow record {seq} (a record was removed, "
                            "reordered or inserted)")
        if rec.get("hash") != record_hash(rec):
            problems.append(f"records.jsonl:{n}: does not match its hash (the record was edited)")
        records.append(rec)
        prev, seq = rec.get("hash", ""), rec.get("seq", seq + 1) if isinstance(rec.get("seq"), int) else seq + 1
    return records, problems
