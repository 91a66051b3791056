"""`ale export --format atif`: a run's trajectory in Harbor's Agent Trajectory
Interchange Format (ATIF, RFC 0001 of the Harbor project, v1.7).

The models below are written from the RFC's tables (root, agent, step, tool
call, observation and its results, metrics, final metrics, multimodal content
parts) with its rules: unknown fields are refused everywhere; ``step_id`` counts
from 1 without gaps; ``model_name``, ``reasoning_effort``, ``reasoning_content``,
``tool_calls`` and ``metrics`` belong to agent steps only; an observation result's
``source_call_id`` names a tool call of the same step; timestamps are ISO 8601;
tool arguments are an object; token counts are integers; an image part carries a
``source`` (``media_type`` png/jpeg/gif/webp and ``path``) and no text.

How a run maps onto it:

- step 1 (``user``): the prompt the agent received, when the run folder holds it,
  else a note saying it does not (the task card's description, when there is one);
- with the gateway's model turns: one ``agent`` step per model turn (its text,
  reasoning, tool calls, token usage and cost), whose observation holds the output
  of each bridge step the call produced; a trajectory step no turn asked for
  (a harness-internal or unrecorded call) is an ``agent`` step of its own;
- without model turns (``oracle``, ``replay``, ``nop``): one ``agent`` step per
  tool call, with an empty message;
- a screenshot is an image part whose ``path`` is relative to the exported file;
- ``extra.ale``: the run's id, task, variant, status, score and the reason when
  not scored; each step's ``extra.ale``: the tool's exit code, flags and times.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ale import __version__, layout
from ale.report.viewer import (
    find_prompt,
    is_experiment_dir,
    is_run_dir,
    load_run,
    one_line_reason,
)

ATIF_VERSION = "ATIF-v1.7"
ATIF_VERSIONS = tuple(f"ATIF-v1.{n}" for n in range(8))
EXPORT_SUFFIX = ".atif.json"  # a run's export: <run_dir>.atif.json, beside the (signed) run folder
EXPORT_DIR = "atif"  # an experiment's: <output>/atif/<run_id>.atif.json
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _iso(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise ValueError(f"{value!r} is not an ISO 8601 timestamp") from e
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageSource(_Strict):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    path: str


class ContentPart(_Strict):
    type: Literal["text", "image"]
    text: str | None = None
    source: ImageSource | None = None

    @model_validator(mode="after")
    def _fields_for_type(self) -> ContentPart:
        if self.type == "text" and (self.text is None or self.source is not None):
            raise ValueError("a text part has text and no source")
        if self.type == "image" and (self.source is None or self.text is not None):
            raise ValueError("an image part has a source and no text")
        return self


Content = str | list[ContentPart]


class AtifAgent(_Strict):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class ToolCall(_Strict):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class SubagentTrajectoryRef(_Strict):
    session_id: str | None = None
    trajectory_id: str | None = None
    trajectory_path: str | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _resolvable(self) -> SubagentTrajectoryRef:
        if self.trajectory_id is None and self.trajectory_path is None:
            raise ValueError("a subagent reference names trajectory_id or trajectory_path")
        return self


class ObservationResult(_Strict):
    source_call_id: str | None = None
    content: Content | None = None
    subagent_trajectory_ref: list[SubagentTrajectoryRef] | None = None
    extra: dict[str, Any] | None = None


class Observation(_Strict):
    results: list[ObservationResult]


class Metrics(_Strict):
    prompt_tokens: int | None = Field(default=None, strict=True)
    completion_tokens: int | None = Field(default=None, strict=True)
    cached_tokens: int | None = Field(default=None, strict=True)
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(_Strict):
    total_prompt_tokens: int | None = Field(default=None, strict=True)
    total_completion_tokens: int | None = Field(default=None, strict=True)
    total_cached_tokens: int | None = Field(default=None, strict=True)
    total_cost_usd: float | None = None
    total_steps: int | None = Field(default=None, strict=True)
    extra: dict[str, Any] | None = None


class Step(_Strict):
    step_id: int = Field(ge=1, strict=True)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: Content
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    llm_call_count: int | None = Field(default=None, ge=0, strict=True)
    is_copied_context: bool | None = None
    extra: dict[str, Any] | None = None

    @field_validator("timestamp")
    @classmethod
    def _timestamp(cls, value: str | None) -> str | None:
        return _iso(value)

    @model_validator(mode="after")
    def _agent_only(self) -> Step:
        if self.source != "agent":
            present = [f for f in AGENT_ONLY if getattr(self, f) is not None]
            if present:
                raise ValueError(f"{', '.join(present)}: only on agent steps, not on a {self.source} step")
        if self.llm_call_count == 0 and self.metrics is not None:
            raise ValueError("metrics: absent when llm_call_count is 0")
        ids = {c.tool_call_id for c in self.tool_calls or []}
        for r in self.observation.results if self.observation else []:
            if r.source_call_id is not None and r.source_call_id not in ids:
                raise ValueError(f"observation result source_call_id {r.source_call_id!r} is not in this "
                                 "step's tool_calls")
        return self


class Trajectory(_Strict):
    schema_version: Literal["ATIF-v1.0", "ATIF-v1.1", "ATIF-v1.2", "ATIF-v1.3", "ATIF-v1.4", "ATIF-v1.5",
                            "ATIF-v1.6", "ATIF-v1.7"]
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: AtifAgent
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    subagent_trajectories: list[Trajectory] | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _sequential(self) -> Trajectory:
        for n, step in enumerate(self.steps, 1):
            if step.step_id != n:
                raise ValueError(f"steps[{n - 1}].step_id is {step.step_id}, expected {n} (sequential from 1)")
        return self


def validate(doc: dict[str, Any]) -> Trajectory:
    """Check a document against the ATIF models (raises pydantic's ValidationError)."""
    return Trajectory.model_validate(doc)


def json_schema() -> dict[str, Any]:
    schema = Trajectory.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ATIF trajectory (as ale export writes and checks it)"
    return schema


# -- a run, exported ----------------------------------------------------------------------
def _text(step: dict[str, Any]) -> str:
    parts: list[str] = []
    for name in ("stdout", "stderr", "output"):
        v = step.get(name)
        if isinstance(v, str) and v:
            parts.append(v if name != "stderr" or not parts else f"[stderr]\n{v}")
    if step.get("error"):
        parts.append(f"[error] {step['error']}")
    return "\n".join(parts)


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {"input": value}
    if isinstance(value, dict):
        return value
    return {} if value is None else {"input": value}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class _Exporter:
    def __init__(self, run_dir: Path, out: Path):
        self.run_dir = run_dir
        self.out = out
        self.data = load_run(run_dir, verify=False)

    def image_path(self, step: dict[str, Any]) -> str | None:
        ref = (step.get("files") or {}).get("image")
        if not isinstance(ref, dict) or not isinstance(ref.get("path"), str):
            return None
        path = (self.run_dir / ref["path"]).resolve()
        if not path.is_relative_to(self.run_dir.resolve()) or not path.is_file():
            return None
        return os.path.relpath(path, self.out.parent.resolve()).replace(os.sep, "/")

    def result_of(self, step: dict[str, Any], call_id: str | None) -> ObservationResult:
        text = _text(step)
        image = self.image_path(step)
        content: Content = text
        if image is not None:
            content = ([ContentPart(type="text", text=text)] if text else []) + [
                ContentPart(type="image", source=ImageSource(media_type="image/png", path=image))]
        extra = {k: step.get(k)
                 for k in ("exit_code", "ok", "refused", "timed_out", "truncated") if step.get(k) not in (None, False)}
        extra["ok"] = bool(step.get("ok"))
        files = step.get("files") or {}
        if files:
            extra["files"] = {k: v.get("path") for k, v in files.items() if isinstance(v, dict)}
        if isinstance(step.get("gateway"), dict):  # derived from the gateway's record: the records it came from
            extra["gateway"] = step["gateway"]
        return ObservationResult(source_call_id=call_id, content=content, extra={"ale": extra})

    def step_extra(self, step: dict[str, Any]) -> dict[str, Any]:
        return {"ale": {"step": step.get("index"), "tool": step.get("tool"), "started_at": step.get("started_at"),
                        "ended_at": step.get("ended_at"), "seconds": step.get("seconds")}}

    def trajectory(self) -> Trajectory:
        d = self.data
        traj, result = d.trajectory, d.result
        raw_steps = [s for s in traj.get("steps") or [] if isinstance(s, dict)]
        turns = [t for t in traj.get("model_turns") or [] if isinstance(t, dict)]
        prompt = find_prompt(self.run_dir, traj, d.plan)
        run_id = str(result.get("run_id") or d.plan.get("run_id") or self.run_dir.name)
        steps: list[Step] = [Step(
            step_id=1, timestamp=traj.get("started_at"), source="user",
            message=prompt.text if prompt.text is not None else f"[ale: {prompt.source}]",
            extra={"ale": {"prompt_source": prompt.source if prompt.text is not None else None}},
        )]
        by_index = {s.get("index"): s for s in raw_steps}
        claimed: set[Any] = set()
        items: list[tuple[float, int, Any]] = []
        for n, t in enumerate(turns):
            joined: list[int] = [c["step"] for c in t.get("tool_calls") or []
                                 if isinstance(c, dict) and isinstance(c.get("step"), int) and c["step"] in by_index]
            claimed.update(joined)
            items.append((min(joined) - 0.5 if joined else self._turn_position(t, raw_steps), 0, ("turn", n, t)))
        for s in raw_steps:
            if s.get("index") not in claimed:
                items.append((float(s.get("index") or 0), 1, ("step", 0, s)))
        items.sort(key=lambda x: (x[0], x[1]))
        totals: dict[str, float] = {}
        for _, _, (kind, n, obj) in items:
            sid = len(steps) + 1
            if kind == "turn":
                steps.append(self.turn_step(sid, n, obj, by_index, totals))
            else:
                call_id = f"ale-step-{obj.get('index')}"
                steps.append(Step(
                    step_id=sid, timestamp=obj.get("started_at"), source="agent", message="",
                    tool_calls=[ToolCall(tool_call_id=call_id, function_name=str(obj.get("tool") or "?"),
                                         arguments=_arguments(obj.get("args")))],
                    observation=Observation(results=[self.result_of(obj, call_id)]),
                    extra=self.step_extra(obj)))
        model = next((t.get("model") for t in turns if t.get("model")), None)
        agent_spec: dict[str, Any] = d.plan["agent"] if isinstance(d.plan.get("agent"), dict) else {}
        final = FinalMetrics(
            total_prompt_tokens=int(totals["prompt"]) if "prompt" in totals else None,
            total_completion_tokens=int(totals["completion"]) if "completion" in totals else None,
            total_cached_tokens=int(totals["cached"]) if "cached" in totals else None,
            total_cost_usd=round(totals["cost"], 8) if "cost" in totals else None,
            total_steps=len(steps),
            extra={"ale": {"tool_calls": len(raw_steps), "model_turns": len(turns), "usage": traj.get("usage") or {}}},
        )
        return Trajectory(
            schema_version=ATIF_VERSION, session_id=run_id, trajectory_id=run_id,
            agent=AtifAgent(name=str(result.get("agent") or agent_spec.get("label") or agent_spec.get("name")
                                     or traj.get("agent") or "?"),
                            version=f"ale {result.get('harness_version') or __version__}", model_name=model,
                            extra={"ale": {"agent": agent_spec.get("name"), "config": agent_spec.get("config"),
                                           "allowlist": agent_spec.get("allowlist")}}),
            steps=steps,
            notes=(f"Exported by ale {__version__} from the run folder {self.run_dir.name} ({layout.TRAJECTORY}). "
                   "One agent step per model turn (the tool calls it made, with the outputs of the steps "
                   "they produced), or per tool call when the agent made no model calls through the gateway. Outputs "
                   "larger than the trajectory inlines are previews; their whole values are in the run folder's "
                   f"{layout.TRAJECTORY_FILES}/."),
            final_metrics=final,
            extra={"ale": {"run_id": run_id, "task_id": result.get("task_id"), "variant": result.get("variant"),
                           "status": result.get("status"), "score": result.get("score"), "scores": result.get("scores"),
                           "reason": one_line_reason(result), "ended": traj.get("ended"),
                           "run_dir": self.run_dir.name, "steps_source": traj.get("steps_source") or "toolbox",
                           "harness_transcript": traj.get("harness_transcript")}},
        )

    @staticmethod
    def _turn_position(turn: dict[str, Any], steps: list[dict[str, Any]]) -> float:
        t = str(turn.get("time") or "")
        later = [s.get("index") or 0 for s in steps if str(s.get("started_at") or "") >= t] if t else []
        return (min(later) if later else max((s.get("index") or 0 for s in steps), default=0) + 1) - 0.5

    def turn_step(self, sid: int, n: int, t: dict[str, Any], by_index: dict[Any, dict[str, Any]],
                  totals: dict[str, float]) -> Step:
        calls: list[ToolCall] = []
        results: list[ObservationResult] = []
        for k, c in enumerate(t.get("tool_calls") or []):
            if not isinstance(c, dict):
                continue
            call_id = f"ale-turn-{n + 1}-call-{k + 1}"
            step = by_index.get(c.get("step"))
            calls.append(ToolCall(tool_call_id=call_id, function_name=str(c.get("name") or "?"),
                                  arguments=_arguments(c.get("arguments")),
                                  extra={"ale": {"step": c.get("step")}} if step is not None else None))
            if step is not None:
                results.append(self.result_of(step, call_id))
        usage: dict[str, Any] = t["usage"] if isinstance(t.get("usage"), dict) else {}
        prompt, completion, cached = (_int(usage.get("input_tokens")), _int(usage.get("output_tokens")),
                                      _int(usage.get("cached_input_tokens")))
        cost = usage.get("cost_usd") if isinstance(usage.get("cost_usd"), int | float) else None
        for key, v in (("prompt", prompt), ("completion", completion), ("cached", cached), ("cost", cost)):
            if v is not None:
                totals[key] = totals.get(key, 0) + v
        metrics = None
        if any(v is not None for v in (prompt, completion, cached, cost)):
            metrics = Metrics(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
                              cost_usd=float(cost) if cost is not None else None)
        return Step(
            step_id=sid, timestamp=t.get("time") or None, source="agent", model_name=t.get("model") or None,
            message=str(t.get("text") or ""), reasoning_content=t.get("reasoning") or None,
            tool_calls=calls or None, observation=Observation(results=results) if results else None,
            metrics=metrics, llm_call_count=1,
            extra={"ale": {"request": t.get("request"), "api": t.get("api"), "decision": t.get("decision"),
                           "status": t.get("status"), "messages": t.get("messages"),
                           "tools_offered": t.get("tools_offered")}},
        )


def run_to_atif(run_dir: Path, out: Path) -> dict[str, Any]:
    """The run as an ATIF document (checked against the models), image paths relative to ``out``."""
    traj = _Exporter(Path(run_dir), Path(out).resolve()).trajectory()
    doc = traj.model_dump(mode="json", exclude_none=True)
    validate(doc)
    return doc


def default_export(target: Path) -> Path:
    target = Path(target).resolve()
    if is_run_dir(target):
        return target.with_name(target.name + EXPORT_SUFFIX)
    return target / EXPORT_DIR


def export(target: Path, out: Path | None = None) -> list[Path]:
    """Write the ATIF file of a run (default ``<run_dir>.atif.json``) or of every run of
    an experiment (default ``<output>/atif/<run>.atif.json``); never inside a run folder."""
    target = Path(target)
    dest = Path(out) if out is not None else default_export(target)
    if is_run_dir(target):
        runs = [(target, dest)]
    elif is_experiment_dir(target):
        from ale.report.viewer import experiment_runs

        runs = [(r.path, dest / (r.path.name + EXPORT_SUFFIX)) for r in experiment_runs(target)]
    else:
        raise ValueError(f"{target} is neither a run folder (no {layout.PLAN} or {layout.RESULT}) nor an experiment's "
                         f"output folder (no {layout.RUNS_DIR}/ or {layout.EXPERIMENT_RECORD})")
    written = []
    for run_dir, path in runs:
        if path.resolve().is_relative_to(run_dir.resolve()):
            raise ValueError(f"{path} is inside the run folder {run_dir}, whose files are signed: write elsewhere")
        doc = run_to_atif(run_dir, path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8", errors="replace")
        tmp.replace(path)
        written.append(path)
    return written
