"""The gateway's record: every request and response of a run, hash-chained.

``RUN/agent/gateway/records.jsonl`` holds one JSON line per record; each names
its predecessor's hash (``prev``) and its own (``hash``: sha256 of the canonical
JSON of the record without ``hash``), so a removed, reordered or edited line
breaks the chain. The first record (``gateway.start``) holds the tool policy
(the allowlist, the names each harness gives the bridge's tools, the harness
profile) and the upstreams. Then, per exchange:

- ``request``: api, method, path, headers and query with keys redacted, the
  body (inline as ``body_json`` when it is JSON of at most ``INLINE_LIMIT``
  bytes, else a file under ``bodies/`` named with its sha256 and size), the
  tools the request offered, the ones outside the policy and the decision
  (``forwarded`` / ``refused``; ``replayed`` in a resumed run, answered from the
  interrupted run's record: ``resume.py``);
- ``response``: the upstream status, headers, body (same rule), whether it was
  streamed, first-byte and total seconds, and the usage read from it (``by:
  replay``: a recorded answer replayed, no usage, ``replay_of`` naming it);
- ``resume.live`` (a resumed run): the turn from which the live model answers,
  why (``diverged``: the digest pair and what differed; ``after_last``).

``summarize(run_dir)`` re-reads the file and derives what the run's evidence
keeps: the chain head, the tools offered on every request, the refusals (and
whether the first one came before any model answer), the usage; and, from the
recorded response bodies again (never from the usage the record names), the cost
per model with the price table's version, and every model call's named failure
(``failures.classify``) with the retries the gateway made (``upstream_attempt``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ale import layout
from ale.agents.gateway.chain import (
    GATEWAY_DIR,
    GENESIS,
    RECORDS,
    canonical,
    read_body,
    read_records,
    record_hash,
)
from ale.agents.gateway.failures import classify, transport_class
from ale.agents.gateway.limits import GatewayLimits, refusal
from ale.agents.gateway.parse import response_bytes
from ale.agents.gateway.tools import GEMINI, ToolPolicy, is_model_call, offered_tools
from ale.agents.gateway.usage import add_billing, cost, price_table, usage_of
from ale.redaction import REDACTED
from ale.status import FAILURE_OWNER, ModelFailure, not_the_agents

BODIES = layout.Gateway.BODIES
CONFINEMENT = layout.agent_path(layout.Agent.CONFINEMENT)  # written by the command agent when it confines the harness
INLINE_LIMIT = 16 * 1024
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie", "proxy-authorization"})
SECRET_QUERY = frozenset({"key", "api_key", "apikey", "token"})


def redact_headers(headers: list[tuple[str, str]]) -> list[list[str]]:
    return [[k, REDACTED if k.lower() in SECRET_HEADERS else v] for k, v in headers]


def redact_query(pairs: list[tuple[str, str]]) -> list[list[str]]:
    return [[k, REDACTED if k.lower() in SECRET_QUERY else v] for k, v in pairs]


__all__ = ["GATEWAY_DIR", "GENESIS", "RECORDS", "canonical", "read_body", "read_records", "record_hash"]  # re-exported


class GatewayRecorder:
    """Appends chained records; bodies past the inline limit go to files."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / GATEWAY_DIR
        (self.dir / BODIES).mkdir(parents=True, exist_ok=True)
        self.path = self.dir / RECORDS
        self._lock = threading.Lock()
        self.seq = 0
        self.head = GENESIS
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)

    def body(self, seq: int, kind: str, data: bytes) -> dict[str, Any]:
        """The record's view of a body: inline JSON when small, else a file reference."""
        if not data:
            return {"bytes": 0}
        if len(data) <= INLINE_LIMIT:
            try:
                return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "json": json.loads(data)}
            except (ValueError, RecursionError):  # a body nested past the parser: kept as a file
                pass
        rel = f"{BODIES}/{seq:06d}-{kind}"
        with open(self.dir / rel, "wb") as f:
            f.write(data)
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "file": f"{GATEWAY_DIR}/{rel}"}

    def append(self, type: str, **data: Any) -> dict[str, Any]:
        with self._lock:
            rec = {"seq": self.seq + 1, "time": datetime.now(UTC).isoformat(), "type": type, **data, "prev": self.head}
            rec["hash"] = record_hash(rec)
            os.write(self._fd, canonical(rec) + b"\n")
            self.seq, self.head = rec["seq"], rec["hash"]
            return rec

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1


def derive(run_dir: Path, records: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """What the records prove, re-derived from the recorded request bodies (never
    from the recorded tool lists): per request the tools offered and the ones
    outside the policy; the refusals; the usage the responses report."""
    problems: list[str] = []
    start = next((r for r in records if r.get("type") == "gateway.start"), None)
    if start is None:
        return {}, ["the gateway's record has no gateway.start record (its policy)"]
    policy = ToolPolicy.from_dict(start.get("policy") or {})
    limits = GatewayLimits.from_dict(start.get("limits"))
    blocked: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []
    refusals: list[dict[str, Any]] = []
    answered = False
    usage: dict[str, Any] = {}
    _, prices = price_table(start.get("prices"))  # recorded flat; its version beside it
    version = (start.get("price_table") or {}).get("version") if isinstance(start.get("price_table"), dict) else None
    billing: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    retries = 0
    apis: dict[Any, str] = {}
    for rec in records:
        if rec.get("type") == "upstream_attempt":
            retries += 1
            continue
        if rec.get("type") == "response":
            if isinstance(rec.get("status"), int) and 200 <= rec["status"] < 300 and rec.get("model_call"):
                answered = True
            _add_usage(usage, rec.get("usage") or {})
            if rec.get("model_call") and rec.get("by") == "upstream" and "price_table" in start:
                problems += _rederive_response(run_dir, rec, apis.get(rec.get("request"), ""), prices,
                                               billing, failures)
            continue
        if rec.get("type") != "request":
            continue
        body, probs = read_body(run_dir, rec.get("body") or {})
        problems += [f"request {rec.get('seq')}: {p}" for p in probs]
        api, path = str(rec.get("api")), str(rec.get("path"))
        apis[rec.get("seq")] = api
        model_call = is_model_call(api, path)
        tools = offered_tools(api, path, body) if model_call else []
        forbidden = policy.forbidden(tools)
        if tools != rec.get("tools") or forbidden != rec.get("forbidden"):
            problems.append(
                f"request {rec.get('seq')}: its record names tools {rec.get('tools')} (forbidden "
                f"{rec.get('forbidden')}), but its body offers {tools} (forbidden {forbidden})"
            )
        if forbidden and rec.get("decision") != "refused":
            problems.append(f"request {rec.get('seq')} offered {forbidden}, outside the policy, yet was "
                            f"{rec.get('decision')}")
        model = body.get("model") if isinstance(body, dict) else None
        if api == GEMINI and "/models/" in path:
            model = path.split("/models/", 1)[1].split(":", 1)[0]
        model = model if isinstance(model, str) else None
        limited = refusal(limits, model_call=model_call, model=model,
                          body_bytes=int((rec.get("body") or {}).get("bytes") or 0),
                          body=body)
        if limited is not None and rec.get("decision") != "refused":
            problems.append(f"request {rec.get('seq')} ({method_path(rec)}) should have been refused "
                            f"({limited[0]}), yet was {rec.get('decision')}")
        if rec.get("refused_for"):
            blocked.append({"seq": rec.get("seq"), "kind": rec.get("refused_for"), "path": path, "model": model})
        entry = {"seq": rec.get("seq"), "api": api, "path": path, "model": rec.get("model"), "tools": tools,
                 "decision": rec.get("decision")}
        requests.append(entry)
        if forbidden and policy.client_tools:  # a native harness: withheld, recorded, the run goes on
            if rec.get("refused_for") != "server_tool":
                problems.append(f"request {rec.get('seq')} offered {forbidden} but is not recorded as "
                                "withheld (server_tool)")
        elif forbidden:
            refusals.append({"seq": rec.get("seq"), "forbidden": forbidden, "before_any_answer": not answered})
    summary = {
        "policy": start.get("policy"),
        "upstreams": start.get("upstreams"),
        "records": len(records),
        "head": records[-1].get("hash") if records else GENESIS,
        "requests": requests,
        "tools_offered": sorted({t for r in requests for t in r["tools"]}),
        "refusals": refusals,
        "usage": usage,
    }
    if start.get("limits"):  # older records have none: their summary keeps its shape
        summary["limits"] = start["limits"]
        summary["blocked"] = blocked
    if "price_table" in start:  # older records: no per-model cost, no named failures
        summary["billing"] = billing_doc(billing, version, start.get("price_table"))
        summary["failures"] = failures
        summary["retries"] = retries
        final = next((f for f in failures if not_the_agents(f["failure"])
                      and not 200 <= int(f.get("status") or 0) < 300), None)
        summary["provider_failure"] = final
        summary["last_failure"] = _last_failure(records, failures)
    if isinstance(start.get("resume"), dict):  # a resumed run: its replayed turns against the source's record
        from ale.agents.gateway.resume import derive_resume

        summary["resumed"], more = derive_resume(run_dir, records, start)
        problems += [f"resume: {p}" for p in more]
    return summary, problems


def billing_doc(by_model: dict[str, dict[str, Any]], version: str | None, table: Any) -> dict[str, Any]:
    """A run's cost: per model and in total, with the price table that priced it."""
    total: dict[str, Any] = {}
    add = dict(by_model)
    for row in add.values():
        for k, v in row.items():
            total[k] = round(total.get(k, 0) + v, 8) if isinstance(v, float) else total.get(k, 0) + v
    return {"by_model": {k: by_model[k] for k in sorted(by_model)}, "total": total,
            "price_table": {"version": version,
                            "sha256": (table or {}).get("sha256") if isinstance(table, dict) else None}}


def _rederive_response(run_dir: Path, rec: dict[str, Any], api: str, prices: dict[str, Any],
                       billing: dict[str, dict[str, Any]], failures: list[dict[str, Any]]) -> list[str]:
    """One model call's answer, read again: its usage and cost into ``billing``, its
    named failure into ``failures``; a recorded usage or failure that differs is a problem."""
    problems: list[str] = []
    status: int = rec["status"] if isinstance(rec.get("status"), int) else 0
    data = response_bytes(run_dir, rec.get("body") or {})
    streamed = bool(rec.get("streamed"))
    if 200 <= status < 300:
        u: dict[str, Any] = {"requests": 1, **usage_of(api, data, streamed)}
        price = cost(u, u.get("model"), prices)
        if price is not None:
            u["cost_usd"] = price
        recorded = rec.get("usage") or {}
        if {k: v for k, v in u.items() if k != "model"} != recorded:
            problems.append(f"response {rec.get('seq')}: its record names usage {recorded}, its body reports {u}")
        add_billing(billing, u)
    failure = transport_class(str(rec["transport_error"])) if rec.get("transport_error") \
        else classify(api, status, data, streamed)
    if (failure.value if failure else None) != rec.get("failure"):
        problems.append(f"response {rec.get('seq')}: recorded as failure {rec.get('failure')!r}, its "
                        f"status and body say {failure.value if failure else None!r}")
    if failure is not None:
        failures.append({"request": rec.get("request"), "failure": failure.value, "owner": FAILURE_OWNER[failure].value,
                         "status": status, "retries": rec.get("retries", 0)})
    return problems


def _last_failure(records: list[dict[str, Any]], failures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The named failure of the last model call answered by the upstream (None: it succeeded)."""
    last = next((r for r in reversed(records) if r.get("type") == "response" and r.get("model_call")
                 and r.get("by") == "upstream"), None)
    if last is None:
        return None
    return next((f for f in failures if f["request"] == last.get("request")), None)


def failure_of(summary: dict[str, Any]) -> ModelFailure | None:
    f = summary.get("provider_failure") or summary.get("last_failure")
    return ModelFailure(f["failure"]) if isinstance(f, dict) else None


def method_path(rec: dict[str, Any]) -> str:
    return f"{rec.get('method')} {rec.get('api')}{rec.get('path')}"


def _add_usage(total: dict[str, Any], u: dict[str, Any]) -> None:
    for k, v in u.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            total[k] = round(total.get(k, 0) + v, 8)


def summarize(run_dir: Path) -> dict[str, Any] | None:
    """The summary the run's evidence keeps, or None when no gateway ran."""
    if not (Path(run_dir) / GATEWAY_DIR / RECORDS).exists():
        return None
    records, problems = read_records(run_dir)
    summary, more = derive(run_dir, records)
    summary["problems"] = problems + more
    return summary


def evidence_record(run_dir: Path) -> dict[str, Any] | None:
    """What the run's evidence keeps about the controller side (``evidence/controller.json``):
    the gateway's summary and the harness's confinement; None when no gateway ran."""
    summary = summarize(run_dir)
    if summary is None:
        return None
    confinement = None
    with contextlib.suppress(OSError, ValueError):
        confinement = json.loads((Path(run_dir) / CONFINEMENT).read_text())
    return {"gateway": summary, "confinement": confinement}


def channel_checks(confinement: Any) -> list[Any]:
    """A native harness's channel, judged from its record (``agent/confinement.json``,
    kept in ``evidence/controller.json``): the relay ran as the candidate user,
    unprivileged, without a terminal, as ``python3 relay.py PORT``; its stream carried
    no malformed frame. No checks for other agents."""
    from ale.isolation.checks import Check

    if not isinstance(confinement, dict) or confinement.get("kind") != "sandbox-native":
        return []
    ch: dict[str, Any] = confinement["channel"] if isinstance(confinement.get("channel"), dict) else {}
    proc: dict[str, Any] = ch["process"] if isinstance(ch.get("process"), dict) else {}
    want = {"user": ch.get("expected_user"), "privileged": False, "tty": False}
    got = {k: proc.get(k) for k in want}
    argv = proc.get("argv") or []
    ok_proc = ch.get("kind") == "exec-stream" and got == want and bool(want["user"]) and len(argv) == 3 and \
        argv[0] == "python3" and str(argv[1]).endswith("/relay.py")
    errors = int(ch.get("protocol_errors") or 0)
    return [
        Check("channel.process", ok_proc, {**want, "argv": ["python3", ".../relay.py", "PORT"]}, {**got, "argv": argv},
              "" if ok_proc
              else "the channel's relay did not run as the unprivileged candidate user, or is not the relay"),
        Check("channel.frames", errors == 0, 0, errors,
              "" if errors == 0 else f"the channel closed on {errors} malformed frame(s) from the sandbox"),
    ]
