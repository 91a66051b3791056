"""Resume a run from its record: the gateway replays the recorded model turns.

A resumed run starts in a fresh sealed sandbox with a copy of the interrupted
(source) run's gateway record under ``RUN/resume/source/`` (the same layout as a
run folder: ``agent/gateway/records.jsonl`` and its bodies) and
``RUN/resume/resume.json`` naming the source run and its record's chain head.
The agent runs as usual, unaware: every agent kind reaches its model through the
gateway, and the gateway does the replaying (``Replayer``):

- model request N (in the order they arrive) whose canonical digest
  (``request_digest``: api, method, path and the JSON body with keys sorted,
  the per-session ``VOLATILE`` fields left out) equals the recorded request N's
  (or, for concurrent requests that arrived in another order, an unused recorded
  request's) is answered with the recorded response, byte for byte, without the
  upstream: recorded ``decision: replayed`` and a response ``by: replay`` naming
  the source's request and response records and the body's sha256, with no usage
  (a replayed turn costs nothing; the source run's attempt keeps its cost);
- the first model request that differs (a tool result the new sandbox returned
  differently: the divergence, recorded as ``resume.live`` with the turn, the
  digest pair and a short human diff of the first differing tool result) or
  that comes after the last recorded turn goes to the live model, and from then
  on everything is live.

``derive_resume`` reads it back (the run's summary and ``ale verify``): which
turns were replayed, where the run diverged or went live, the tool calls the
agent re-executed for the replayed turns, and the problems: a replayed response
that is not the source's (sha256), a replayed request whose body does not digest
to the source's, usage on a replayed turn, a copy whose chain is broken or whose
head is not the one ``gateway.start`` names.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale import layout
from ale.agents.gateway.chain import GATEWAY_DIR, RECORDS, canonical, read_body, read_records
from ale.agents.gateway.parse import PARSE_ERRORS, parse_response, response_bytes

SOURCE_DIR = layout.RESUME_SOURCE  # a run folder's shape: agent/gateway/records.jsonl, bodies
RESUME_FILE = layout.RESUME_INFO
# Request fields a harness sets per session (an id, a cache key): left out of the digest.
VOLATILE = frozenset({"metadata", "user", "prompt_cache_key", "safety_identifier"})
DIFF_CHARS = 300


def request_digest(api: str, method: str, path: str, body: bytes | Any) -> str:
    """The canonical digest of a model request: what must be equal to replay it."""
    parsed: Any = body
    if isinstance(body, bytes | bytearray):
        parsed = None
        if body:
            try:
                parsed = json.loads(body)
            except (ValueError, RecursionError):
                parsed = {"sha256": hashlib.sha256(body).hexdigest()}
    if isinstance(parsed, dict):
        parsed = {k: v for k, v in parsed.items() if k not in VOLATILE}
    return hashlib.sha256(canonical({"api": api, "method": method, "path": path, "body": parsed})).hexdigest()


@dataclass
class RecordedTurn:
    """One model call of the source run that the model answered (2xx)."""

    turn: int  # 1-based, among the source's answered model calls
    request: int  # the source's request record
    response: int  # the source's response record
    digest: str
    body: Any
    status: int
    headers: list[tuple[str, str]]
    data: bytes
    streamed: bool
    digest_response: str | None
    model: str | None
    usage: dict[str, Any] = field(default_factory=dict)


def source_turns(source: Path) -> tuple[list[RecordedTurn], list[dict[str, Any]], list[str]]:
    """The source record's answered model calls in order, its records, and the problems reading it."""
    records, problems = read_records(source)
    with contextlib.suppress(OSError):  # a torn last line (a kill mid-write) is no problem: prepare_resume drops it
        data = (Path(source) / GATEWAY_DIR / RECORDS).read_bytes()
        if data and not data.endswith(b"\n"):
            lines = data.count(b"\n") + 1
            torn = f"records.jsonl:{lines}: "
            problems = [p for p in problems if not p.startswith(torn)]
    requests = {r.get("seq"): r for r in records if r.get("type") == "request"}
    turns: list[RecordedTurn] = []
    for resp in records:
        if resp.get("type") != "response" or not resp.get("model_call") or resp.get("by") not in ("upstream", "replay"):
            continue
        status = resp.get("status")
        req = requests.get(resp.get("request"))
        if req is None or not isinstance(status, int) or not 200 <= status < 300:
            continue
        body, probs = read_body(source, req.get("body") or {})
        problems += probs
        raw = _raw_body(source, req.get("body") or {})
        ref = resp.get("body") or {}
        turns.append(RecordedTurn(
            turn=len(turns) + 1, request=int(req["seq"]), response=int(resp["seq"]),
            digest=request_digest(str(req.get("api")), str(req.get("method")), str(req.get("path")),
                                  raw if raw is not None else body),
            body=body, status=status, headers=[(str(k), str(v)) for k, v in resp.get("headers") or []],
            data=response_bytes(source, ref), streamed=bool(resp.get("streamed")), digest_response=response_digest(ref),
            model=resp.get("model"), usage=dict(resp.get("usage") or {})))
    return turns, records, problems


def response_digest(ref: dict[str, Any]) -> str | None:
    """A recorded response body's digest: the sha256 of its bytes when kept as a file,
    of its canonical JSON when kept inline (the bytes a replay sends are re-encoded)."""
    if not isinstance(ref, dict) or not ref.get("bytes"):
        return None
    if "json" in ref:
        return hashlib.sha256(canonical(ref["json"])).hexdigest()
    return ref.get("sha256") if isinstance(ref.get("sha256"), str) else None


def _raw_body(run_dir: Path, ref: dict[str, Any]) -> bytes | None:
    """A recorded request body's bytes when it was kept as a file (not JSON inline)."""
    rel = ref.get("file")
    if not isinstance(rel, str) or ".." in Path(rel).parts:
        return None
    try:
        return (Path(run_dir) / rel).read_bytes()
    except OSError:
        return None


def prepare_resume(run_dir: Path, source_run: Path) -> dict[str, Any]:
    """Copy the source run's gateway record into ``run_dir`` (``resume/source``) and
    write ``resume/resume.json``; returns what it names. Raises ValueError when the
    source has no gateway record or no answered model turn to replay."""
    src = Path(source_run)
    rec = src / GATEWAY_DIR / RECORDS
    if not rec.is_file():
        raise ValueError(f"{src} has no gateway record ({GATEWAY_DIR}/{RECORDS}): nothing to resume from")
    dest = Path(run_dir) / SOURCE_DIR / GATEWAY_DIR
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / GATEWAY_DIR, dest, symlinks=False,
                    ignore=shutil.ignore_patterns(layout.Gateway.TURNS))
    # A process killed mid-write may leave a torn last line: the copy ends at the last whole record.
    copy = dest / RECORDS
    data = copy.read_bytes()
    torn = bool(data) and not data.endswith(b"\n")
    if torn:
        copy.write_bytes(data[: data.rfind(b"\n") + 1])
    if (src / layout.RESUME_DIR).is_dir():  # the source resumed an earlier attempt: its copy comes along (its spend)
        shutil.copytree(src / layout.RESUME_DIR, Path(run_dir) / SOURCE_DIR / layout.RESUME_DIR, symlinks=False)
    turns, records, problems = source_turns(Path(run_dir) / SOURCE_DIR)
    if problems:
        raise ValueError(f"{src}: its gateway record cannot be replayed: {'; '.join(problems[:3])}")
    if not turns:
        raise ValueError(f"{src}: its gateway record holds no answered model turn to replay")
    info = {"from_run": str(src.resolve()), "run_id": src.name,
            "source_head": records[-1].get("hash") if records else None,
            "source_records": len(records), "source_turns": len(turns),
            "source_usage": chain_usage(Path(run_dir) / SOURCE_DIR),
            **({"torn_tail_bytes": len(data) - copy.stat().st_size} if torn else {})}
    (Path(run_dir) / RESUME_FILE).write_text(json.dumps(info, indent=1))
    return info


def chain_usage(source: Path) -> dict[str, Any]:
    """What the interrupted attempts a resumed run continues spent: the source's upstream answers,
    and, when the source was itself a resumed run killed in turn, its own source's, and so on."""
    records, _ = read_records(source)
    out = source_usage(records)
    nested = Path(source) / SOURCE_DIR
    if (nested / GATEWAY_DIR / RECORDS).is_file():
        for k, v in chain_usage(nested).items():
            out[k] = round(out.get(k, 0) + v, 8)
    return out


def source_usage(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the source run's upstream answers cost (kept by the source's attempt, not billed again)."""
    out: dict[str, Any] = {}
    for r in records:
        if r.get("type") == "response" and r.get("by") == "upstream":
            for k, v in (r.get("usage") or {}).items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    out[k] = round(out.get(k, 0) + v, 8)
    return out


def load_resume(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / RESUME_FILE
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return doc if isinstance(doc, dict) else None


class Replayer:
    """The gateway's side of a resumed run: which model request is answered from the record."""

    def __init__(self, run_dir: Path, info: dict[str, Any]):
        self.info = info
        self.turns, _, _ = source_turns(Path(run_dir) / SOURCE_DIR)
        self.live = False
        self.seen = 0  # model requests that asked to be answered (replayed or not)
        self.used: set[int] = set()

    def take(self, api: str, method: str, path: str, body: bytes) -> tuple[RecordedTurn | None, dict[str, Any] | None]:
        """(the recorded turn to answer with, None) while replaying; (None, why) when this
        request goes live for the first time; (None, None) once live."""
        if self.live:
            return None, None
        self.seen += 1
        n = self.seen
        digest = request_digest(api, method, path, body)
        want = self.turns[n - 1] if n <= len(self.turns) else None
        hit = want if want is not None and want.turn not in self.used and want.digest == digest else None
        if hit is None:  # concurrent requests arrive in any order
            hit = next((t for t in self.turns if t.turn not in self.used and t.digest == digest), None)
        if hit is not None:
            self.used.add(hit.turn)
            return hit, None
        self.live = True
        if want is None:
            return None, {"why": "after_last", "turn": n, "replayed": len(self.used),
                          "detail": f"turn {n} comes after the last recorded turn ({len(self.turns)}): the live model "
                                    "answers from here"}
        parsed: Any = None
        with contextlib.suppress(ValueError, RecursionError):
            parsed = json.loads(body) if body else None
        diff = describe_difference(want.body, parsed)
        return None, {"why": "diverged", "turn": n, "replayed": len(self.used), "digest": digest,
                      "recorded_digest": want.digest, "recorded_request": want.request, **diff}


# -- what differed ---------------------------------------------------------------
def tool_results(body: Any) -> list[tuple[str, str]]:
    """The tool results a model request carries, in order: (call id, text), for every API."""
    out: list[tuple[str, str]] = []
    if not isinstance(body, dict):
        return out
    for m in body.get("messages") or []:  # Chat Completions, Anthropic Messages
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool":
            out.append((str(m.get("tool_call_id")), _text(m.get("content"))))
        elif isinstance(m.get("content"), list):
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out.append((str(b.get("tool_use_id")), _text(b.get("content"))))
    for item in body.get("input") or [] if isinstance(body.get("input"), list) else []:  # Responses
        if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output"):
            out.append((str(item.get("call_id")), _text(item.get("output"))))
    for c in body.get("contents") or []:  # Gemini
        for p in (c.get("parts") or []) if isinstance(c, dict) else []:
            if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict):
                fr = p["functionResponse"]
                out.append((str(fr.get("id") or fr.get("name")), _text(fr.get("response"))))
    return out


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and isinstance(b.get("text"), str) for b in value):
        return "".join(b["text"] for b in value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _cut(text: str) -> str:
    return text if len(text) <= DIFF_CHARS else text[:DIFF_CHARS] + "…"


def describe_difference(recorded: Any, now: Any) -> dict[str, Any]:
    """A short human account of how a request differs from the recorded one: the first
    differing tool result (its position, call id, both texts cut short and a unified
    diff of a few lines), else the fields that differ."""
    old, new = tool_results(recorded), tool_results(now)
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            lines = list(difflib.unified_diff(a[1].splitlines(), b[1].splitlines(), "recorded", "now",
                                              n=0, lineterm=""))
            return {"what": "tool_result", "tool_result": i + 1, "call_id": b[0], "recorded_text": _cut(a[1]),
                    "text": _cut(b[1]), "diff": "\n".join(lines[:8])[:DIFF_CHARS * 2],
                    "summary": f"tool result {i + 1} (call {b[0]}) differs: recorded {_cut(a[1])[:80]!r}, now "
                               f"{_cut(b[1])[:80]!r}"}
    if len(old) != len(new):
        return {"what": "tool_results",
                "summary": f"the request carries {len(new)} tool result(s), the recorded one {len(old)}"}
    if isinstance(recorded, dict) and isinstance(now, dict):
        keys = sorted(k for k in set(recorded) | set(now) if k not in VOLATILE and recorded.get(k) != now.get(k))
        return {"what": "fields", "fields": keys, "summary": f"the tool results agree; the request differs in {keys}"}
    return {"what": "body", "summary": "the request's body is not the recorded one's"}


# -- reading it back -------------------------------------------------------------
def derive_resume(run_dir: Path, records: list[dict[str, Any]],
                  start: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A resumed run's replay, re-derived from its record and the copy of the source's:
    the summary (``resumed``) and the problems."""
    info: dict[str, Any] = start["resume"] if isinstance(start.get("resume"), dict) else {}
    problems: list[str] = []
    source = Path(run_dir) / SOURCE_DIR
    src_records, chain = read_records(source)
    problems += [f"the source record's copy: {p}" for p in chain]
    head = src_records[-1].get("hash") if src_records else None
    if head != info.get("source_head"):
        problems.append(f"the source record's copy ends at {head}, gateway.start names {info.get('source_head')}")
    by_seq = {r.get("seq"): r for r in src_records}
    requests = {r.get("seq"): r for r in records if r.get("type") == "request"}
    replayed: list[dict[str, Any]] = []
    live: dict[str, Any] | None = None
    turn = 0
    for rec in records:
        if rec.get("type") == "resume.live" and live is None:
            live = {k: v for k, v in rec.items() if k not in ("seq", "time", "type", "prev", "hash")}
        if rec.get("type") != "response" or not rec.get("model_call"):
            continue
        turn += 1
        if rec.get("by") != "replay":
            continue
        of: dict[str, Any] = rec["replay_of"] if isinstance(rec.get("replay_of"), dict) else {}
        src_req: dict[str, Any] = by_seq.get(of.get("request")) or {}
        src_resp: dict[str, Any] = by_seq.get(of.get("response")) or {}
        ref = rec.get("body") or {}
        where = f"replayed response {rec.get('seq')}"
        if not src_resp or not src_req or src_resp.get("type") != "response" \
                or src_resp.get("request") != src_req.get("seq"):
            problems.append(f"{where} names source records {of} that are not a request and its response")
            continue
        mine_r, theirs_r = response_digest(ref), response_digest(src_resp.get("body") or {})
        if mine_r != theirs_r or of.get("digest") != theirs_r:
            problems.append(f"{where}: its body digests to {mine_r}, the source's response "
                            f"{src_resp.get('seq')} to {theirs_r}")
        if response_bytes(run_dir, ref) != response_bytes(source, src_resp.get("body") or {}):
            problems.append(f"{where}: its bytes are not the source's response {src_resp.get('seq')}'s")
        if rec.get("usage"):
            problems.append(f"{where} carries usage {rec.get('usage')}: a replayed turn is never billed")
        req = requests.get(rec.get("request")) or {}
        mine = _digest_of(run_dir, req)
        theirs = _digest_of(source, src_req)
        if mine != theirs:
            problems.append(f"{where}: its request {req.get('seq')} digests to {mine}, the source's request "
                            f"{src_req.get('seq')} to {theirs}")
        calls: list[dict[str, Any]] = []
        try:
            parsed = parse_response(str(req.get("api")), response_bytes(run_dir, ref), bool(rec.get("streamed")))
            calls = [{"name": c.get("name"), "id": c.get("id")} for c in parsed["tool_calls"]]
        except PARSE_ERRORS:
            pass
        replayed.append({"turn": turn, "request": req.get("seq"), "source_request": src_req.get("seq"),
                         "source_response": src_resp.get("seq"), "digest": mine_r, "reexecuted": calls})
    summary = {
        "from_run": info.get("from_run"), "source_head": info.get("source_head"),
        "source_turns": info.get("source_turns"), "replayed_turns": len(replayed), "replayed": replayed,
        "diverged_at": live.get("turn") if live and live.get("why") == "diverged" else None,
        "live": live, "reexecuted_calls": sum(len(r["reexecuted"]) for r in replayed),
    }
    return summary, problems


def resumed_result(summary: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """What a resumed run's result carries (``result.resumed``)."""
    info = load_resume(run_dir) or {}
    live = summary.get("live") if isinstance(summary.get("live"), dict) else None
    return {"from_run": summary.get("from_run"), "source_run_id": info.get("run_id"),
            "replayed_turns": summary.get("replayed_turns"),
            "diverged_at": summary.get("diverged_at"), "live_from": live.get("turn") if live else None,
            "divergence": live.get("summary") if live and live.get("why") == "diverged" else None,
            "reexecuted_calls": summary.get("reexecuted_calls"),
            "source_usage": info.get("source_usage") or {}}


def _digest_of(run_dir: Path, req: dict[str, Any]) -> str | None:
    ref = req.get("body") or {}
    raw = _raw_body(run_dir, ref)
    if raw is None:
        body, probs = read_body(run_dir, ref)
        if probs:
            return None
        raw_or_body: Any = body
    else:
        raw_or_body = raw
    return request_digest(str(req.get("api")), str(req.get("method")), str(req.get("path")), raw_or_body)
