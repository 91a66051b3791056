"""The hash-chained event log (ale.record.evidence.EventLog / verify_chain)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ale.record.evidence import GENESIS, EventLog, EvidenceError, event_hash, verify_chain


def make_log(path: Path, n: int = 5) -> list[dict]:
    log = EventLog(path)
    return [log.append(f"step.{i}", i=i, note="x" * i) for i in range(n)]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_records_chain_and_verify(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    recs = make_log(p)
    assert [r["seq"] for r in recs] == [1, 2, 3, 4, 5]
    assert recs[0]["prev"] == GENESIS
    assert all(b["prev"] == a["hash"] for a, b in zip(recs, recs[1:], strict=False))
    stored = [json.loads(line) for line in lines(p)]
    assert stored == recs
    assert set(stored[0]) == {"seq", "time", "type", "data", "prev", "hash"}
    assert stored[2]["hash"] == event_hash(stored[2])
    assert stored[0]["time"].endswith("+00:00")
    assert verify_chain(p) == []


def test_removed_line_is_a_gap_and_a_broken_link(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    make_log(p)
    ls = lines(p)
    del ls[2]
    p.write_text("".join(ls))
    problems = verify_chain(p)
    assert any("seq 4 follows seq 2: 1 event(s) missing" in m for m in problems)
    assert any("not to the hash of the event before it" in m for m in problems)


def test_edited_line_has_a_bad_hash(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    make_log(p)
    ls = lines(p)
    rec = json.loads(ls[1])
    rec["data"]["i"] = 99
    ls[1] = json.dumps(rec) + "\n"
    p.write_text("".join(ls))
    problems = verify_chain(p)
    assert problems == [f"{p}:2: seq 2 (step.1) does not match its hash: the event was edited"]


def test_reordered_lines_are_caught(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    make_log(p)
    ls = lines(p)
    ls[1], ls[2] = ls[2], ls[1]
    p.write_text("".join(ls))
    assert len(verify_chain(p)) >= 2


def test_cut_last_line_and_garbage_are_caught(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    make_log(p)
    p.write_text(p.read_text()[:-10])
    problems = verify_chain(p)
    assert any("incomplete" in m for m in problems)
    assert any("not JSON" in m for m in problems)


def test_existing_log_is_not_reused_for_a_new_run(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    make_log(p, 2)
    with pytest.raises(EvidenceError, match="already holds events"):
        EventLog(p)


def test_resume_continues_the_chain(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    recs = make_log(p, 2)
    log = EventLog(p, resume=True)
    nxt = log.append("more")
    assert nxt["seq"] == 3 and nxt["prev"] == recs[-1]["hash"]
    assert verify_chain(p) == []


def test_resume_refuses_a_broken_log(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    make_log(p, 3)
    p.write_text("".join(lines(p)[1:]))
    with pytest.raises(EvidenceError, match="cannot resume"):
        EventLog(p, resume=True)


def test_concurrent_appends_keep_one_chain(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    log = EventLog(p)

    def work(k: int) -> None:
        for i in range(20):
            log.append("tick", k=k, i=i)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lines(p)) == 80
    assert verify_chain(p) == []


def test_data_round_trips_to_the_same_hash(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    log = EventLog(p)
    log.append("odd", values=(1, 2.5, "é", None), path=tmp_path, nested={"b": 1, "a": [True]})
    assert verify_chain(p) == []
    assert json.loads(lines(p)[0])["data"]["path"] == str(tmp_path)
