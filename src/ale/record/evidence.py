"""The evidence a run keeps, written once, hash-chained and signed.

One writer owns the files: ``EvidenceStore`` writes ``evidence/*`` and refuses to
overwrite, ``EventLog`` appends the hash-chained ``events.jsonl`` (fsync per
event), and ``write_manifest_and_sign`` seals the whole run folder last: a
``manifest.json`` of every file's sha256 and an in-toto Statement over the same
files, signed with Ed25519 in a DSSE envelope. ``ale verify`` re-checks all of
it from the files alone (``ale.record.verify``).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel

from ale import layout
from ale.data.hashing import make_tree_hash, tree_digest
from ale.data.hashing import sha256_file as _sha256_and_size
from ale.layout import Evidence
from ale.lossless import json_safe, needs_json_safe
from ale.record.signing import (
    STATEMENT_TYPE,
    canonical_json,
    public_key_pem,
    public_key_sha256,
    sign_envelope,
)

PREDICATE_TYPE = "https://ale.dev/evidence/v1"
# Written by the signing step itself, so never listed in the manifest they seal.
UNLISTED_FILES = frozenset({layout.MANIFEST, layout.ATTESTATION})
GENESIS = "0" * 64


class EvidenceError(RuntimeError):
    """Evidence cannot be written as required (exists already, bad name, odd file)."""


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return _sha256_and_size(Path(path))[0]


# -- tree hashes ------------------------------------------------------------------
def hash_tree(root: Path, *, known: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    """Hash every entry under ``root`` without following links.

    ``known`` (path under ``root`` → ``sha256`` and ``size``) are digests taken in the
    same pass that wrote those files (a package's copy): a regular file listed there
    with the same size is not read again; any other is.

    Returns ``{"files": {relpath: {"sha256", "size"}}, "others": {relpath: {"type",
    ...}}, "digest", "count"}``. ``files`` and, when ``others`` is empty, ``digest``
    have the format of ``ale.data.hashing``; symlinks (with their target), FIFOs,
    sockets and devices are recorded in ``others`` and folded into the digest, so
    a link planted in a tree changes its digest. Empty folders are not recorded.
    """
    root = Path(root)
    files: dict[str, dict[str, Any]] = {}
    others: dict[str, dict[str, Any]] = {}
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(root / rel_dir if rel_dir else root) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            st = entry.stat(follow_symlinks=False)
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                stack.append(rel)
            elif stat.S_ISREG(mode):
                seen = known.get(rel) if known else None
                if seen is not None and int(seen["size"]) == st.st_size:
                    files[rel] = {"sha256": seen["sha256"], "size": st.st_size}
                else:
                    digest, size = _sha256_and_size(root / rel)
                    files[rel] = {"sha256": digest, "size": size}
            elif stat.S_ISLNK(mode):
                others[rel] = {"type": "symlink", "target": os.readlink(root / rel)}
            else:
                others[rel] = {"type": _special_kind(mode), "mode": oct(mode)}
    tree = make_tree_hash(files)
    tree["others"] = {rel: others[rel] for rel in sorted(others)}
    tree["digest"] = tree_hash_digest(tree)
    return tree


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def tree_hash_digest(tree: Mapping[str, Any]) -> str:
    """Recompute a tree hash's digest from its own listing (what verify trusts)."""
    files = tree.get("files")
    if not isinstance(files, Mapping):
        raise ValueError("tree hash has no 'files' mapping")
    digest = tree_digest(files)
    others = tree.get("others") or {}
    if others:
        digest = sha256_bytes(digest.encode() + b"\0" + canonical_json(dict(others)))
    return digest


# -- writing files once -------------------------------------------------------------
def _json_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def to_json_text(obj: Any) -> str:
    """One line of JSON that encodes as UTF-8 whatever strings `obj` holds: a str
    with lone surrogates (or bytes) is kept as ``ale.lossless.json_safe`` says;
    anything else is written exactly as ``json.dumps`` writes it."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    # One line, no indent: only then does json use its C encoder, and evidence is
    # written on every run's hot path (`jq .` or `python -m json.tool` to read it).
    try:
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_json_default) + "\n"
        text.encode("utf-8")
        if not needs_json_safe(text):
            return text
    except (UnicodeEncodeError, TypeError):
        pass
    # The slow path: only records holding what UTF-8 cannot, bytes, or marker-like keys.
    return json.dumps(json_safe(obj, default=_json_default), ensure_ascii=False, allow_nan=False) + "\n"


def write_new(path: Path, data: bytes, *, mode: int = 0o644, durable: bool = True) -> Path:
    """Write a file that must not exist yet, and fsync it (unless not ``durable``)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError as e:
        raise EvidenceError(f"{path} exists already; evidence is written once, never overwritten") from e
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    return path


def write_json_new(path: Path, obj: Any, *, durable: bool = True) -> Path:
    return write_new(Path(path), to_json_text(obj).encode(), durable=durable)


class EvidenceStore:
    """``RUN_DIR/evidence/``: flat files, each written once (and fsynced, unless
    ``durable`` is False: a record that is no evidence, as a grading probe's)."""

    def __init__(self, run_dir: Path, *, durable: bool = True):
        self.run_dir = Path(run_dir)
        self.durable = durable
        self.dir = self.run_dir / layout.EVIDENCE_DIR
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        if not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
            raise EvidenceError(f"evidence file name {name!r} must be a plain file name")
        return self.dir / name

    def write_json(self, name: str, obj: Any) -> Path:
        return write_json_new(self.path(name), obj, durable=self.durable)

    def write_text(self, name: str, text: str) -> Path:
        return write_new(self.path(name), text.encode(), durable=self.durable)



# -- the event log --------------------------------------------------------------------
def event_hash(record: Mapping[str, Any]) -> str:
    return sha256_bytes(canonical_json({k: v for k, v in record.items() if k != "hash"}))


class EventLog:
    """Append-only, hash-chained ``events.jsonl``: each line names its predecessor's
    hash, so removing, reordering or editing a line breaks the chain. Each line is
    fsynced unless ``durable`` is False (a record that is no evidence)."""

    def __init__(self, path: Path, *, resume: bool = False, durable: bool = True):
        self.path = Path(path)
        self.durable = durable
        self._lock = threading.Lock()
        self.seq = 0
        self.head = GENESIS
        if self.path.exists() and self.path.stat().st_size > 0:
            if not resume:
                raise EvidenceError(
                    f"event log {self.path} already holds events; a new run needs a new folder "
                    "(pass resume=True only to continue this same run)"
                )
            problems = verify_chain(self.path)
            if problems:
                raise EvidenceError(f"cannot resume event log {self.path}: {problems[0]}")
            last = json.loads(_lines(self.path.read_bytes().decode("utf-8"))[-1])
            self.seq, self.head = last["seq"], last["hash"]

    def append(self, type: str, **data: Any) -> dict:
        """Append one event. ``data`` may hold any strings and bytes: they are kept
        as ``ale.lossless.json_safe`` says, so every line is UTF-8 JSON whose hash
        ``ale verify`` re-derives from the line alone."""
        with self._lock:
            record: dict[str, Any] = {
                "seq": self.seq + 1,
                "time": utc_now_iso(),
                "type": json_safe(type),
                "data": json.loads(json.dumps(json_safe(data, default=_json_default), allow_nan=False)),
                "prev": self.head,
            }
            record["hash"] = event_hash(record)
            line = canonical_json(record) + b"\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, line)
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self.seq, self.head = record["seq"], record["hash"]
            return record


def _lines(text: str) -> list[str]:
    """The lines of a JSON-lines text: split on "\n" only. (str.splitlines also
    splits on U+0085, U+2028, U+2029 and other separators, which JSON written with
    ensure_ascii=False holds raw inside strings.)"""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_chain(path: Path) -> tuple[list[dict], list[str]]:
    """The events of a log and the problems found in its chain (empty: intact)."""
    problems: list[str] = []
    events: list[dict] = []
    try:
        text = Path(path).read_bytes().decode()
    except (OSError, UnicodeDecodeError) as e:
        return [], [f"{path}: cannot read the event log: {e}"]
    if text and not text.endswith("\n"):
        problems.append(f"{path}: the last line is incomplete (the log was cut)")
    prev_hash, prev_seq = GENESIS, 0
    for lineno, line in enumerate(_lines(text), 1):
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not JSON ({e.msg})")
            continue
        if not isinstance(rec, dict) or not {"seq", "time", "type", "data", "prev", "hash"} <= rec.keys():
            problems.append(f"{where}: not an event record (needs seq, time, type, data, prev, hash)")
            continue
        seq = rec["seq"]
        if seq != prev_seq + 1:
            problems.append(
                f"{where}: seq {seq} follows seq {prev_seq}"
                + (f": {seq - prev_seq - 1} event(s) missing" if isinstance(seq, int) and seq > prev_seq else "")
            )
        if rec["prev"] != prev_hash:
            problems.append(f"{where}: seq {seq} links to {str(rec['prev'])[:16]}…, not to the hash of "
                            "the event before it")
        if rec["hash"] != event_hash(rec):
            problems.append(f"{where}: seq {seq} ({rec['type']}) does not match its hash: the event was edited")
        events.append(rec)
        prev_hash, prev_seq = rec["hash"], seq if isinstance(seq, int) else prev_seq + 1
    return events, problems


def verify_chain(path: Path) -> list[str]:
    """Problems in the chain of ``events.jsonl``: broken link, bad hash, gap in seq."""
    return read_chain(path)[1]


# -- the signed manifest ----------------------------------------------------------------
def run_files(run_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """Every regular file under ``run_dir`` by relpath (``/``), except the manifest and
    the attestation; and the relpaths of entries that are neither files nor folders."""
    files: dict[str, Path] = {}
    odd: list[str] = []
    for dirpath, dirnames, filenames in os.walk(run_dir, followlinks=False):
        base = Path(dirpath)
        rel_base = base.relative_to(run_dir)
        for name in sorted(dirnames):
            if os.path.islink(base / name):
                odd.append(str(PurePosixPath(rel_base, name).as_posix()))
        dirnames[:] = [d for d in dirnames if not os.path.islink(base / d)]
        for name in filenames:
            rel = PurePosixPath(*rel_base.parts, name).as_posix()
            if rel in UNLISTED_FILES:
                continue
            if stat.S_ISREG(os.lstat(base / name).st_mode):
                files[rel] = base / name
            else:
                odd.append(rel)
    return dict(sorted(files.items())), sorted(odd)


def _read_json_if(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def build_predicate(run_dir: Path, key: Ed25519PrivateKey, digests: Mapping[str, str]) -> dict:
    """What the statement asserts about the run, beyond its files' digests."""
    result = _read_json_if(run_dir / layout.RESULT)
    if not isinstance(result, dict):
        raise EvidenceError(f"{run_dir / layout.RESULT} is missing or not JSON: write the result before signing")
    events_path = run_dir / layout.EVENTS
    events, problems = read_chain(events_path) if events_path.exists() else ([], [])
    if problems:
        raise EvidenceError(f"refusing to sign a broken event log: {problems[0]}")
    inputs = _read_json_if(run_dir / layout.EVIDENCE_DIR / Evidence.INPUT_AFTER_RUN)
    deliverables = _read_json_if(run_dir / layout.DELIVERABLES)
    ref = _read_json_if(run_dir / layout.EVIDENCE_DIR / Evidence.REFERENCE_COMMIT)
    ref_source = ref.get("source") if isinstance(ref, dict) else None
    return {
        "run_id": result.get("run_id"),
        "status": result.get("status"),
        "score": result.get("score"),
        "scores": result.get("scores"),
        "harness_version": result.get("harness_version"),
        "public_key_sha256": public_key_sha256(key),
        "policy_sha256": digests.get(layout.evidence_path(Evidence.POLICY)),
        "events": {"count": len(events), "head": events[-1]["hash"] if events else GENESIS},
        "input_digest": inputs.get("digest") if isinstance(inputs, dict) else None,
        "deliverables_digest": deliverables.get("digest") if isinstance(deliverables, dict) else None,
        "reference_sha256": ref_source.get("sha256") if isinstance(ref_source, dict) else None,
        "signed_at": utc_now_iso(),
    }


def write_manifest_and_sign(run_dir: Path, private_key: Ed25519PrivateKey) -> Path:
    """Seal the run folder: ``public_key.pem``, ``manifest.json`` and the signed
    ``attestation.dsse.json`` (returned). Call last: a file written afterwards makes
    ``ale verify`` reject the run."""
    run_dir = Path(run_dir)
    for name in (layout.MANIFEST, layout.ATTESTATION):
        if (run_dir / name).exists():
            raise EvidenceError(f"{run_dir / name} exists already: the run folder was signed before")
    files, odd = run_files(run_dir)
    if odd:
        raise EvidenceError(f"run folder {run_dir} holds entries that are not regular files: {', '.join(odd[:5])}")
    pem = public_key_pem(private_key)
    pem_path = run_dir / layout.PUBLIC_KEY
    if layout.PUBLIC_KEY in files:
        if pem_path.read_bytes() != pem:
            raise EvidenceError(f"{pem_path} holds another key than the one signing this run")
    else:
        files = dict(sorted({**files, layout.PUBLIC_KEY: write_new(pem_path, pem)}.items()))
    digests = {rel: sha256_file(p) for rel, p in files.items()}
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": rel, "digest": {"sha256": d}} for rel, d in digests.items()],
        "predicateType": PREDICATE_TYPE,
        "predicate": build_predicate(run_dir, private_key, digests),
    }
    write_json_new(run_dir / layout.MANIFEST, digests)
    return write_json_new(run_dir / layout.ATTESTATION, sign_envelope(statement, private_key))
