"""`ale verify RUN_DIR`: re-check a run from its files alone, trusting none of them.

The verifier recomputes every digest, checks the DSSE signature, re-runs the
isolation policy on the raw inspect JSON and probe output, diffs the two
captures, checks time order, the event chain, the reference commitment and that
result.json's status and score follow from the evidence. It needs no Docker
engine and no access to the machine that ran the run: a copied folder verifies.

``valid`` means the record is intact and authentic (as far as the key used
allows) and every claim in result.json is supported by the evidence: a run that
carries a score was proven sealed; a run labelled
``invalid_evaluation_environment`` carries no score and names its violations.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from pydantic import BaseModel, ConfigDict, ValidationError

from ale import layout, lossless
from ale.agents.gateway import record as gateway_record
from ale.agents.trajectory import Trajectory, TrajectoryStep
from ale.grading.deliverables import DeliverablesManifest, SkippedEntry, listing_digest
from ale.isolation import vm_rules
from ale.isolation.checks import Check, failures, violation_line
from ale.isolation.probes import workspace_empty_checks
from ale.isolation.rules import judge
from ale.layout import Evidence
from ale.phases import (
    CANDIDATE_KILLED,
    CREATED,
    FINISHED,
    GROUP_EVIDENCE,
    REFERENCE_UNPACKED,
    RUN_CLOSES_WITH,
    RUN_OPENS_WITH,
    STANDS_IN_FOR,
    STARTED,
    VM_GROUP_EVIDENCE,
    CheckGroup,
    Phase,
    RunShape,
    moment_order,
    phase_evidence,
    required_evidence,
)
from ale.record import evidence as ev
from ale.record import regrades, signing
from ale.redaction import unredacted_secrets
from ale.result import SCORE_EPSILON, RunResult
from ale.sandbox.base import Mount
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.software import RECORD_LABEL, record_digest
from ale.status import InvalidAttribution, RunStatus, not_the_agents

# What each phase writes is declared once, in ale.phases; the verifier derives from
# it what a folder must hold. The JSON type each record must hold: anything else is
# unknown, and unknown is invalid.
_RECORDS = RUN_OPENS_WITH + RUN_CLOSES_WITH \
    + tuple(dict.fromkeys(f for shape in RunShape for f in phase_evidence(shape)))
LIST_FILES = frozenset({layout.evidence_path(Evidence.MOUNTS), layout.evidence_path(Evidence.PHASES),
                        layout.evidence_path(Evidence.CHECKS), layout.evidence_path(Evidence.GRADING_ATTEMPTS)})
OBJECT_FILES = frozenset(
    {layout.PLAN, layout.RESULT, layout.DELIVERABLES, layout.MANIFEST, layout.ATTESTATION}
    | {f for f in _RECORDS if f.endswith(".json")}
) - LIST_FILES


class VerifyReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_dir: str
    valid: bool
    usable: bool
    reasons: list[str]
    checks: list[dict[str, Any]]
    run_id: str | None = None
    status: str | None = None
    key_source: str | None = None
    notes: list[str] = []
    latest_grading: dict[str, Any] | None = None  # regrades: the last regrade's grading, when they verify

    @property
    def exit_code(self) -> int:
        """0 valid, 1 invalid, 2 unusable input."""
        if not self.usable:
            return 2
        return 0 if self.valid else 1


class _Unusable(Exception):
    pass


def verify_run_dir(run_dir: Path, public_key_path: Path | None = None, *,
                   regrade_keys: dict[str, bytes] | None = None) -> VerifyReport:
    """Verify one run folder. Never raises for a bad folder: the report says what is wrong.
    ``regrade_keys`` (key id -> PEM): keys a regrade may be signed by (``--trusted-keys``)."""
    v = _Verifier(Path(run_dir))
    v.regrade_keys = regrade_keys or {}
    try:
        v.run(public_key_path)
    except _Unusable as e:
        v.usable = False
        v.reasons.append(str(e))
    return v.report()


def parse_time(value: Any) -> datetime | None:
    """An ISO-8601 time (Docker's nanoseconds cut to microseconds); None for Docker's zero time."""
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return None
    s = value.strip().replace("Z", "+00:00")
    s = re.sub(r"(\.\d{6})\d+", r"\1", s)
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _safe_relpath(name: Any) -> TypeGuard[str]:
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        return False
    p = PurePosixPath(name)
    return not p.is_absolute() and ".." not in p.parts and "." not in p.parts and str(p) == name


def _name_problems(manifest: DeliverablesManifest) -> list[str]:
    """Names that are not recorded as ``ale.lossless`` says: a base64 that does not
    decode to the display form shown, a plain path that cannot be a file name, or
    the same workspace entry copied twice."""
    bad: list[str] = []
    seen: set[bytes] = set()
    entries: list[Any] = [*manifest.files, *manifest.directories, *manifest.skipped]
    for e in entries:
        try:
            raw = lossless.name_bytes(e.path, e.path_b64)
        except (ValueError, TypeError):
            bad.append(f"{e.path!r}: path_b64 is not base64")
            continue
        if e.path_b64 is not None and lossless.name_fields(raw) != (e.path, e.path_b64):
            bad.append(f"{e.path!r}: path_b64 holds another name, or one that is valid UTF-8 and needs none")
        if not raw or b"\0" in raw or raw.startswith(b"/") or (raw != b"." and b"." in raw.split(b"/")) \
                or b".." in raw.split(b"/") or b"" in raw.split(b"/"):
            bad.append(f"{e.path!r} is not a relative path in the workspace")
        if not isinstance(e, SkippedEntry):
            if raw in seen:
                bad.append(f"{e.path!r} is recorded twice")
            seen.add(raw)
    return bad


def _load_policy(data: Any) -> Any:
    """The stored policy, validated without the host-CPU rule: that rule is about the
    machine that ran the run, and the verifying machine may have fewer CPUs."""

    if not isinstance(data, dict):
        raise ValueError(f"policy must be a JSON object, got {type(data).__name__}")
    return IsolationPolicy.from_record(data)


class _Verifier:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.reasons: list[str] = []
        self.checks: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.usable = True
        self.run_id: str | None = None
        self.status: str | None = None
        self.key_source: str | None = None
        self._json: dict[str, Any] = {}
        self._present: set[str] = set()
        self._unreadable: set[str] = set()
        self._digests: dict[str, str] = {}
        self.violations: list[str] = []  # isolation failures the evidence shows
        self.regrade_keys: dict[str, bytes] = {}  # key id -> PEM: keys a regrade may be signed by
        self.latest_grading: dict[str, Any] | None = None  # the last regrade's grading, when regrades verify

    # -- recording -----------------------------------------------------------
    def check(self, cid: str, ok: bool | None, expected: Any = None, observed: Any = None,
              detail: str = "", *, area: str = "record", reason: bool = True) -> bool:
        self.checks.append({"area": area, "id": cid, "ok": ok, "expected": expected,
                            "observed": observed, "detail": detail})
        if ok is not True and reason:
            self.reasons.append(f"{cid}: {detail}" if detail else cid)
        return ok is True

    def report(self) -> VerifyReport:
        return VerifyReport(
            run_dir=str(self.run_dir), valid=self.usable and not self.reasons, usable=self.usable,
            reasons=self.reasons, checks=self.checks, run_id=self.run_id, status=self.status,
            key_source=self.key_source, notes=self.notes, latest_grading=self.latest_grading,
        )

    # -- reading ---------------------------------------------------------------
    def load(self, rel: str) -> Any:
        """Parsed JSON of a run file, or None when absent. Unreadable JSON makes the
        input unusable (and names the file)."""
        if rel in self._json:
            return self._json[rel]
        path = self.run_dir / rel
        data = None
        if path.is_file() and not path.is_symlink():
            try:
                data = json.loads(path.read_bytes())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                self.usable = False
                self._unreadable.add(rel)
                self.check(f"json.{rel}", False, "readable JSON", None, f"{rel} is not readable JSON: {e}")
        self._json[rel] = data
        return data

    def digest(self, rel: str) -> str:
        """sha256 of a run file, read once however many checks need it."""
        if rel not in self._digests:
            self._digests[rel] = ev.sha256_file(self.run_dir / rel)
        return self._digests[rel]

    def text(self, rel: str) -> str | None:
        path = self.run_dir / rel
        if not path.is_file() or path.is_symlink():
            return None
        return path.read_bytes().decode("utf-8", errors="replace")

    # -- the run -----------------------------------------------------------------
    def run(self, public_key_path: Path | None) -> None:
        d = self.run_dir
        if not d.is_dir():
            raise _Unusable(f"{d} is not a directory")
        if not (d / layout.ATTESTATION).exists() and not (d / layout.RESULT).exists():
            raise _Unusable(f"{d} is not a run folder: it has neither {layout.ATTESTATION} nor result.json")
        statement = self.guarded("signature", self.verify_signature, public_key_path)
        self.guarded("files", self.verify_files, statement)
        result = self.guarded("result", self.verify_result_record, statement)
        self.guarded("required", self.verify_required, result)
        self.guarded("shapes", self.verify_shapes)
        self.guarded("events", self.verify_events, statement, result)
        self.guarded("deliverables", self.verify_deliverables)
        self.guarded("trajectory", self.verify_trajectory)
        self.guarded("isolation", self.verify_isolation)
        self.guarded("vm", self.verify_vm, result)
        self.guarded("input", self.verify_input_and_workspace)
        self.guarded("reference", self.verify_reference)
        self.guarded("times", self.verify_times)
        self.guarded("sandbox_stopped", self.verify_sandbox_stopped)
        self.guarded("stop", self.verify_stop)
        self.guarded("screens", self.verify_screens)
        self.guarded("start_writes", self.verify_start_writes)
        self.guarded("environment", self.verify_environment)
        self.guarded("records", self.verify_records, result)
        self.guarded("gateway", self.verify_model_gateway, result)
        self.guarded("status", self.verify_status, result)
        self.guarded("regrades", self.verify_regrades, result, public_key_path)

    def guarded(self, step: str, fn: Any, *args: Any) -> Any:
        """Run one verification step; a record so malformed that the step itself
        breaks fails verification (naming the step) instead of crashing it."""
        try:
            return fn(*args)
        except _Unusable:
            raise
        except Exception as e:  # any shape of malformed evidence lands here, and fails closed
            self.check(f"verify.{step}", False, "evidence the step can read", None,
                       f"the {step} check could not read the evidence: {type(e).__name__}: {e}")
            return None

    def verify_signature(self, public_key_path: Path | None) -> dict | None:
        if not (self.run_dir / layout.ATTESTATION).exists():
            self.check("signature.present", False, layout.ATTESTATION, None,
                       f"{layout.ATTESTATION} is missing: the run was never signed, or its signature was removed")
            return None
        envelope = self.load(layout.ATTESTATION)
        if layout.ATTESTATION in self._unreadable:
            return None
        if public_key_path is not None:
            try:
                key = signing.load_public_key(Path(public_key_path))
            except signing.SignatureInvalid as e:
                raise _Unusable(f"--public-key: {e}") from e
            kid = signing.public_key_sha256(key)
            self.key_source = f"the key given with --public-key {public_key_path} (sha256:{kid[:16]}…)"
        else:
            pem = self.run_dir / layout.PUBLIC_KEY
            try:
                key = signing.load_public_key(pem)
            except signing.SignatureInvalid as e:
                self.check("signature.key", False, layout.PUBLIC_KEY, None, f"no usable recorded key: {e}")
                return self._untrusted(envelope)
            kid = signing.public_key_sha256(key)
            self.key_source = (
                f"the key recorded in the run folder ({layout.PUBLIC_KEY}, sha256:{kid[:16]}…): this shows "
                "the files are unchanged since they were signed, not who signed them; pass --public-key "
                "with the operator's key to check the signer"
            )
            self.notes.append(f"signature checked with {self.key_source}")
        try:
            statement = signing.verify_envelope(envelope, key)
        except signing.SignatureInvalid as e:
            self.check("signature.valid", False, f"signed by sha256:{kid[:16]}…", None, str(e))
            return self._untrusted(envelope)
        self.check("signature.valid", True, f"signed by sha256:{kid[:16]}…", "verified")
        predicate = _as_dict(statement.get("predicate"))
        claimed = predicate.get("public_key_sha256")
        self.check("signature.key_recorded", claimed == kid, kid, claimed,
                   "" if claimed == kid else "the statement names another signing key than the one that verified it")
        return statement

    def _untrusted(self, envelope: Any) -> dict | None:
        """What an unverified envelope claims, to report further differences; it is
        already invalid, so this changes no verdict."""
        try:
            return signing.decode_envelope(envelope)
        except signing.SignatureInvalid as e:
            self.check("signature.envelope", False, "a DSSE envelope", None, str(e))
            return None

    def verify_files(self, statement: dict | None) -> None:
        files, odd = ev.run_files(self.run_dir)
        # regrades/ is appended after the run was signed; verify_regrades checks it
        files = {rel: p for rel, p in files.items() if not regrades.is_regrade_path(rel)}
        odd = [rel for rel in odd if not regrades.is_regrade_path(rel)]
        self._present = set(files)
        for rel in odd:
            self.check(f"file.{rel}", False, "a regular file", "link or special file",
                       f"{rel} is a symlink or special file; a run folder holds only regular files")
        subjects: dict[str, str] = {}
        if statement is not None:
            raw = statement.get("subject")
            if not isinstance(raw, list):
                self.check("statement.subjects", False, "a list of subjects", type(raw).__name__,
                           "the signed statement has no subject list")
                raw = []
            for s in raw:
                name = s.get("name") if isinstance(s, dict) else None
                digest = (s.get("digest") or {}).get("sha256") if isinstance(s, dict) else None
                if not _safe_relpath(name) or not isinstance(digest, str):
                    self.check("statement.subjects", False, "relative paths with sha256 digests", s,
                               f"malformed subject {s!r}")
                    continue
                if name in subjects:
                    self.check("statement.subjects", False, "unique names", name, f"subject {name} is listed twice")
                subjects[name] = digest
            for name, want in subjects.items():
                if name not in files:
                    self.check(f"file.{name}", False, want, None,
                               f"{name} is listed in the signed statement but missing from the folder")
                    continue
                got = self.digest(name)
                self.check(f"file.{name}", got == want, want, got,
                           "" if got == want
                           else f"{name} changed after signing (sha256 differs from the signed statement)",
                           area="files")
            for name in sorted(set(files) - set(subjects)):
                self.check(f"file.{name}", False, None, self.digest(name),
                           f"{name} is not listed in the signed statement: it was added after signing")
        if not (self.run_dir / layout.MANIFEST).exists():
            self.check("manifest.present", False, layout.MANIFEST, None, f"{layout.MANIFEST} is missing")
            return
        manifest = self.load(layout.MANIFEST)
        if layout.MANIFEST in self._unreadable:
            return
        if not isinstance(manifest, dict):
            self.check("manifest.shape", False, "a JSON object", type(manifest).__name__,
                       f"{layout.MANIFEST} must map each file to its sha256")
        elif statement is not None:
            diff = sorted(k for k in set(manifest) | set(subjects) if manifest.get(k) != subjects.get(k))
            self.check("manifest.agrees", not diff, "the signed subjects", diff,
                       f"{layout.MANIFEST} disagrees with the signed statement on: {', '.join(diff[:10])}"
                       if diff else "")

    def verify_result_record(self, statement: dict | None) -> Any:

        data = self.load(layout.RESULT)
        if not isinstance(data, dict):
            return None
        try:
            result = RunResult.model_validate(data)
        except ValidationError as e:
            self.check("result.schema", False, "a RunResult", None, f"result.json does not match its schema: {e}")
            self.run_id, self.status = data.get("run_id"), data.get("status")
            return None
        self.run_id, self.status = result.run_id, result.status.value
        if statement is not None:
            pred = _as_dict(statement.get("predicate"))
            claims = {"run_id": result.run_id, "status": result.status.value, "score": result.score,
                      "scores": result.scores, "harness_version": result.harness_version}
            diff = {k: {layout.RESULT: v, "statement": pred.get(k)} for k, v in claims.items() if pred.get(k) != v}
            self.check("result.matches_statement", not diff, "result.json = signed predicate", diff,
                       f"result.json disagrees with the signed statement on {', '.join(diff)}" if diff else "")
        plan = self.load(layout.PLAN)
        if isinstance(plan, dict):
            self.check("result.plan_run_id", plan.get("run_id") == result.run_id, result.run_id, plan.get("run_id"),
                       "" if plan.get("run_id") == result.run_id else "plan.json names another run")
        harness = self.load(layout.evidence_path(Evidence.HARNESS))
        if isinstance(harness, dict):
            hv = harness.get("ale_version")
            self.check("result.harness_version", hv == result.harness_version, result.harness_version, hv,
                       "" if hv == result.harness_version else "harness.json names another ale version")
        return result

    def shape(self) -> RunShape:
        """The run's shape as harness.json records it; a folder written before the
        shape was recorded is a live_grading run when it recorded a desktop."""
        harness = _as_dict(self.load(layout.evidence_path(Evidence.HARNESS)))
        shape = harness.get("run_shape")
        if shape is None:
            desktop = layout.evidence_path(Evidence.DESKTOP) in self._present
            return RunShape.LIVE_GRADING if desktop else RunShape.STANDARD
        try:
            return RunShape(shape)
        except ValueError:
            self.check("harness.run_shape", False, [str(s) for s in RunShape], shape,
                       f"evidence/harness.json names an unknown run shape {shape!r}")
            return RunShape.STANDARD

    def _phase_names(self) -> set[str]:
        phases = self.load(layout.evidence_path(Evidence.PHASES))
        return {str(p.get("name")) for p in phases if isinstance(p, dict)} if isinstance(phases, list) else set()

    def verify_required(self, result: Any) -> None:
        shape = self.shape()
        graded = result is not None and (result.status.carries_score or result.score is not None)
        required = required_evidence(shape, self._phase_names(), graded=graded)
        for rel in required:
            if rel not in self._present and STANDS_IN_FOR.get(rel) not in self._present:
                why = "the run reports a graded outcome" if graded else "the run reached the phase that records it"
                self.check(f"evidence.{rel}", False, "present", None, f"{rel} is missing, yet {why}")
        for rel in phase_evidence(shape):
            if rel not in required and rel not in self._present:
                self.notes.append(f"{rel} was not recorded (the run ended before that phase)")

    def verify_shapes(self) -> None:
        for rel in sorted(self._present):
            if rel in LIST_FILES or rel in OBJECT_FILES:
                data = self.load(rel)
                want = list if rel in LIST_FILES else dict
                if not isinstance(data, want) and rel not in self._unreadable:
                    self.check(f"shape.{rel}", False, want.__name__, type(data).__name__,
                               f"{rel} must hold a JSON {'list' if want is list else 'object'}, "
                               f"it holds {json.dumps(data)[:80]}")

    def verify_events(self, statement: dict | None, result: Any) -> None:
        path = self.run_dir / layout.EVENTS
        if not path.is_file():
            return
        events, problems = ev.read_chain(path)
        for p in problems:
            self.check("events.chain", False, "an intact hash chain", None,
                       p.replace(str(path), layout.EVENTS), area="events")
        if not problems:
            self.check("events.chain", True, "an intact hash chain", f"{len(events)} events", area="events")
        if statement is not None:
            pred = _as_dict(statement.get("predicate"))
            want = pred.get("events")
            got = {"count": len(events), "head": events[-1]["hash"] if events else ev.GENESIS}
            self.check("events.head", want == got, want, got,
                       "" if want == got else "events.jsonl does not end where the signed statement says it does")
        end = [e for e in events if e.get("type") == "run.end"]
        if result is not None and end:
            data = end[-1].get("data") or {}
            ok = data.get("status") == result.status.value and data.get("score") == result.score
            self.check("events.run_end", ok, {"status": result.status.value, "score": result.score}, data,
                       "" if ok else "the run.end event records another status or score than result.json")

    def verify_deliverables(self) -> None:
        """deliverables/ holds exactly the listed copies, each name is recorded
        losslessly (``ale.lossless``), and the listing digest and caps add up."""
        data = self.load(layout.DELIVERABLES)
        if data is None:
            return
        try:
            manifest = DeliverablesManifest.model_validate(data)
        except ValidationError as e:
            self.check("deliverables.schema", False, "a DeliverablesManifest", None, f"deliverables.json: {e}")
            return
        prefix = f"{layout.DELIVERABLES_DIR}/"
        present = {rel[len(prefix):] for rel in self._present if rel.startswith(prefix)}
        bad: list[str] = []
        listed: dict[str, Any] = {}
        for f in manifest.files:
            where = f.stored_path
            if not _safe_relpath(where):
                bad.append(f"{where!r} is not a relative path inside deliverables/")
                continue
            if where in listed:
                bad.append(f"{where} is listed twice")
            listed[where] = f
        bad += _name_problems(manifest)
        for path, f in sorted(listed.items()):
            if path not in present:
                bad.append(f"{path} is listed but missing from deliverables/")
                continue
            got, size = self.digest(prefix + path), (self.run_dir / prefix / path).stat().st_size
            if got != f.sha256 or size != f.size:
                bad.append(f"{path} differs from deliverables.json (sha256 {got[:12]}…, size {size})")
        bad += [f"{p} is in deliverables/ but not listed" for p in sorted(present - set(listed))]
        if listing_digest(manifest.files) != manifest.digest:
            bad.append("the listing digest does not match the listed files")
        if sum(f.size for f in manifest.files) != manifest.total_bytes:
            bad.append("total_bytes does not match the listed sizes")
        lim = manifest.limits
        if lim is not None:
            if len(manifest.files) > lim.max_files:
                bad.append(f"{len(manifest.files)} files copied, past the cap of {lim.max_files}")
            if manifest.total_bytes > lim.max_bytes:
                bad.append(f"{manifest.total_bytes} bytes copied, past the cap of {lim.max_bytes}")
        self.check("deliverables.hashes", not bad, "deliverables/ = deliverables.json",
                   bad[:50] or f"{len(listed)} files",
                   "; ".join(bad[:20]) + (f"; and {len(bad) - 20} more" if len(bad) > 20 else ""), area="deliverables")

    def verify_trajectory(self) -> None:
        """trajectory.json is a Trajectory (UTF-8 JSON), and every value it keeps
        beside itself (a FileRef: too large, or not exact text) is in the folder
        with the size and sha256 the step names. Required whenever the agent phase
        ran (``phases.json``); its steps recorded through the ToolBox are exactly the
        lines of ``trajectory.jsonl``, step for step."""
        phases = self.load(layout.evidence_path(Evidence.PHASES))
        agent_ran = isinstance(phases, list) \
            and any(isinstance(p, dict) and p.get("name") == Phase.AGENT for p in phases)
        if layout.TRAJECTORY not in self._present:
            if agent_ran:
                self.check("trajectory.present", False, layout.TRAJECTORY, None,
                           f"the agent phase ran, yet the run folder has no {layout.TRAJECTORY}", area="trajectory")
            return
        data = self.load(layout.TRAJECTORY)
        if layout.TRAJECTORY in self._unreadable:
            return
        try:
            traj = Trajectory.model_validate(data)
        except ValidationError as e:
            self.check("trajectory.schema", False, "a Trajectory", None, f"{layout.TRAJECTORY}: {e}", area="trajectory")
            return
        bad: list[str] = []
        refs = 0
        for step in traj.steps:
            for name, ref in step.files.items():
                refs += 1
                where = f"step {step.index} {name}"
                if not _safe_relpath(ref.path) or not ref.path.startswith(layout.TRAJECTORY_FILES + "/"):
                    bad.append(f"{where}: {ref.path!r} is not in {layout.TRAJECTORY_FILES}/")
                elif ref.path not in self._present:
                    bad.append(f"{where}: {ref.path} is missing")
                else:
                    got, size = self.digest(ref.path), (self.run_dir / ref.path).stat().st_size
                    if got != ref.sha256 or size != ref.bytes:
                        bad.append(f"{where}: {ref.path} differs from the step (sha256 {got[:12]}…, size {size})")
        self.check("trajectory.files", not bad, "every FileRef of trajectory.json present and unchanged",
                   bad[:50] or f"{len(traj.steps)} steps, {refs} stored values",
                   "; ".join(bad[:20]) + (f"; and {len(bad) - 20} more" if len(bad) > 20 else ""), area="trajectory")
        self._trajectory_agrees(traj)

    def _trajectory_agrees(self, traj: Trajectory) -> None:
        """trajectory.json's ToolBox steps and trajectory.jsonl's lines are the same steps."""
        log = self.run_dir / layout.TRAJECTORY_LOG
        if layout.TRAJECTORY_LOG not in self._present:
            ok = not [st for st in traj.steps if st.gateway is None]
            self.check("trajectory.log_agrees", ok, layout.TRAJECTORY_LOG, None,
                       "" if ok else f"{layout.TRAJECTORY} has steps and there is no {layout.TRAJECTORY_LOG}",
                       area="trajectory")
            return
        problems: list[str] = []
        logged = []
        for n, line in enumerate(log.read_text(encoding="utf-8", errors="surrogateescape").splitlines(), 1):
            try:
                logged.append(TrajectoryStep.model_validate_json(line))
            except ValidationError as e:
                problems.append(f"{layout.TRAJECTORY_LOG} line {n} is not a step: {str(e)[:200]}")
        kept = [st for st in traj.steps if st.gateway is None]
        if len(kept) != len(logged):
            problems.append(f"{len(kept)} steps in {layout.TRAJECTORY}, {len(logged)} in {layout.TRAJECTORY_LOG}")
        for a, b in zip(kept, logged, strict=False):
            if a.model_dump() != b.model_dump():
                problems.append(f"step {a.index} differs between {layout.TRAJECTORY} and {layout.TRAJECTORY_LOG}")
        self.check("trajectory.log_agrees", not problems, "the same steps in both",
                   problems[:20] or f"{len(kept)} steps", "; ".join(problems[:10]), area="trajectory")

    # -- isolation -----------------------------------------------------------------
    def _mounts(self) -> list[Any] | None:

        data = self.load(layout.evidence_path(Evidence.MOUNTS))
        if data is None:
            return None
        try:
            return [Mount(str(m["source"]), str(m["target"]), bool(m["read_only"])) for m in data]
        except (TypeError, KeyError, ValueError) as e:
            self.check("evidence.mounts", False, "a list of {source, inode, target, read_only}", data,
                       f"evidence/mounts.json is malformed: {e!r}")
            return None

    def _add_isolation(self, group: str, checks: list[Check]) -> None:
        for c in checks:
            self.checks.append({"area": "isolation", "phase": group, **c.to_dict()})
        self.violations += [violation_line(group, c) for c in failures(checks)]

    def verify_isolation(self) -> None:
        before = self.load(layout.evidence_path(Evidence.INSPECT_BEFORE))
        after = self.load(layout.evidence_path(Evidence.INSPECT_AFTER))
        probes = {ph: self.text(layout.evidence_path(Evidence.probes(ph))) for ph in ("before", "after")}
        if before is None and after is None and not any(probes.values()):
            return
        policy_data = self.load(layout.evidence_path(Evidence.POLICY))
        try:
            policy = _load_policy(policy_data)
        except (ValueError, ValidationError) as e:
            self.check("isolation.policy", False, "a valid IsolationPolicy", policy_data,
                       f"evidence/policy.json: {e}")
            return
        mounts = self._mounts()
        if mounts is None:
            self.check("isolation.mounts", False, layout.evidence_path(Evidence.MOUNTS), None,
                       "the planned mounts are not recorded; the inspect checks cannot run")
            return
        # Inodes are compared at run time on the host that owns the folders; here the
        # folders may not exist, so the recorded sources are compared by path only.
        self.notes.append("bind-mount inodes were compared at run time; verify compares sources by path")
        image = self.load(layout.evidence_path(Evidence.IMAGE))
        if before is not None:
            self._add_isolation(CheckGroup.INSPECT_BEFORE, judge(
                "before", policy=policy, mounts=mounts, inspect=before, image_inspect=image))
        if after is not None:
            self._add_isolation(CheckGroup.INSPECT_AFTER, judge(
                "after", policy=policy, mounts=mounts, inspect=after,
                captures=(before, after) if before is not None else None))
        input_dir = next((m.target for m in mounts if m.read_only), None)
        workspace_dir = next((m.target for m in mounts if not m.read_only), None)
        for phase, raw in probes.items():
            if raw is None:
                continue
            if input_dir is None or workspace_dir is None:
                self.check("isolation.mounts", False, "an input and a workspace mount", [m.target for m in mounts],
                           "evidence/mounts.json lacks the input or the workspace mount")
                break
            # Older probe files keep stderr after a "#stderr" line; newer ones as a section.
            stdout = raw.split("\n#stderr\n", 1)[0]
            self._add_isolation(CheckGroup.PROBES_BEFORE if phase == "before" else CheckGroup.PROBES_AFTER, judge(
                phase, policy=policy, mounts=mounts, probes=stdout, input_dir=input_dir, workspace_dir=workspace_dir))

    def verify_vm(self, result: Any = None) -> None:
        """A VM run's evidence (`ale.isolation.vm_rules`): the captures before and after the
        agent, the two together, and the guest's probes, re-judged against the stored
        expectation with the functions the run used. A graded run of the qemu provider must
        hold all of it: without it nothing shows the VM was sealed."""
        before = self.load(layout.evidence_path(Evidence.VM_BEFORE))
        after = self.load(layout.evidence_path(Evidence.VM_AFTER))
        probes = {ph: self.text(layout.evidence_path(Evidence.vm_probes(ph))) for ph in ("before", "after")}
        present = {rel for rel in (Evidence.VM_BEFORE, Evidence.VM_AFTER, Evidence.VM_EXPECTATION)
                   if (self.run_dir / layout.evidence_path(rel)).is_file()}
        plan = self.load(layout.PLAN)
        graded_vm = (isinstance(plan, dict) and plan.get("provider") == "qemu"
                     and result is not None and result.status.carries_score)
        if graded_vm:
            wanted = [layout.evidence_path(n) for n in (Evidence.VM_EXPECTATION, Evidence.VM_BEFORE, Evidence.VM_AFTER)]
            wanted += [layout.evidence_path(Evidence.vm_probes(ph)) for ph in ("before", "after")]
            lacking = [rel for rel in wanted if not (self.run_dir / rel).is_file()]
            self.check("vm.evidence", not lacking, wanted, lacking or None,
                       f"a graded qemu run lacks its VM seal evidence: {lacking}" if lacking else "", area="isolation")
        if not present and not any(v is not None for v in probes.values()):
            return
        data = self.load(layout.evidence_path(Evidence.VM_EXPECTATION))
        try:
            expectation = vm_rules.VmExpectation.from_dict(data)
        except ValueError as e:
            self.check("vm.expectation", False, "the planned VM (a VmExpectation)", data,
                       f"{layout.evidence_path(Evidence.VM_EXPECTATION)}: {e}", area="isolation")
            return
        if before is not None or after is None:  # a VM run without its first capture is unknown
            self._add_isolation(CheckGroup.VM_BEFORE, vm_rules.judge_vm_state(before, expectation, "before"))
        if after is not None:
            self._add_isolation(CheckGroup.VM_AFTER, vm_rules.judge_vm_state(after, expectation, "after")
                                + vm_rules.judge_vm_captures(before, after, expectation))
        for phase, raw in probes.items():
            if raw is None:
                continue
            group = CheckGroup.VM_PROBES_BEFORE if phase == "before" else CheckGroup.VM_PROBES_AFTER
            if not expectation.guest_input_dir:
                self.check("vm.expectation", False, "the guest's input folder", None,
                           "the VM expectation names no guest_input_dir; the guest's probes cannot be judged",
                           area="isolation")
                break
            self._add_isolation(group, vm_rules.judge_vm_probes(raw, expectation, phase))

    def verify_input_and_workspace(self) -> None:
        trees = {}
        for name, rel in (("input-after-start", layout.evidence_path(Evidence.INPUT_AFTER_START)),
                          ("input-after-run", layout.evidence_path(Evidence.INPUT_AFTER_RUN))):
            tree = self.load(rel)
            if tree is None:
                continue
            try:
                recomputed = ev.tree_hash_digest(tree)
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                self.check(f"input.{name}", False, "a tree hash", None, f"{rel} is malformed: {e!r}")
                continue
            self.check(f"input.{name}", recomputed == tree.get("digest"), recomputed, tree.get("digest"),
                       "" if recomputed == tree.get("digest") else f"{rel}: its digest does not match its own listing",
                       area="input")
            trees[name] = tree
        if len(trees) == 2:
            a, b = trees["input-after-start"], trees["input-after-run"]
            same = a.get("digest") == b.get("digest")
            changed = sorted(k for k in set(a["files"]) | set(b["files"]) if a["files"].get(k) != b["files"].get(k))
            self.check("input.unchanged", same, a.get("digest"), b.get("digest"),
                       "" if same else f"the input changed during the run: {changed[:10]}", area="input", reason=False)
            if not same:
                self.violations.append(violation_line(CheckGroup.AFTER_RUN, Check(
                    "input.unchanged", False, a.get("digest"), b.get("digest"), f"changed {changed[:10]}")))
        proof = self.load(layout.evidence_path(Evidence.WORKSPACE_EMPTY))
        if proof is None:
            return
        if not isinstance(proof, dict):
            proof = {}
        creation = proof.get("at_creation") if isinstance(proof.get("at_creation"), dict) else None
        mounts = self.load(layout.evidence_path(Evidence.MOUNTS))
        ws_inode = next((m.get("inode") for m in mounts if isinstance(m, dict) and not m.get("read_only")), None) \
            if isinstance(mounts, list) else None
        for key, expected_inode in (("at_creation", ws_inode), ("at_agent_start", (creation or {}).get("inode"))):
            listing = proof.get(key)
            if listing is None and key == "at_agent_start" \
                    and layout.evidence_path(Evidence.INPUT_AFTER_START) not in self._present:
                continue  # the run ended before the agent could start
            with_phase = CheckGroup.WORKSPACE_AT_CREATION if key == "at_creation" \
                else CheckGroup.WORKSPACE_AT_AGENT_START
            self._add_isolation(with_phase, workspace_empty_checks(
                listing if isinstance(listing, dict) else None, expected_inode=expected_inode))

    def verify_reference(self) -> None:
        commit = self.load(layout.evidence_path(Evidence.REFERENCE_COMMIT))
        check = self.load(layout.evidence_path(Evidence.REFERENCE_CHECK))
        if commit is None or check is None:
            return
        if not isinstance(commit, dict) or not isinstance(check, dict):
            self.check("reference.records", False, "JSON objects", None, "reference records are malformed")
            return
        src = commit.get("source") if isinstance(commit.get("source"), dict) else None
        committed = None if src is None else src.get("sha256")
        ok = committed == check.get("source_sha256")
        self.check("reference.digest", ok, committed, check.get("source_sha256"),
                   "" if ok else "the reference checked before unpacking differs from the one committed before the "
                                 "agent started",
                   area="reference")
        setup = commit.get("setup_written")
        if isinstance(setup, dict):
            try:
                recomputed = ev.tree_hash_digest(setup)
            except (ValueError, TypeError, KeyError) as e:
                recomputed = f"malformed: {e!r}"
            ok = recomputed == setup.get("digest") == check.get("setup_written_digest")
            self.check("reference.setup_written", ok, setup.get("digest"), check.get("setup_written_digest"),
                       "" if ok else "the reference files start() wrote changed between commitment and grading",
                       area="reference")

    def verify_times(self) -> None:
        """The run's moments in the order its shape's table says (``moment_order``)."""
        before = self.load(layout.evidence_path(Evidence.INSPECT_BEFORE))
        after = self.load(layout.evidence_path(Evidence.INSPECT_AFTER))
        check = self.load(layout.evidence_path(Evidence.REFERENCE_CHECK))
        commit = self.load(layout.evidence_path(Evidence.REFERENCE_COMMIT))
        phases_raw = self.load(layout.evidence_path(Evidence.PHASES))
        stop = next((p for p in phases_raw if isinstance(p, dict) and p.get("name") == Phase.STOP), None) \
            if isinstance(phases_raw, list) else None
        state = _as_dict(after.get("State")) if isinstance(after, dict) else {}
        values = {
            CREATED: (before.get("Created") if isinstance(before, dict) else None, before is not None),
            STARTED: (state.get("StartedAt"), after is not None),
            FINISHED: (state.get("FinishedAt"), after is not None),
            REFERENCE_UNPACKED: (check.get("unpacked_at") if isinstance(check, dict) else None, check is not None),
            CANDIDATE_KILLED: (None if stop is None else stop.get("ended_at"), stop is not None),
        }
        known = []
        for label in moment_order(self.shape()):
            raw, recorded = values[label]
            if not recorded:
                continue
            t = parse_time(raw)
            if t is None:
                self.check("times.order", False, f"{label}: an ISO time", raw,
                           f"{label} time is missing or unparsable: {raw!r}",
                           area="times")
                continue
            known.append((label, t))
        for (la, ta), (lb, tb) in zip(known, known[1:], strict=False):
            ok = ta < tb
            self.check("times.order", ok, f"{la} < {lb}", f"{ta.isoformat()} / {tb.isoformat()}",
                       "" if ok else f"{la} ({ta.isoformat()}) is not before {lb} ({tb.isoformat()})", area="times")
        phases = self.load(layout.evidence_path(Evidence.PHASES))
        if isinstance(phases, list):
            prev_end: tuple[str, datetime] | None = None
            for p in phases:
                if not isinstance(p, dict):
                    continue
                s, e = parse_time(p.get("started_at")), parse_time(p.get("ended_at"))
                name = p.get("name")
                if s is None or e is None or e < s:
                    self.check("times.phases", False, "started_at <= ended_at", p, f"phase {name!r} has bad times",
                               area="times")
                    continue
                if prev_end is not None and s < prev_end[1]:
                    self.check("times.phases", False, f"{name} after {prev_end[0]}", p,
                               f"phase {name!r} starts before phase {prev_end[0]!r} ended", area="times")
                prev_end = (str(name), e)
            agent = next((p for p in phases if isinstance(p, dict) and p.get("name") == Phase.AGENT), None)
            if agent is not None and isinstance(commit, dict):
                c, a = parse_time(commit.get("committed_at")), parse_time(agent.get("started_at"))
                ok = c is not None and a is not None and c <= a
                self.check("times.reference_committed", ok, "reference committed before the agent started",
                           {"committed_at": commit.get("committed_at"), "agent_started_at": agent.get("started_at")},
                           "" if ok else "the reference was not committed before the agent started", area="times")

    def verify_environment(self) -> None:
        """The recorded environment is the image the sandbox ran: its id is the one
        the inspect before names, and what it says the image holds is what the image's
        own label commits to (the sha256 of its record)."""
        env = self.load(layout.evidence_path(Evidence.ENVIRONMENT))
        if not isinstance(env, dict) or "image_id" not in env:
            return
        before = _as_dict(self.load(layout.evidence_path(Evidence.INSPECT_BEFORE)))
        ran = before.get("Image")
        if ran is None:  # a VM: the base disk QEMU's block graph read, hashed (judged by the VM rules)
            base = _as_dict(self.load(layout.evidence_path(Evidence.VM_BEFORE))).get("base_sha256")
            ran = f"sha256:{base}" if base else None
        ok = ran == env.get("image_id")
        self.check("environment.image", ok, env.get("image_id"), ran,
                   "" if ok else "evidence/environment.json names another image than the sandbox ran",
                   area="environment")
        record = env.get("record")
        if isinstance(record, dict):
            labels = _as_dict(_as_dict(_as_dict(self.load(layout.evidence_path(Evidence.IMAGE))).get("Config"))
                              .get("Labels"))
            want, got = labels.get(RECORD_LABEL), record_digest(record)
            ok = want is not None and want == got == env.get("record_sha256")
            self.check("environment.record", ok, want, got,
                       "" if ok else "the environment's record is not the one its image carries", area="environment")

    def verify_stop(self) -> None:
        """The end of the turn, where recorded (``evidence/stop.json``): the stop step
        ended within its bound, and the host-side stop left no candidate task alive."""
        rel = layout.evidence_path(Evidence.STOP)
        doc = self.load(rel)
        if doc is None:
            return
        doc = _as_dict(doc)
        halt = _as_dict(doc.get("halt"))
        bounded = doc.get("within_bound") is True and (not halt or halt.get("within_bound") is True)
        self.check("stop.bounded", bounded, f"within {doc.get('bound_s')}s", doc.get("duration_s"),
                   "" if bounded else f"{rel}: the stop step did not end within its bound", area="isolation")
        if halt:
            survivors = halt.get("survivors")
            ok = survivors == []
            self.check("stop.no_survivor", ok, [], survivors,
                       "" if ok else f"{rel}: candidate tasks outlived the end of the turn", area="isolation")

    def verify_screens(self) -> None:
        """A desktop run's screens (``evidence/screens.json``): each recorded picture is
        the file beside it, a PNG of the size and digest the record gives."""
        rel = layout.evidence_path(Evidence.SCREENS)
        doc = self.load(rel)
        if doc is None:
            return
        for moment, shot in sorted(_as_dict(doc).items()):
            shot = _as_dict(shot)
            if "error" in shot and "file" not in shot:
                self.notes.append(f"{rel}: the screen {moment} was not captured ({str(shot['error'])[:200]})")
                continue
            want = layout.evidence_path(Evidence.screen(str(moment)))
            path = self.run_dir / want
            got = ev.sha256_file(path) \
                if shot.get("file") == want and path.is_file() and not path.is_symlink() else None
            ok = got is not None and got == shot.get("sha256")
            self.check(f"screens.{moment}", ok, shot.get("sha256"), got,
                       "" if ok else f"{rel}: the screen {moment} is not the file {want} it records", area="record")

    def verify_start_writes(self) -> None:
        """What a run kept of start()'s writes (``start/``): each file listed in
        ``evidence/start-writes.json`` (the public package's) and in
        ``reference-check.json``'s ``kept`` (the reference's) is there, as recorded,
        and nothing else is."""
        START_DIR, PUBLIC, REFERENCE = layout.START_DIR, layout.START_PUBLIC, layout.START_REFERENCE
        public = self.load(layout.evidence_path(Evidence.START_WRITES))
        check = self.load(layout.evidence_path(Evidence.REFERENCE_CHECK))
        kept = _as_dict(_as_dict(check).get("kept")) if check is not None else {}
        listed: dict[str, Any] = {}
        if public is not None:
            listed.update({f"{PUBLIC}/{k}": v for k, v in _as_dict(_as_dict(public).get("files")).items()})
        listed.update({f"{REFERENCE}/{k}": v for k, v in _as_dict(kept.get("files")).items()})
        present = {r for r in self._present if r.startswith(START_DIR + "/")}
        if not listed and not present:
            return
        wrong = sorted(r for r, f in listed.items()
                       if r not in present or ev.sha256_file(self.run_dir / r) != _as_dict(f).get("sha256"))
        stray = sorted(present - set(listed))
        ok = not wrong and not stray
        self.check("start_writes.kept", ok, f"{len(listed)} file(s) as recorded",
                   {"differ": wrong[:10], "unlisted": stray[:10]},
                   "" if ok else f"{START_DIR}/ differs from what the run recorded of start()'s writes", area="input")

    def verify_sandbox_stopped(self) -> None:
        """A sandbox recorded as stopped during the agent's turn (its after-probes could
        not run) must be so in the inspect after: exited, no process, finished before
        the harness began to stop the turn."""
        rel = layout.evidence_path(Evidence.SANDBOX_STOPPED)
        stopped = self.load(rel)
        if stopped is None:
            return
        after = self.load(layout.evidence_path(Evidence.INSPECT_AFTER))
        st = _as_dict(_as_dict(after).get("State"))
        phases = self.load(layout.evidence_path(Evidence.PHASES))
        stop = next((p for p in phases if isinstance(p, dict) and p.get("name") == Phase.STOP), None) \
            if isinstance(phases, list) else None
        # The harness's own kill of the sandbox comes after it saw the sandbox stopped
        # (``observed_at``, recorded then); older records have only the stop phase's start.
        seen = _as_dict(stopped).get("observed_at") or _as_dict(stop).get("started_at")
        finished, killed_after = parse_time(st.get("FinishedAt")), parse_time(seen)
        ok = (st.get("Status") in ("exited", "dead") and st.get("Pid") == 0 and finished is not None
              and killed_after is not None and finished <= killed_after)
        self.check("sandbox.stopped_during_turn", ok, "exited with no process before the harness stopped it",
                   {"Status": st.get("Status"), "Pid": st.get("Pid"), "FinishedAt": st.get("FinishedAt"),
                    "observed_at": seen},
                   "" if ok
                   else f"{rel} says the sandbox stopped during the agent's turn; the inspect after does not show it",
                   area="isolation")

    def verify_records(self, result: Any) -> None:
        """The smaller records: engine, network, agent, phases and the checks the
        harness ran at run time."""
        engine = self.load(layout.evidence_path(Evidence.ENGINE))
        if isinstance(engine, dict):
            missing = [k for k in ("version", "security_options") if k not in engine]
            why = f"evidence/engine.json lacks {missing}" \
                + (f" (error: {engine['error']})" if "error" in engine else "")
            # A run that reports no score may have ended because the engine failed.
            graded = result is not None and result.status.carries_score
            self.check("engine.recorded", not missing, "docker version and security options", sorted(engine),
                       why if missing else "", area="engine", reason=graded)
            if missing and not graded:
                self.notes.append(why)
        network = self.load(layout.evidence_path(Evidence.NETWORK))
        policy = self.load(layout.evidence_path(Evidence.POLICY))
        if isinstance(network, dict) and isinstance(policy, dict):
            mode, want = network.get("network_mode"), policy.get("network_mode")
            self.check("network.recorded", mode == want == "none", "none", mode,
                       "" if mode == want == "none" else f"evidence/network.json records network mode {mode!r}",
                       area="network")
        phases = self.load(layout.evidence_path(Evidence.PHASES))
        if isinstance(phases, list):
            names = [p.get("name") for p in phases if isinstance(p, dict)]
            if len(names) != len(phases):
                self.check("times.phases", False, "phase records", phases, "evidence/phases.json holds non-objects")
            if result is not None and result.status.carries_score and Phase.AGENT not in names:
                self.check("times.phases", False, "an agent phase", names,
                           "evidence/phases.json records no agent phase, yet the run reports a graded outcome")
        stored = self.load(layout.evidence_path(Evidence.CHECKS))
        if isinstance(stored, list):
            phases_seen = {c.get("phase") for c in stored if isinstance(c, dict)}
            for phase, rel in {**GROUP_EVIDENCE, **VM_GROUP_EVIDENCE}.items():
                if rel in self._present and phase not in phases_seen:
                    self.check(f"checks.{phase}", False, f"checks of {phase} in checks.json",
                               sorted(map(str, phases_seen)),
                               f"the harness recorded no {phase} checks at run time, though {rel} exists")
        agent = self.load(layout.evidence_path(Evidence.AGENT))
        if not isinstance(agent, dict):
            return
        plan = self.load(layout.PLAN)
        planned = _as_dict(plan.get("agent")) if isinstance(plan, dict) else {}
        tools, allowed = agent.get("allowlist"), planned.get("allowlist")
        ok = (isinstance(tools, list) and isinstance(allowed, list) and set(tools) <= set(allowed)
              and agent.get("name") == planned.get("name"))
        self.check("agent.allowlist", ok, {"name": planned.get("name"), "allowlist": allowed},
                   {"name": agent.get("name"), "allowlist": tools},
                   "" if ok
                   else "evidence/agent.json does not record the planned agent within its planned tool allowlist",
                   area="agent")
        leaks = unredacted_secrets(agent)
        self.check("agent.redacted", not leaks, "no secret-looking values", leaks,
                   f"evidence/agent.json holds unredacted secrets at {leaks}" if leaks else "", area="agent")

    def verify_model_gateway(self, result: Any) -> None:
        """The model gateway's record: its chain intact, the tools offered on every
        request re-derived from the recorded request bodies, the evidence and the
        event log naming the same record, and the status and attribution following
        from its refusals."""
        rel = layout.evidence_path(Evidence.CONTROLLER)
        stored = self.load(rel)
        present = (self.run_dir / gateway_record.GATEWAY_DIR / gateway_record.RECORDS).is_file()
        if stored is None and not present:
            return
        area = "gateway"
        if not self.check("gateway.record_present", present and isinstance(stored, dict),
                          "the gateway's record and its evidence", {"records": present, "evidence": stored is not None},
                          "" if present and isinstance(stored, dict)
                          else "the gateway's records or evidence/controller.json is missing", area=area):
            return
        records, chain = gateway_record.read_records(self.run_dir)
        self.check("gateway.chain", not chain, "an intact hash chain", chain[:5], "; ".join(chain[:3]), area=area)
        derived, problems = gateway_record.derive(self.run_dir, records)
        self.check("gateway.tools_rederived", not problems,
                   "each request's tools as its recorded body offers them", problems[:5],
                   "; ".join(problems[:3]), area=area)
        claimed = _as_dict(_as_dict(stored).get("gateway"))
        # limits and blocked, billing and failures: absent from records older than them
        keys = ("head", "records", "requests", "tools_offered", "refusals", "limits", "blocked", "billing",
                "failures", "retries", "provider_failure", "last_failure", "resumed")
        diff = [k for k in keys if claimed.get(k) != derived.get(k)]
        self.check("gateway.evidence_matches", not diff, "evidence/controller.json as the records derive it", diff,
                   f"evidence/controller.json differs from the gateway's records in {diff}" if diff else "", area=area)
        events, _ = ev.read_chain(self.run_dir / layout.EVENTS)
        heads = [e.get("data", {}).get("head") for e in events if e.get("type") == "gateway.recorded"]
        self.check("gateway.event", heads == [derived.get("head")], [derived.get("head")], heads,
                   "" if heads == [derived.get("head")]
                   else "the event log does not name the gateway record's head", area=area)
        self._verify_native_channel(stored, result)
        if isinstance(derived.get("resumed"), dict):
            self._verify_resumed(records, derived["resumed"], result)
        refusals = derived.get("refusals") or []
        if result is None:
            return
        self._verify_billing_and_failure(derived, result)
        want = None
        if refusals:
            want = InvalidAttribution.CONTROLLER_CONFIGURATION if refusals[0].get("before_any_answer") \
                else InvalidAttribution.AFTER_AGENT_START
        ok = (result.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT and result.invalid_attribution == want) \
            if refusals else (result.invalid_attribution != InvalidAttribution.CONTROLLER_CONFIGURATION)
        self.check("gateway.status", ok,
                   {"status": RunStatus.INVALID_EVALUATION_ENVIRONMENT.value if refusals else "any",
                    "attribution": want},
                   {"status": result.status.value, "attribution": result.invalid_attribution},
                   "" if ok
                   else "the run's status or attribution does not follow from the gateway's refusals", area=area)

    def _verify_resumed(self, records: list[dict[str, Any]], resumed: dict[str, Any], result: Any) -> None:
        """A resumed run (ale.agents.gateway.resume): the copy of the source's record it
        replayed is the source run's own record (when that folder is still there); no
        replayed turn is billed; the result names the replay as the record shows it.
        Each replayed response's digest against the source's is re-derived with the
        rest of the record (``gateway.tools_rederived``)."""
        from ale.agents.gateway.resume import SOURCE_DIR

        copy = self.run_dir / SOURCE_DIR / gateway_record.GATEWAY_DIR / gateway_record.RECORDS
        origin = Path(str(resumed.get("from_run") or "")) / gateway_record.GATEWAY_DIR / gateway_record.RECORDS
        if resumed.get("from_run") and origin.is_file():
            mine, theirs = (copy.read_bytes() if copy.is_file() else b""), origin.read_bytes()
            # The source's own bytes, or their whole lines when a killed process left a torn last one.
            same = bool(mine) and (mine == theirs or (theirs.startswith(mine) and b"\n" not in theirs[len(mine):]))
            self.check("gateway.resume_source", same,
                       "the copy replayed is the source run's own gateway record", str(origin),
                       "" if same else f"the replayed copy differs from {origin}", area="gateway")
        else:
            self.check("gateway.resume_source", copy.is_file(),
                       "the signed copy of the source's record (its folder is gone)",
                       str(origin), "" if copy.is_file() else "the resumed run holds no copy of its source's record",
                       area="gateway")
        billed = [r.get("seq") for r in records if r.get("type") == "response" and r.get("by") == "replay"
                  and r.get("usage")]
        self.check("gateway.resume_unbilled", not billed, "no usage on a replayed turn", billed or None,
                   f"replayed responses {billed} carry usage: billed twice" if billed else "", area="gateway")
        if result is None:
            return
        from ale.agents.gateway.resume import chain_usage

        claimed = _as_dict(getattr(result, "resumed", None))
        # The interrupted attempt's own spend, kept (the report sums it over every attempt), from the signed copy.
        want = {"replayed_turns": resumed.get("replayed_turns"), "diverged_at": resumed.get("diverged_at"),
                "source_usage": chain_usage(self.run_dir / SOURCE_DIR)}
        got = {k: claimed.get(k) for k in want}
        self.check("gateway.resume_result", got == want, want, got,
                   "" if got == want else "result.json names another replay than the gateway's record", area="gateway")

    def _verify_billing_and_failure(self, derived: dict[str, Any], result: Any) -> None:
        """The run's cost in result.json is what the recorded responses' own usage fields
        sum to, priced with the recorded table; a provider's failure that ended the run
        is named in the result and makes it infrastructure's, never the agent's."""
        if "billing" not in derived:
            return
        extra = result.extra if isinstance(result.extra, dict) else {}
        claimed = extra.get("billing")
        self.check("gateway.billing", claimed == derived["billing"], derived["billing"].get("total"),
                   (claimed or {}).get("total") if isinstance(claimed, dict) else claimed,
                   "" if claimed == derived["billing"]
                   else "result.json's cost differs from the gateway record's responses", area="gateway")
        final, last = derived.get("provider_failure"), derived.get("last_failure")
        named = result.model_failure.value if result.model_failure is not None else None
        known = {f["failure"] for f in (final, last) if isinstance(f, dict)}
        ok = named is None or named in known
        if result.status is RunStatus.AGENT_FAILED:  # never the agent's zero for the provider's failure
            ok = ok and final is None and not (isinstance(last, dict) and not_the_agents(last["failure"]))
        if result.status is RunStatus.INFRASTRUCTURE_ERROR and known and named is None:
            ok = False
        self.check("gateway.failure_named", ok, (final or last or {}).get("failure"),
                   {"status": result.status.value, "model_failure": named},
                   "" if ok else "the run's status or named model failure does not follow from the gateway's record",
                   area="gateway")

    def _verify_native_channel(self, stored: Any, result: Any) -> None:
        """A named harness's mode (ale.agents.harness): the agent evidence, the result
        and the controller's record name the same one; a native run's channel is judged
        again from its record (``gateway_record.channel_checks``)."""
        confinement = _as_dict(_as_dict(stored).get("confinement"))
        mode = _as_dict(_as_dict(self.load(layout.evidence_path(Evidence.AGENT))).get("details")).get("mode")
        native = confinement.get("kind") == "sandbox-native"
        if mode is None and not native:
            return
        extra = _as_dict(getattr(result, "extra", None)) if result is not None else {}
        named = {"agent": mode, "result": extra.get("agent_mode", mode), "controller": "native" if native else "bridge"}
        same = len(set(named.values())) == 1
        self.check("gateway.mode", same, "one mode named everywhere", named,
                   "" if same else f"the run's mode is named differently: {named}", area="gateway")
        for c in gateway_record.channel_checks(confinement):
            self.check(f"gateway.{c.id}", c.ok, c.expected, c.observed, c.detail, area="gateway")

    def _attribution_problems(self, result: Any) -> list[str]:
        """An invalid run's attribution must follow from the evidence: the agent's
        phase ran (``phases.json``, the trajectory) exactly when it is charged to
        the agent. Older run folders carry no attribution: nothing to check."""
        claimed = getattr(result, "invalid_attribution", None)
        if claimed is None:
            return []
        phases = self.load(layout.evidence_path(Evidence.PHASES))
        agent_ran = isinstance(phases, list) \
            and any(isinstance(p, dict) and p.get("name") == Phase.AGENT for p in phases)
        agent_ran = agent_ran or (self.run_dir / layout.TRAJECTORY).exists()
        if claimed == InvalidAttribution.AFTER_AGENT_START and not agent_ran:
            return ["the run is charged to the agent (after_agent_start), but the agent never started"]
        if claimed == InvalidAttribution.BEFORE_AGENT and agent_ran:
            return ["the run is charged to the harness (before_agent), but the agent had started"]
        return []

    def verify_status(self, result: Any) -> None:
        if result is None:
            return
        stored = self.load(layout.evidence_path(Evidence.CHECKS))
        stored_failed = [f"[{c.get('phase')}] {c.get('id')}" for c in stored
                         if isinstance(c, dict) and c.get("ok") is not True] if isinstance(stored, list) else []
        status = result.status
        problems: list[str] = []
        if status is RunStatus.INVALID_EVALUATION_ENVIRONMENT:
            if result.score is not None or result.scores is not None:
                problems.append("an invalid_evaluation_environment run carries a score")
            if not (result.violations or self.violations or stored_failed):
                problems.append("the run is labelled invalid_evaluation_environment but names no violation")
            if self.violations:
                self.notes.append(
                    f"the evidence confirms the run's status: {len(self.violations)} isolation check(s) fail on it"
                )
            problems += self._attribution_problems(result)
        else:
            for v in self.violations:
                problems.append(f"the evidence shows a violation, yet the status is {status.value}: {v}")
            for v in result.violations:
                problems.append(f"result.json lists a violation, yet the status is {status.value}: {v}")
            for v in stored_failed:
                problems.append(f"checks.json records a failed check, yet the status is {status.value}: {v}")
        if result.score is not None:
            if not status.carries_score:
                problems.append(f"a {status.value} run carries a score")
            if not result.scores:
                problems.append("a score without the scores it is the mean of")
            else:
                mean = sum(result.scores) / len(result.scores)
                if not math.isclose(mean, result.score, rel_tol=SCORE_EPSILON, abs_tol=SCORE_EPSILON):
                    problems.append(f"score {result.score} is not the mean of scores {result.scores} ({mean})")
        elif status is RunStatus.SCORED:
            problems.append("a scored run without a score")
        elif result.scores:
            problems.append("scores without their mean in score")
        for p in problems:
            self.check("result.status_consistent", False, "status and score follow from the evidence",
                       {"status": status.value, "score": result.score}, p)
        if not problems:
            self.check("result.status_consistent", True, "status and score follow from the evidence",
                       {"status": status.value, "score": result.score})


    # == regrades (ale.record.regrades) ===========================================
    # A regrade is appended after the run was signed: verify_files leaves regrades/
    # to this section, which checks each regrade's signature, its files, its chain
    # to the attestation before it and its record against the grading it replaced.
    def verify_regrades(self, result: Any, public_key_path: Path | None) -> None:
        if not (self.run_dir / regrades.REGRADES_DIR).exists():
            return
        deliverables = _as_dict(self.load(layout.DELIVERABLES))
        after_start = _as_dict(self.load(layout.evidence_path(Evidence.INPUT_AFTER_START)))
        commit = _as_dict(self.load(layout.evidence_path(Evidence.REFERENCE_COMMIT)))
        original: dict[str, Any] = {
            "run_id": self.run_id,
            "deliverables_digest": deliverables.get("digest"),
            "input_digest": after_start.get("digest"),
            "reference_sha256": _as_dict(commit.get("source")).get("sha256"),
            "ended_at": None if result is None else result.ended_at.isoformat(),
        }
        if result is not None:
            original.update(regrades.grading_summary(json.loads(result.model_dump_json())))
        found = regrades.check_regrades(
            self.run_dir, original, regrades.key_chooser(self.run_dir, public_key_path, self.regrade_keys))
        for c in found.checks:
            self.check(c.id, c.ok, c.expected, c.observed, c.detail, area="regrades")
        self.notes += found.notes
        self.latest_grading = found.latest
    # == end of regrades ==========================================================
