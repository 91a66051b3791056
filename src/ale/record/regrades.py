"""A run's regrades: later gradings of its signed deliverables, appended and signed.

A regrade never touches what the run signed. Regrade ``n`` (1, 2, ...) is a folder
``regrades/<n>/`` of its own, sealed like a run folder is:

    regrades/<n>/regrade.json     what was regraded, with which task code, old and new
                                  grading, when, why, the grader's error
                 task.log         what the task process printed during the regrade
                 events.jsonl     the regrade's own hash-chained event log
                 evidence/        input-staged, reference-commit, reference-check,
                                  task-process (the re-staged input and reference)
                 public_key.pem   the key that signed the regrade
                 manifest.json    every file above with its sha256
                 attestation.dsse.json
                                  an in-toto Statement over those files, whose
                                  predicate names the sha256 of the attestation
                                  before it (the run's own for regrade 1, regrade
                                  n-1's otherwise): the regrades form a chain
                                  rooted in the run's signature.

The run's ``manifest.json`` and ``attestation.dsse.json`` stay as they were: the
original grading keeps verifying, and every regrade is checked against the
grading it replaced (``old`` must be the previous grading, its ``deliverables``
the run's signed ones). The latest grading is the last regrade's ``new``.

This module writes and checks that record; ``ale.runs.regrade`` does the regrading.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ale import layout
from ale.record import evidence as ev
from ale.record import signing
from ale.result import SCORE_EPSILON
from ale.status import RunStatus

REGRADES_DIR = "regrades"  # under the run folder: one folder per regrade, 1, 2, ...
REGRADE_RECORD = "regrade.json"  # the regrade's own record, inside regrades/<n>/
PARTIAL_PREFIX = ".partial-"  # regrades/.partial-<n>: a regrade being written; renamed to <n> once signed
REGRADE_PREDICATE_TYPE = "https://ale.dev/regrade/v1"
# The grading a regrade replaced and the one it produced: these fields, signed.
GRADING_FIELDS = ("status", "score", "scores", "invalid_attribution")
_UNLISTED = frozenset({layout.MANIFEST, layout.ATTESTATION})


def regrade_dir(run_dir: Path, n: int) -> Path:
    return Path(run_dir) / REGRADES_DIR / str(n)


def regrade_relpath(n: int, name: str = "") -> str:
    """``regrades/<n>/<name>``: a regrade file's path relative to the run folder."""
    return f"{REGRADES_DIR}/{n}/{name}" if name else f"{REGRADES_DIR}/{n}"


def is_regrade_path(rel: str) -> bool:
    """Whether a run-relative path lies in ``regrades/`` (checked by the regrade section of ``ale verify``)."""
    return rel == REGRADES_DIR or rel.startswith(REGRADES_DIR + "/")


def regrade_numbers(run_dir: Path) -> list[int]:
    """The regrades a run folder holds, in order (folders named by a positive integer)."""
    root = Path(run_dir) / REGRADES_DIR
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir() and not p.is_symlink()
                  and str(int(p.name)) == p.name and int(p.name) > 0)


def previous_attestation(n: int) -> str:
    """The run-relative path of the attestation regrade ``n`` chains to."""
    return layout.ATTESTATION if n == 1 else regrade_relpath(n - 1, layout.ATTESTATION)


def grading_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The signed fields of a grading (a result.json or a regrade's ``new``)."""
    return {k: doc.get(k) for k in GRADING_FIELDS}


def read_json(path: Path) -> Any:
    import json

    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def latest_record(run_dir: Path) -> dict[str, Any] | None:
    """The last regrade's record (``regrade.json``), read as it is (``ale verify`` checks it), or None."""
    numbers = regrade_numbers(run_dir)
    if not numbers:
        return None
    doc = read_json(regrade_dir(run_dir, numbers[-1]) / REGRADE_RECORD)
    return doc if isinstance(doc, dict) else None


# -- writing ----------------------------------------------------------------------
def partial_dir(run_dir: Path, n: int) -> Path:
    return Path(run_dir) / REGRADES_DIR / f"{PARTIAL_PREFIX}{n}"


def seal_regrade(run_dir: Path, n: int, key: Ed25519PrivateKey, predicate: dict[str, Any]) -> Path:
    """Sign the regrade being written in ``regrades/.partial-<n>/`` and move it to
    ``regrades/<n>/`` (one rename: a regrade is either whole and signed, or absent but
    for a partial folder that ``ale verify`` rejects). ``predicate`` gets the chain link
    (the previous attestation's sha256) and the signer's key id here."""
    run_dir = Path(run_dir)
    staging, final = partial_dir(run_dir, n), regrade_dir(run_dir, n)
    if final.exists():
        raise ev.EvidenceError(f"{final} exists already: regrade {n} was written before")
    prev = run_dir / previous_attestation(n)
    if not prev.is_file():
        raise ev.EvidenceError(f"{prev} is missing: regrade {n} has nothing to chain to")
    ev.write_new(staging / layout.PUBLIC_KEY, signing.public_key_pem(key))
    files, odd = ev.run_files(staging)
    if odd:
        raise ev.EvidenceError(f"regrade folder {staging} holds entries that are not regular files: {odd[:5]}")
    digests = {regrade_relpath(n, rel): ev.sha256_file(p) for rel, p in files.items()}
    statement = {
        "_type": signing.STATEMENT_TYPE,
        "subject": [{"name": rel, "digest": {"sha256": d}} for rel, d in sorted(digests.items())],
        "predicateType": REGRADE_PREDICATE_TYPE,
        "predicate": {
            **predicate,
            "regrade": n,
            "previous_attestation": {"path": previous_attestation(n), "sha256": ev.sha256_file(prev)},
            "public_key_sha256": signing.public_key_sha256(key),
            "signed_at": ev.utc_now_iso(),
        },
    }
    ev.write_json_new(staging / layout.MANIFEST, dict(sorted(digests.items())))
    ev.write_json_new(staging / layout.ATTESTATION, signing.sign_envelope(statement, key))
    os.rename(staging, final)
    return final


# -- checking ---------------------------------------------------------------------
@dataclass
class RegradeCheck:
    id: str
    ok: bool
    expected: Any = None
    observed: Any = None
    detail: str = ""


@dataclass
class RegradeFindings:
    checks: list[RegradeCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    latest: dict[str, Any] | None = None  # the latest grading's signed fields, when every regrade verifies

    def check(self, cid: str, ok: bool, expected: Any = None, observed: Any = None, detail: str = "") -> bool:
        self.checks.append(RegradeCheck(cid, bool(ok), expected, observed, "" if ok else detail))
        return bool(ok)


KeyFor = Callable[[int, Any], tuple[Ed25519PublicKey | None, str]]


def key_chooser(run_dir: Path, public_key_path: Path | None, trusted: dict[str, bytes]) -> KeyFor:
    """The key each regrade must verify with: a trusted key its envelope names
    (``--trusted-keys``), else the key given with ``--public-key``, else the key the
    regrade recorded (which shows its files are unchanged, not who signed them)."""

    def key_for(n: int, envelope: Any) -> tuple[Ed25519PublicKey | None, str]:
        sigs = envelope.get("signatures") if isinstance(envelope, dict) else None
        ids = [s.get("keyid") for s in sigs if isinstance(s, dict)] if isinstance(sigs, list) else []
        try:
            for kid in ids:
                if kid in trusted:
                    key = serialization.load_pem_public_key(trusted[kid])
                    if not isinstance(key, Ed25519PublicKey):
                        return None, f"trusted key sha256:{str(kid)[:16]}… is not an Ed25519 key"
                    return key, f"the trusted key sha256:{str(kid)[:16]}…"
            if public_key_path is not None:
                return (signing.load_public_key(Path(public_key_path)),
                        f"the key given with --public-key {public_key_path}")
            if trusted:
                return None, "the regrade's signer is not among the trusted keys"
            rel = regrade_relpath(n, layout.PUBLIC_KEY)
            return (signing.load_public_key(Path(run_dir) / rel),
                    f"the key recorded in {rel} (integrity, not who signed it)")
        except (signing.SignatureInvalid, ValueError) as e:
            return None, str(e)

    return key_for


def scores_consistent(g: dict[str, Any]) -> str:
    """Why a grading's status and scores do not fit together ("" when they do)."""
    try:
        status = RunStatus(str(g.get("status")))
    except ValueError:
        return f"unknown status {g.get('status')!r}"
    score, scores = g.get("score"), g.get("scores")
    if score is None:
        return f"a {status.value} grading without a score" if status is RunStatus.SCORED else (
            "scores without their mean" if scores else "")
    if not status.carries_score:
        return f"a {status.value} grading carries a score"
    if not isinstance(scores, list) or not scores \
            or not all(isinstance(s, int | float) and not isinstance(s, bool) for s in scores):
        return "a score without the scores it is the mean of"
    if any(not -SCORE_EPSILON <= s <= 1 + SCORE_EPSILON for s in scores):
        return f"scores outside [0, 1]: {scores}"
    mean = sum(scores) / len(scores)
    if not isinstance(score, int | float) \
            or not math.isclose(mean, score, rel_tol=SCORE_EPSILON, abs_tol=SCORE_EPSILON):
        return f"score {score} is not the mean of scores {scores}"
    return ""


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def check_regrades(run_dir: Path, original: dict[str, Any], key_for: KeyFor) -> RegradeFindings:
    """Check every regrade of a run folder, in order.

    ``original``: the run's own grading as its verified result.json states it, plus
    ``run_id``, ``deliverables_digest``, ``input_digest`` (input-after-start),
    ``reference_sha256`` (the committed reference) and ``ended_at``. ``key_for(n,
    envelope)`` gives the public key regrade ``n`` must verify with, and a phrase
    saying where it came from (None: no usable key)."""
    run_dir = Path(run_dir)
    out = RegradeFindings()
    root = run_dir / REGRADES_DIR
    if not root.exists():
        return out
    if not root.is_dir() or root.is_symlink():
        out.check("regrades.folder", False, "a folder", "a file or link", f"{REGRADES_DIR} is not a folder")
        return out
    numbers = regrade_numbers(run_dir)
    strays = sorted(p.name for p in root.iterdir()
                    if not (p.name.isdigit() and int(p.name) in numbers and str(int(p.name)) == p.name))
    out.check("regrades.entries", not strays, "regrade folders 1..n", strays,
              f"{REGRADES_DIR}/ holds entries that are no signed regrade: {strays[:5]}"
              + (" (a regrade that did not finish; remove it)"
                 if any(s.startswith(PARTIAL_PREFIX) for s in strays) else ""))
    out.check("regrades.numbered", numbers == list(range(1, len(numbers) + 1)),
              list(range(1, len(numbers) + 1)), numbers,
              f"the regrades are not numbered 1..{len(numbers)} without gaps: one was removed")
    previous = grading_summary(original)
    broken = False
    for n in numbers:
        ok, new = _check_one(run_dir, n, original, previous, key_for, out)
        broken = broken or not ok
        if new is not None:
            previous = new
    out.latest = None if broken or not numbers else previous
    if numbers and not broken:
        out.notes.append(f"{len(numbers)} regrade(s) verify; the latest grading is {previous.get('status')} "
                         f"score {previous.get('score')}")
    return out


def _check_one(run_dir: Path, n: int, original: dict[str, Any], previous: dict[str, Any], key_for: KeyFor,
               out: RegradeFindings) -> tuple[bool, dict[str, Any] | None]:
    where = regrade_relpath(n)
    folder = regrade_dir(run_dir, n)
    before = len([c for c in out.checks if not c.ok])
    envelope = read_json(folder / layout.ATTESTATION)
    if envelope is None:
        out.check(f"regrade.{n}.signature", False, layout.ATTESTATION, None,
                  f"{where}: no readable {layout.ATTESTATION}: the regrade is unsigned")
        return False, None
    key, source = key_for(n, envelope)
    statement: dict[str, Any] | None = None
    if key is None:
        out.check(f"regrade.{n}.signature", False, "a key", None,
                  f"{where}: no usable key to check its signature ({source})")
    else:
        try:
            statement = signing.verify_envelope(envelope, key)
            out.check(f"regrade.{n}.signature", True, source, "verified")
            out.notes.append(f"regrade {n}: signature checked with {source}")
        except signing.SignatureInvalid as e:
            out.check(f"regrade.{n}.signature", False, source, None, f"{where}: {e}")
    if statement is None:
        return False, None
    if statement.get("predicateType") != REGRADE_PREDICATE_TYPE:
        out.check(f"regrade.{n}.type", False, REGRADE_PREDICATE_TYPE, statement.get("predicateType"),
                  f"{where}: not a regrade statement")
    pred = statement.get("predicate") if isinstance(statement.get("predicate"), dict) else {}
    assert isinstance(pred, dict)
    kid = signing.public_key_sha256(key) if key is not None else None
    out.check(f"regrade.{n}.key_recorded", pred.get("public_key_sha256") == kid, kid, pred.get("public_key_sha256"),
              f"{where}: the statement names another signing key than the one that verified it")
    # the files: exactly the signed subjects, unchanged
    files, odd = ev.run_files(folder)
    present = {regrade_relpath(n, rel) for rel in files} - {regrade_relpath(n, u) for u in _UNLISTED}
    subjects: dict[str, str] = {}
    for s in statement.get("subject") or []:
        name = s.get("name") if isinstance(s, dict) else None
        digest = ((s.get("digest") or {}).get("sha256")) if isinstance(s, dict) else None
        if isinstance(name, str) and isinstance(digest, str) and name.startswith(regrade_relpath(n) + "/") \
                and ".." not in PurePosixPath(name).parts:
            subjects[name] = digest
        else:
            out.check(f"regrade.{n}.subjects", False, f"files of {where}", s,
                      f"{where}: a subject outside its folder: {s!r}")
    for rel in odd:
        out.check(f"regrade.{n}.file", False, "a regular file", rel, f"{where}/{rel} is a link or special file")
    for name, want in sorted(subjects.items()):
        if name not in present:
            out.check(f"regrade.{n}.file", False, want, None, f"{name} is signed but missing")
            continue
        digest = ev.sha256_file(run_dir / name)
        out.check(f"regrade.{n}.file", digest == want, want, digest, f"{name} changed after the regrade was signed")
    for name in sorted(present - set(subjects)):
        out.check(f"regrade.{n}.file", False, None, name,
                  f"{name} is not in the regrade's signed statement: added afterwards")
    manifest = read_json(folder / layout.MANIFEST)
    out.check(f"regrade.{n}.manifest", manifest == subjects, "the signed subjects",
              None if manifest is None else sorted(manifest),
              f"{where}/{layout.MANIFEST} is missing or disagrees with the signed statement")
    # the chain
    prev_rel = previous_attestation(n)
    link = pred.get("previous_attestation") if isinstance(pred.get("previous_attestation"), dict) else {}
    assert isinstance(link, dict)
    prev_path = run_dir / prev_rel
    got_prev = ev.sha256_file(prev_path) if prev_path.is_file() else None
    out.check(f"regrade.{n}.chain", link.get("path") == prev_rel and link.get("sha256") == got_prev,
              {"path": prev_rel, "sha256": got_prev}, link,
              f"{where} does not chain to {prev_rel} as it is now (the attestation it was signed after changed, "
              "or a regrade before it was replaced)")
    # the record, as signed, against the run and the grading it replaced
    record = read_json(folder / REGRADE_RECORD)
    if not isinstance(record, dict):
        out.check(f"regrade.{n}.record", False, REGRADE_RECORD, None,
                  f"{where}/{REGRADE_RECORD} is missing or not JSON")
        return False, None
    new = grading_summary(record.get("new") or {})
    old = grading_summary(record.get("old") or {})
    claims: dict[str, Any] = {"run_id": original.get("run_id"), "old": previous, "regrade": n}
    got: Any
    for k, want in claims.items():
        got = record.get(k) if k != "old" else old
        out.check(f"regrade.{n}.{k}", got == want, want, got,
                  f"{where}: {k} is {got!r}, not {want!r}" + (" (the grading before it)" if k == "old" else ""))
    for k in ("deliverables_digest", "input_digest", "reference_sha256"):
        got = record.get(k)
        out.check(f"regrade.{n}.{k}", got == original.get(k), original.get(k), got,
                  f"{where}: it graded another {k.split('_')[0]} than the run signed")
    signed = {"run_id": pred.get("run_id"), "old": pred.get("old"), "new": pred.get("new"),
              "task_code_sha256": pred.get("task_code_sha256"), "deliverables_digest": pred.get("deliverables_digest")}
    recorded = {"run_id": record.get("run_id"), "old": old, "new": new,
                "task_code_sha256": (record.get("task") or {}).get("code_sha256_new"),
                "deliverables_digest": record.get("deliverables_digest")}
    diff = sorted(k for k in signed if signed[k] != recorded[k])
    out.check(f"regrade.{n}.statement", not diff, "the record = the signed predicate", diff,
              f"{where}/{REGRADE_RECORD} disagrees with its signed statement on {diff}")
    why = scores_consistent(new)
    out.check(f"regrade.{n}.scores", not why, "status and scores that fit", new, f"{where}: {why}")
    at, ended = record.get("at"), original.get("ended_at")
    t_at, t_end = _time(at), _time(ended)
    out.check(f"regrade.{n}.time", t_at is not None and t_end is not None and t_at > t_end, f"after {ended}", at,
              f"{where}: regraded at {at!r}, not after the run ended")
    events = folder / layout.EVENTS
    if events.is_file():
        problems = ev.verify_chain(events)
        out.check(f"regrade.{n}.events", not problems, "an intact hash chain", problems[:3], f"{where}: {problems[:1]}")
    failed = len([c for c in out.checks if not c.ok]) > before
    return not failed, new
