"""The trajectory: every tool call an agent made, as strict data.

``TrajectoryWriter`` is the ToolBox ``recorder``. Each step is appended to
``run_dir/trajectory.jsonl`` and fsynced the moment it happens, so a run that
dies mid-way still has its steps on disk. Texts larger than ``INLINE_LIMIT``
bytes (tool output, or write_file content) are stored under
``run_dir/trajectory-files/`` and the step keeps a short preview plus a
``FileRef`` (path, size, sha256). ``close()`` writes ``trajectory.json``, with
the model side folded in as ``model_turns`` when the run's gateway wrote
``agent/gateway/turns.json`` (per model request: text, reasoning, the tool calls as
the model made them, each joined to the step it produced), so a run of an external
harness reads like one of the ``llm`` agent.

Where the steps come from is ``steps_source``: ``toolbox`` (every agent whose tools
run through the ToolBox: the built-in agents and external harnesses in bridge mode;
each step recorded as it ran), or ``gateway`` (a native harness, whose tools run
inside the sandbox: each step derived at ``close()`` from the gateway's hash-chained
record by ``ale.agents.gateway.steps``, the call as the model made it, the result as
the harness sent it back, and ``gateway`` naming the records it came from). A native
harness's own transcript, copied out of the sandbox, is named by
``harness_transcript``: written by the candidate, never the source of a step.

Any bytes an agent sends or receives are recorded exactly, and every file stays
UTF-8 JSON: ``files[field]`` holds the field's exact value whenever the inline
text is not it, either because it is too large (the inline text is a preview)
or because it is not exact text (the inline text is a display form):

- raw tool output that is not valid UTF-8 (the agent was given it with U+FFFD
  replacements): the exact bytes, ``kind="bytes"``;
- a str holding lone surrogates (``"\\ud800"`` from an agent's JSON): the inline
  text writes each as ``\\udXXX`` and the file holds
  ``s.encode("utf-8", "surrogatepass")``, ``kind="text-surrogatepass"``;
- bytes arguments (``write_file`` binary content): the bytes, ``kind="bytes"``.

Nested argument values and ``extra`` are kept as ``ale.lossless.json_safe`` says;
one nested deeper than ``MAX_DEPTH`` or larger than the inline limit as JSON is
kept as a file of its JSON (``kind="json"``), referenced like any other. The
recorder never raises for what a step holds: a step it cannot keep whole is kept
with its index, tool and outcome and says why (``extra.recorder_error``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ale import layout
from ale.lossless import display, exact_bytes, is_unicode, json_safe, safe_key

log = logging.getLogger(__name__)

INLINE_LIMIT = 64 * 1024
PREVIEW_CHARS = 2048
# Argument and extra values nested deeper than this, or larger than the inline limit
# as JSON, are kept as a file of their JSON (a reference inline), never inline.
MAX_DEPTH = 32
MAX_STORED_JSON = 16 * 1024 * 1024
FILES_DIR = layout.TRAJECTORY_FILES
SCHEMA_VERSION = 1


class FileRef(BaseModel):
    """A value kept beside the trajectory instead of inside it: too large to
    inline, or not exact as text (raw bytes, lone surrogates)."""

    model_config = ConfigDict(extra="forbid")
    path: str  # relative to the run folder
    bytes: int
    sha256: str
    # What the bytes are: "text" (UTF-8), "bytes" (exact, as sent or received) or
    # "text-surrogatepass" (a str with lone surrogates); None in older records,
    # where the extension says it (.txt text, .bin bytes).
    kind: str | None = None


class GatewayOrigin(BaseModel):
    """Where a step derived from the gateway's record came from (``steps_source: gateway``)."""

    model_config = ConfigDict(extra="forbid")
    api: str | None = None  # openai | anthropic | gemini
    call_id: str | None = None  # the call's id as the model gave it (none for Gemini)
    call_request: int  # the model request whose response made the call (records.jsonl seq; model_turns[].request)
    call_response: int | None = None  # that response's record seq
    call_record: str | None = None  # that response record's hash
    result_request: int | None = None  # the later request carrying the result back (None: no result came)
    result_record: str | None = None  # that request record's hash
    turn_usage: dict[str, Any] = Field(default_factory=dict)  # the model turn's tokens and cost (shared by its calls)


class TrajectoryStep(BaseModel):
    """One tool call: as the ToolBox saw it run, or (``gateway`` set) as the
    gateway's record shows it: the model's call and the result the harness sent back."""

    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=1)
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    ok: bool
    refused: bool = False
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output: str = ""
    truncated: bool = False
    timed_out: bool = False
    error: str | None = None
    started_at: str
    ended_at: str
    seconds: float = Field(ge=0)
    # Field name ("stdout", "output", "args.content", ...) -> where its full value is.
    files: dict[str, FileRef] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)
    gateway: GatewayOrigin | None = None  # set on a step derived from the gateway's record


class StepsDerivation(BaseModel):
    """How a native harness's steps were derived from the gateway's record."""

    model_config = ConfigDict(extra="forbid")
    source: str = "gateway"
    records: int = 0  # records read from agent/gateway/records.jsonl
    head: str | None = None  # the chain's last hash: the record the steps were derived from
    model_requests: int = 0
    calls: int = 0  # tool calls the model made (one step each)
    answered: int = 0  # calls whose result a later request carried
    unanswered: int = 0  # calls with no result (the harness was stopped)
    malformed: int = 0  # parts of request or response bodies skipped as not of the expected shape
    malformed_where: list[str] = Field(default_factory=list)  # the first of them
    # the record's own problems as read (``ale verify`` judges them)
    record_problems: list[str] = Field(default_factory=list)


class ModelToolCall(BaseModel):
    """A tool call as the model made it (from the gateway's record of the response)."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    arguments: Any = None  # as the API carries them: a JSON string (OpenAI) or an object
    id: str | None = None  # the call's id (Anthropic tool_use id, OpenAI call_id), when the model gave one
    step: int | None = Field(default=None, ge=1)  # the step it produced or was derived into (``steps[].index``), if any


class ModelTurn(BaseModel):
    """One model request through the run's gateway and what the model answered
    (``RUN/agent/gateway/turns.json``, folded in when the trajectory is closed)."""

    model_config = ConfigDict(extra="forbid")
    request: int | None = None  # the request's number in agent/gateway/records.jsonl
    time: str | None = None
    api: str | None = None  # openai | anthropic | gemini
    model: str | None = None
    messages: int | None = None  # conversation items sent
    tools_offered: list[str] | None = None
    decision: str | None = None  # forwarded | refused | ...
    status: int | None = None
    usage: dict[str, Any] = Field(default_factory=dict)
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ModelToolCall] = Field(default_factory=list)


class Trajectory(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    run_id: str
    agent: str
    started_at: str
    ended_at: str | None = None
    ended: str | None = None  # the agent's end: finished | failed | timeout | interrupted
    # toolbox: recorded as each tool ran through the ToolBox; gateway: derived from the gateway's record (a native
    # harness).
    steps_source: Literal["toolbox", "gateway"] = "toolbox"
    steps: list[TrajectoryStep] = Field(default_factory=list)
    steps_derivation: StepsDerivation | None = None  # steps_source gateway: how the steps were derived
    # A native harness's own transcript (its manifest, run-relative): written by the candidate, not evidence of any
    # step.
    harness_transcript: str | None = None
    # The model side, for every agent whose model requests went through the gateway.
    model_turns: list[ModelTurn] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)


MODEL_TURNS = layout.gateway_path(layout.Gateway.TURNS)  # relative to the run folder (gateway/turns.py writes it)
GATEWAY_RECORDS = layout.gateway_path(layout.Gateway.RECORDS)
HARNESS_TRANSCRIPT_MANIFEST = layout.agent_path(layout.Agent.HARNESS_TRANSCRIPT_MANIFEST)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def write_schema(path: str | Path) -> Path:
    """Publish the trajectory JSON Schema (what `trajectory.json` conforms to)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    schema = Trajectory.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://ale.dev/schemas/trajectory.schema.json"
    p.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    return p


class TrajectoryWriter:
    """Records steps as they happen; usable directly as a ToolBox ``recorder``."""

    def __init__(self, run_dir: str | Path, run_id: str, agent: str, *, inline_limit: int = INLINE_LIMIT):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.agent = agent
        self.inline_limit = inline_limit
        self.jsonl_path = self.run_dir / layout.TRAJECTORY_LOG
        self.json_path = self.run_dir / layout.TRAJECTORY
        if self.jsonl_path.exists() or self.json_path.exists():
            raise FileExistsError(f"a trajectory already exists in {self.run_dir}; refusing to overwrite it")
        self.started_at = _now()
        self.steps: list[TrajectoryStep] = []
        self.closed = False
        # A native harness's steps, derived from the gateway's record once (at the first close() that finds it).
        self.gateway_steps: list[TrajectoryStep] | None = None
        self.derivation: StepsDerivation | None = None
        # Steps can arrive from a worker thread (an MCP server) as well as the loop.
        self._lock = threading.Lock()
        self._fh = open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    # -- recording ---------------------------------------------------------
    def __call__(self, step: dict[str, Any]) -> None:
        self.record(step)

    def record(self, raw: dict[str, Any]) -> TrajectoryStep:
        """Keep one step; never raises for what the step holds: a step that cannot be
        kept whole is kept with what could be (its index, tool, outcome) and says why."""
        with self._lock:
            try:
                step = self._to_step(raw)
            except Exception as e:  # noqa: BLE001 - the step must be recorded whatever it holds
                step = self._fallback_step(raw, e)
            self.steps.append(step)
            line = step.model_dump_json() + "\n"
            if self._fh.closed:
                # A step that lands after close() still belongs in the stream.
                self._fh = open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())
            return step

    def _to_step(self, raw: dict[str, Any]) -> TrajectoryStep:
        known = set(TrajectoryStep.model_fields) - {"files", "extra"}
        exact = {name: raw.get(f"{name}_bytes") for name in ("stdout", "stderr", "output")}
        hidden = {"files", "extra", "image_png", *(f"{name}_bytes" for name in exact)}
        data = {k: v for k, v in raw.items() if k in known}
        index = int(data.get("index") or len(self.steps) + 1)
        data["index"] = index
        files: dict[str, FileRef] = {}
        extra = {_key(k): self._bounded(index, f"extra.{display(str(k))}", v, files)
                 for k, v in raw.items() if k not in known and k not in hidden}
        if isinstance(raw.get("extra"), dict):
            extra.update({_key(k): self._bounded(index, f"extra.{display(str(k))}", v, files)
                          for k, v in raw["extra"].items()})
        image = raw.get("image_png")
        if isinstance(image, bytes | bytearray):  # a screenshot: a .png file, never base64 in JSON
            files["image"] = self._store(index, "screenshot", bytes(image), kind="bytes", suffix="png")
        for name in ("stdout", "stderr", "output"):
            value = data.get(name)
            if value is None:
                data[name] = ""
            elif isinstance(value, str | bytes):
                raw_bytes = exact[name]
                data[name] = self._maybe_store(index, name, value, files,
                                               exact=raw_bytes if isinstance(raw_bytes, bytes) else None)
            else:
                data[name] = self._maybe_store(index, name, str(value), files)
        for name in ("tool", "error"):
            value = data.get(name)
            if value is not None:
                data[name] = self._maybe_store(index, name, str(value), files)
        args = raw.get("args") or {}
        data["args"] = {_key(k): self._arg(index, str(k), v, files) for k, v in dict(args).items()}
        data.setdefault("started_at", _now())
        data.setdefault("ended_at", data["started_at"])
        data.setdefault("seconds", 0.0)
        return TrajectoryStep(**data, files=files, extra=extra)

    def _fallback_step(self, raw: dict[str, Any], error: BaseException) -> TrajectoryStep:
        """The step as far as it can be kept: scalars only, the rest named as lost."""
        def flag(key: str) -> bool:
            return raw.get(key) is True

        index = raw.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) and index >= 1 else len(self.steps) + 1
        why = f"the recorder could not keep this step whole ({type(error).__name__}: {display(str(error))[:500]})"
        err = raw.get("error")
        return TrajectoryStep(
            index=index, tool=display(str(raw.get("tool", "?")))[:200], ok=flag("ok"), refused=flag("refused"),
            exit_code=code if isinstance(code := raw.get("exit_code"), int) and not isinstance(code, bool) else None,
            timed_out=flag("timed_out"),
            error=(display(err)[:PREVIEW_CHARS] + "; " if isinstance(err, str) else "") + why,
            started_at=str(raw.get("started_at") or _now()), ended_at=str(raw.get("ended_at") or _now()),
            seconds=max(0.0, float(raw["seconds"])) if isinstance(raw.get("seconds"), int | float) else 0.0,
            extra={"recorder_error": why},
        )

    def _bounded(self, index: int, name: str, value: Any, files: dict[str, FileRef]) -> Any:
        """``_jsonable(value)``, or, for a value nested deeper than ``MAX_DEPTH`` or
        larger than the inline limit as JSON, a file holding its JSON (a reference inline)."""
        try:
            safe, deep = _jsonable(value), False
        except _TooDeep:
            safe, deep = None, True
        if not deep and len(_json_text(safe, limit=self.inline_limit + 1)) <= self.inline_limit:
            return safe
        text = _json_text(value, limit=MAX_STORED_JSON)
        ref = self._store(index, name, text.encode("utf-8"), kind="json", suffix="json")
        files[name] = ref
        why = f"nested deeper than {MAX_DEPTH} levels" if deep else f"{ref.bytes} bytes as JSON"
        return f"<a value {why}, stored in {ref.path}>"

    def _arg(self, index: int, key: str, value: Any, files: dict[str, FileRef]) -> Any:
        name = f"args.{display(key)}"
        if isinstance(value, bytes | bytearray):
            # Binary content is never inlined: JSON cannot hold it faithfully.
            ref = self._store(index, name, bytes(value), kind="bytes")
            files[name] = ref
            return f"<{len(value)} bytes, stored in {ref.path}>"
        if isinstance(value, str):
            return self._maybe_store(index, name, value, files)
        return self._bounded(index, name, value, files)

    def _maybe_store(self, index: int, name: str, value: str | bytes, files: dict[str, FileRef],
                     exact: bytes | None = None) -> str:
        """The inline text of a field; its exact value goes to a file when the text
        is not it (too large, not valid UTF-8, lone surrogates)."""
        if isinstance(value, bytes):
            exact = value if exact is None else exact
            text = value.decode("utf-8", errors="replace")
        else:
            text = value
        if not is_unicode(text):
            data, kind, text = exact_bytes(text), "text-surrogatepass", display(text)
        elif exact is not None and not _is_utf8(exact):
            data, kind = exact, "bytes"
        else:
            data, kind = text.encode("utf-8"), "text"
            if len(data) <= self.inline_limit:
                return text
        ref = self._store(index, name, data, kind=kind)
        files[name] = ref
        if len(text.encode("utf-8")) <= self.inline_limit:
            return text  # complete, but not exact: the file holds the exact value
        return text[:PREVIEW_CHARS] + (f"\n[... {len(data)} bytes in total; full value in {ref.path} "
                                       f"(sha256 {ref.sha256[:16]}...)]")

    def _store(self, index: int, name: str, data: bytes, *, kind: str, suffix: str | None = None) -> FileRef:
        folder = self.run_dir / FILES_DIR
        folder.mkdir(exist_ok=True)
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "-" for c in name)[:80]
        ext = suffix or ("txt" if kind == "text" else "bin")
        rel = f"{FILES_DIR}/{index:05d}-{safe}.{ext}"
        n = 1
        while True:
            try:
                fd = os.open(self.run_dir / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                break
            except FileExistsError:  # two fields with the same safe name
                n += 1
                rel = f"{FILES_DIR}/{index:05d}-{safe}-{n}.{ext}"
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return FileRef(path=rel, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), kind=kind)

    # -- ending ------------------------------------------------------------
    def trajectory(self, *, usage: dict[str, Any] | None = None, end: str | None = None) -> Trajectory:
        native = self.gateway_steps is not None
        return Trajectory(
            run_id=self.run_id,
            agent=self.agent,
            started_at=self.started_at,
            ended_at=_now() if end is not None else None,
            ended=end,
            steps_source="gateway" if native else "toolbox",
            steps=[*self.steps, *(self.gateway_steps or [])],
            steps_derivation=self.derivation,
            harness_transcript=(HARNESS_TRANSCRIPT_MANIFEST
                                if (self.run_dir / HARNESS_TRANSCRIPT_MANIFEST).is_file() else None),
            model_turns=self._model_turns(),
            usage=_jsonable(usage or {}),
        )

    def _derive_gateway_steps(self) -> None:
        """A native harness's steps, from the gateway's record (``ale.agents.gateway.steps``),
        each stored like a recorded step (large or inexact values beside, as FileRefs).
        Done once; nothing for a run whose gateway served no native harness."""
        from ale.agents.gateway.record import read_records
        from ale.agents.gateway.steps import derive_steps, is_native

        if self.gateway_steps is not None or not (self.run_dir / GATEWAY_RECORDS).is_file():
            return
        records, problems = read_records(self.run_dir)
        if not is_native(records):
            return
        derived = derive_steps(self.run_dir, records)
        derived["derivation"]["record_problems"] = (problems + derived["derivation"]["record_problems"])[:20]
        offset = len(self.steps)  # none in a native run: its tools never pass through the ToolBox
        steps = []
        for raw in derived["steps"]:
            origin = raw.pop("gateway")
            if isinstance(origin.get("call_id"), str):
                origin["call_id"] = display(origin["call_id"])
            step = self._to_step({**raw, "index": raw["index"] + offset})
            steps.append(step.model_copy(update={"gateway": GatewayOrigin.model_validate(origin)}))
        self.derivation = StepsDerivation.model_validate(derived["derivation"])
        self.gateway_steps = steps

    def _model_turns(self) -> list[ModelTurn]:
        """The gateway's model turns of this run, if it wrote them; a file that does not
        read or validate is left out (it stays in the run folder, and the gateway's
        record is the evidence either way)."""
        path = self.run_dir / MODEL_TURNS
        if not path.exists():
            return []
        try:
            return [ModelTurn.model_validate(t) for t in json.loads(path.read_text()).get("turns") or []]
        except (OSError, ValueError, AttributeError) as e:
            log.warning("trajectory: cannot fold in the model turns of %s: %r", path, e)
            return []

    def close(self, *, usage: dict[str, Any] | None = None, end: str | None = None) -> Path:
        """Write `trajectory.json` (again, if called twice: the last call wins)."""
        with self._lock:
            try:
                self._derive_gateway_steps()
            except Exception as e:  # a view of the record: the record itself stays the evidence
                log.warning("trajectory: cannot derive the steps from the gateway's record in %s: %r", self.run_dir, e)
            doc = self.trajectory(usage=usage, end=end or "interrupted")
            tmp = self.json_path.with_suffix(".json.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(doc.model_dump_json(indent=2))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.json_path)
            if not self._fh.closed:
                self._fh.close()
            self.closed = True
            return self.json_path


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _key(key: Any) -> str:
    return str(safe_key(str(key)))


class _TooDeep(Exception):
    pass


def _str(value: Any) -> str:
    """``str(value)``, or its type's name when even that raises."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - an object whose __str__ raises is still recorded
        return f"<unprintable {type(value).__name__}>"


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str | bytes | bytearray):
        return json_safe(value)
    return json_safe(_str(value))


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy, losing nothing (``ale.lossless.json_safe``: bytes become
    ``{"$base64": ...}``, strings with lone surrogates their own marker); keys
    become strings and objects JSON does not know their ``str()``. Raises
    ``_TooDeep`` past ``MAX_DEPTH`` levels of nesting."""
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_DEPTH:
            raise _TooDeep()
        if isinstance(value, dict):
            return {_key(k): _jsonable(v, depth + 1) for k, v in value.items()}
        return [_jsonable(v, depth + 1) for v in value]
    return _scalar(value)


class _Tok(str):
    """Literal JSON text on the encoder's stack (not a value to encode)."""


def _json_text(value: Any, *, limit: int) -> str:
    """The value as compact JSON (``_jsonable``'s conversions), at any depth: an
    explicit stack, no recursion. Cut at about ``limit`` characters, with a marker
    (a cyclic or huge value stays bounded)."""
    out: list[str] = []
    size = 0
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Tok):
            piece = str(item)
        elif isinstance(item, dict):
            piece = "{"
            stack.append(_Tok("}"))
            entries = list(item.items())
            for i in range(len(entries) - 1, -1, -1):
                k, v = entries[i]
                stack.append(v)
                stack.append(_Tok(("," if i else "") + json.dumps(_key(k)) + ":"))
        elif isinstance(item, list | tuple):
            piece = "["
            stack.append(_Tok("]"))
            for i in range(len(item) - 1, -1, -1):
                stack.append(item[i])
                if i:
                    stack.append(_Tok(","))
        else:
            piece = json.dumps(_scalar(item), ensure_ascii=False)
        out.append(piece)
        size += len(piece)
        if size > limit:
            out.append(f" [... cut at {limit} characters]")
            break
    return "".join(out)


def load_trajectory(path: str | Path) -> Trajectory:
    """Read a `trajectory.json` back, validated against the schema."""
    p = Path(path)
    try:
        return Trajectory.model_validate_json(p.read_text())
    except OSError as e:
        raise FileNotFoundError(f"cannot read trajectory {p}: {e}") from e
