"""Experiment files: a matrix of agents × tasks × variants × repeats, as YAML.

An experiment file is validated by pydantic with unknown keys refused (the
message names the key, where it is, and the closest valid key). Relative paths
resolve against the experiment file's folder; task-list entries, globs and task
paths resolve against ``tasks_root`` (itself relative to the file's folder).

Planning is deterministic: the same file gives the same runs, in the same order,
with the same ids. A *unit* is one (task, variant, agent, repeat); its id is
``<task>-v<variant>-<agent label>-r<repeat>`` (sanitised). Each attempt of a
unit is its own run with its own folder: ``<unit id>-a<attempt>`` (attempt 1,
2, ... — later attempts exist only after an infrastructure error).
"""

from __future__ import annotations

import difflib
import glob as globlib
import hashlib
import itertools
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ale import layout
from ale.data.sources import anchor_spec
from ale.defaults import DEFAULT_TOOLS_IMAGE
from ale.documents import load_document
from ale.plan import AgentSpec, Limits, RunPlan
from ale.runs.screening import NO_DATA, NO_VARIANT, Skipped, no_data_reason, screen_task
from ale.sandbox.policy import IsolationPolicy
from ale.tasks.card import load_card, policy_for_card
from ale.tasks.errors import TaskError
from ale.tasks.process import TaskCallFailed, TaskProcessError, inspect_task_sync

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_GLOB_CHARS = set("*?[")


AGENT_PATH_KEYS = ("script", "prompt_file")


class ExperimentError(ValueError):
    """The experiment file is unreadable or invalid; the message says where and why."""


# -- the file's schema ---------------------------------------------------------


class AgentEntry(BaseModel):
    """One agent configuration, or a family of them when ``matrix`` is given.

    ``matrix`` maps config keys to lists of values; every combination becomes its
    own agent whose config is ``config`` updated with that combination and whose
    label is ``<label or name>[key=value,...]``.
    """

    model_config = ConfigDict(extra="forbid")
    name: str
    label: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    allowlist: tuple[str, ...] | None = None
    matrix: dict[str, list[Any]] | None = None

    @field_validator("matrix")
    @classmethod
    def _non_empty(cls, v: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        if v is not None:
            for key, values in v.items():
                if not values:
                    raise ValueError(f"matrix key {key!r} has no values")
        return v

    def expand(self) -> list[AgentSpec]:
        base = self.label or self.name
        extra = {} if self.allowlist is None else {"allowlist": tuple(self.allowlist)}
        if not self.matrix:
            return [AgentSpec(name=self.name, label=base, config=dict(self.config), **extra)]
        keys = list(self.matrix)
        specs = []
        for combo in itertools.product(*(self.matrix[k] for k in keys)):
            chosen = dict(zip(keys, combo, strict=True))
            suffix = ",".join(f"{k}={_scalar(v)}" for k, v in chosen.items())
            specs.append(
                AgentSpec(
                    name=self.name,
                    label=f"{base}[{suffix}]",
                    config={**self.config, **chosen},
                    **extra,
                )
            )
        return specs


def _scalar(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


class TaskEntry(BaseModel):
    """Exactly one of ``list`` (a task-list file), ``glob`` (task folders), ``path``."""

    model_config = ConfigDict(extra="forbid")
    list: str | None = None
    glob: str | None = None
    path: str | None = None
    variants: tuple[int, ...] | Literal["all"] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TaskEntry:
        given = [k for k in ("list", "glob", "path") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "a task entry needs exactly one of 'list', 'glob' or 'path'"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if isinstance(self.variants, tuple):
            if not self.variants:
                raise ValueError("variants must not be empty (omit it for variant 0)")
            if any(v < 0 for v in self.variants):
                raise ValueError(f"variants must be >= 0, got {list(self.variants)}")
        return self


def _task_entry(v: Any) -> Any:
    """A bare string is a list file (``.txt``/``.yaml``), a glob, or a task path."""
    if isinstance(v, str):
        if v.endswith((".txt", ".yaml", ".yml")):
            return {"list": v}
        if _GLOB_CHARS & set(v):
            return {"glob": v}
        return {"path": v}
    return v


class EnvironmentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: Literal["docker", "qemu"] = "docker"
    # qemu: an ALE vm.snapshot (cpu-free, gpu-license, ...) → its base disk (a .qcow2
    # path, or a folder or gs://, s3://, hf:// URL in ALE's published layout:
    # ale.data.vm_disks). A task whose snapshot is not a Linux one runs only when mapped.
    vm_images: dict[str, str] = Field(default_factory=dict)
    policy: str | dict[str, Any] | None = None  # a JSON/YAML file, or the policy inline
    # The sandboxes' OCI runtime (runc, or runsc: gVisor); overrides the policy's.
    runtime: str | None = None
    data_source: str | None = None
    image: str = DEFAULT_TOOLS_IMAGE
    signing_key: str | None = None
    judge_env: tuple[str, ...] | None = None  # ALE_JUDGE_<NAME> names evaluate() gets (None: all)
    # The tasks' software (docs/software.md): built into environment images before the
    # runs; an overlay file adds needs the task files do not state.
    provision_software: bool = True
    software_overlay: str | None = None
    # Where the attempts run: `local` (this process, one engine) or `ray:HOST:PORT`
    # (a Ray cluster's GCS address; `ale exp run --cluster` and ALE_CLUSTER override).
    # Not part of the content hash: where a run executes does not change what it is.
    cluster: str = "local"

    @field_validator("runtime")
    @classmethod
    def _runtime_known(cls, v: str | None) -> str | None:
        from ale.sandbox.runtimes import check_known

        return None if v is None else check_known(v)

    @field_validator("cluster")
    @classmethod
    def _cluster_ok(cls, v: str) -> str:
        text = v.strip()
        host, sep, port = text[4:].rpartition(":") if text.startswith("ray:") else ("", "", "")
        if text != "local" and not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"use 'local' or 'ray:HOST:PORT' (a Ray cluster's GCS address), got {v!r}")
        return text


class RetrySpec(BaseModel):
    """Infrastructure errors only; agent failures and invalid runs are final."""

    model_config = ConfigDict(extra="forbid")
    max_attempts: int = Field(3, ge=1, le=20)
    backoff_initial_s: float = Field(2.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)


class TierSpec(BaseModel):
    """Difficulty tiers by the best agent's mean score on a task (valid runs only)."""

    model_config = ConfigDict(extra="forbid")
    near_term_min: float = Field(0.8, ge=0, le=1)
    last_exam_below: float = Field(0.2, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> TierSpec:
        if self.last_exam_below > self.near_term_min:
            raise ValueError(
                f"last_exam_below ({self.last_exam_below}) must be <= near_term_min ({self.near_term_min})"
            )
        return self


class ReportSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pass_threshold: float = Field(0.5, ge=0, le=1)
    bootstrap_samples: int = Field(2000, ge=100, le=100_000)
    seed: int = 0
    tiers: TierSpec = Field(default_factory=TierSpec)


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    agents: list[AgentEntry] = Field(min_length=1)
    tasks: list[TaskEntry] = Field(min_length=1)
    tasks_root: str | None = None
    repeats: int = Field(1, ge=1, le=1000)
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    limits: Limits = Field(default_factory=Limits)
    concurrency: int = Field(2, ge=1, le=256)
    retry: RetrySpec = Field(default_factory=RetrySpec)
    report: ReportSpec = Field(default_factory=ReportSpec)
    output: str | None = None
    # Where the file lives (set by load_experiment; not part of the YAML).
    source: str | None = Field(default=None, exclude=True)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"name {v!r} must be 1-100 characters of letters, digits, '_', '.', '-' "
                "(it labels containers and names folders)"
            )
        return v

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks_list(cls, v: Any) -> Any:
        if isinstance(v, str | dict):
            v = [v]
        if isinstance(v, list):
            return [_task_entry(x) for x in v]
        return v

    @model_validator(mode="after")
    def _unique_labels(self) -> Experiment:
        seen: dict[str, int] = {}
        for i, entry in enumerate(self.agents):
            for spec in entry.expand():
                if spec.display in seen:
                    raise ValueError(
                        f"agents[{i}] and agents[{seen[spec.display]}] both produce the label "
                        f"{spec.display!r}; give them distinct 'label's"
                    )
                seen[spec.display] = i
        return self

    # -- resolved paths ------------------------------------------------------
    @property
    def base_dir(self) -> Path:
        return Path(self.source).resolve().parent if self.source else Path.cwd()

    def resolve(self, p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else Path(os.path.normpath(self.base_dir / path))

    @property
    def tasks_root_dir(self) -> Path:
        return self.resolve(self.tasks_root) if self.tasks_root else self.base_dir

    @property
    def output_dir(self) -> Path:
        return self.resolve(self.output) if self.output else self.base_dir / "results" / self.name

    def agent_specs(self) -> list[AgentSpec]:
        """The agents, with file paths in their configs (`script`, `prompt_file`)
        resolved against this file's folder, as every other path here is."""
        return [spec for entry in self.agents for spec in self.resolved_specs(entry)]

    def resolved_specs(self, entry: AgentEntry) -> list[AgentSpec]:
        """One entry's agents, paths in their configs resolved (see agent_specs)."""
        specs = []
        for spec in entry.expand():
            cfg = dict(spec.config)
            for key in AGENT_PATH_KEYS:
                if isinstance(cfg.get(key), str):
                    cfg[key] = str(self.resolve(cfg[key]))
            specs.append(spec.model_copy(update={"config": cfg}))
        return specs

    def isolation_policy(self) -> IsolationPolicy:
        """The environment's policy, under its `runtime` when it names one."""
        return self._stated_policy().with_runtime(self.environment.runtime)

    def _stated_policy(self) -> IsolationPolicy:
        pol = self.environment.policy
        if pol is None:
            return IsolationPolicy()
        if isinstance(pol, str):
            path = self.resolve(pol)
            try:
                return IsolationPolicy.load(path)
            except ValidationError as e:
                raise ExperimentError(_format_errors(e, IsolationPolicy, f"{path}: ", ())) from e
            except ValueError as e:
                raise ExperimentError(f"environment.policy: {e}") from e
        try:
            return IsolationPolicy.model_validate(pol)
        except ValidationError as e:
            raise ExperimentError(
                _format_errors(e, IsolationPolicy, self._where(), ("environment", "policy"))
            ) from e

    def _where(self) -> str:
        return f"{self.source}: " if self.source else ""


# -- loading and error messages ---------------------------------------------


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment file; ExperimentError says what is wrong."""
    p = Path(path)
    data = load_document(p, "experiment file", ExperimentError)
    if not isinstance(data, dict):
        raise ExperimentError(f"{p} must be a mapping at the top level, got {type(data).__name__}")
    if "source" in data:
        raise ExperimentError(f"{p}: 'source' is reserved (it is set to the file's path)")
    try:
        exp = Experiment.model_validate({**data, "source": str(p.resolve())})
    except ValidationError as e:
        raise ExperimentError(_format_errors(e, Experiment, f"{p}: ", ())) from e
    exp.isolation_policy()  # validate the policy now, not at the first run
    return exp


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at ``loc`` (list indices skipped)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = _inner_model(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (list, tuple, Union, UnionType) or origin is not None:
        for arg in get_args(annotation):
            found = _inner_model(arg)
            if found is not None:
                return found
    return None


def _format_errors(
    err: ValidationError, model: type[BaseModel], where: str, prefix: tuple[Any, ...]
) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        full = prefix + loc
        if e["type"] == "extra_forbidden":
            key = str(loc[-1])
            owner = _model_at(model, loc[:-1])
            valid = sorted(owner.model_fields) if owner else []
            valid = [k for k in valid if k != "source"]
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            at = _format_loc(full[:-1])
            lines.append(
                f"{where}unknown key {key!r} in {at}{hint} (valid keys: {', '.join(valid)})"
            )
        else:
            value = e.get("input")
            shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
            lines.append(f"{where}{_format_loc(full)}: {e['msg']}{shown}")
    return "invalid experiment:\n  " + "\n  ".join(lines)


# -- planning ----------------------------------------------------------------


@dataclass(frozen=True)
class PlannedUnit:
    """One (task, variant, agent, repeat); its attempts are runs ``<unit_id>-a<n>``."""

    unit_id: str
    task: str  # the task's path relative to tasks_root (or its folder name)
    variant: int
    agent: str  # the agent's label
    repeat: int
    plan: RunPlan  # attempt 1

    def plan_for(self, attempt: int) -> RunPlan:
        return self.plan.model_copy(update={"run_id": attempt_run_id(self.unit_id, attempt), "attempt": attempt})


def attempt_run_id(unit_id: str, attempt: int) -> str:
    return f"{unit_id}-a{attempt}"


def sanitize(text: str, limit: int = 80) -> str:
    safe = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9_.-]+", "-", text)).strip("-.")
    if len(safe) > limit:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        safe = f"{safe[: limit - 9]}-{digest}"
    return safe or "x"


@dataclass(frozen=True)
class ResolvedTask:
    task: str
    task_dir: Path
    variants: tuple[int, ...]


def read_task_list(path: Path) -> list[TaskEntry]:
    """ALE's ``selected_tasks`` files: ``.txt`` (one task path a line, ``#`` comments,
    variant 0) or ``.yaml`` (a list of ``{path, variants}``)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ExperimentError(f"cannot read task list {path}: {e.strerror or e}") from e
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text) or []
        except yaml.YAMLError as e:
            raise ExperimentError(f"task list {path} is not valid YAML: {e}") from e
        if not isinstance(data, list):
            raise ExperimentError(f"task list {path} must be a YAML list of {{path, variants}}")
        entries = []
        for i, item in enumerate(data):
            try:
                entry = TaskEntry.model_validate(_task_entry(item))
            except ValidationError as e:
                raise ExperimentError(_format_errors(e, TaskEntry, f"{path}: ", (i,))) from e
            if entry.path is None:
                raise ExperimentError(f"{path}: entry [{i}] must be a task 'path'")
            entries.append(entry)
        return entries
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            entries.append(TaskEntry(path=line))
    return entries


def task_variants(task_dir: Path) -> int:
    """How many variants the task's ``load()`` declares (for ``variants: all``)."""

    try:
        return len(inspect_task_sync(task_dir).variants)
    except (TaskError, TaskProcessError, TaskCallFailed) as e:
        raise ExperimentError(f"cannot count the variants of {task_dir}: {e}") from e


def _mentioned_tasks(exp: Experiment) -> dict[Path, tuple[str, tuple[int, ...] | Literal["all"] | None]]:
    """Each task folder the experiment names (by path, glob or list), once (first
    mention wins): its name under tasks_root and the variants asked for."""
    root = exp.tasks_root_dir
    mentioned: dict[Path, tuple[str, tuple[int, ...] | Literal["all"] | None]] = {}

    def add(path_text: str, variants: tuple[int, ...] | Literal["all"] | None, origin: str) -> None:
        p = Path(path_text).expanduser()
        task_dir = (p if p.is_absolute() else root / p).resolve()
        if not (task_dir / "main.py").is_file():
            raise ExperimentError(
                f"{origin}: task {path_text!r} resolves to {task_dir}, which has no main.py "
                f"(task paths resolve against tasks_root = {root})"
            )
        try:
            name = task_dir.relative_to(root.resolve()).as_posix()
        except ValueError:
            name = task_dir.name
        mentioned.setdefault(task_dir, (name, variants))

    for i, entry in enumerate(exp.tasks):
        origin = f"tasks[{i}]"
        if entry.path is not None:
            add(entry.path, entry.variants, origin)
        elif entry.glob is not None:
            pattern = entry.glob if Path(entry.glob).is_absolute() else str(root / entry.glob)
            matches = sorted(
                m for m in globlib.glob(pattern, recursive=True) if (Path(m) / "main.py").is_file()
            )
            if not matches:
                raise ExperimentError(f"{origin}: glob {entry.glob!r} matches no task folder under {root}")
            for m in matches:
                add(m, entry.variants, origin)
        else:
            assert entry.list is not None
            list_path = exp.resolve(entry.list)
            for j, item in enumerate(read_task_list(list_path)):
                assert item.path is not None
                add(item.path, entry.variants or item.variants, f"{list_path} entry {j}")
    return mentioned


def resolve_tasks(exp: Experiment, *, jobs: int = 4, skipped: list[Skipped] | None = None,
                  screen: bool = False, build_envs: bool = False) -> list[ResolvedTask]:
    """The experiment's tasks, in file order, each once (first mention wins).
    ``variants: all`` loads the task to count them, `jobs` tasks at once.

    ``screen`` (planning runs): every task is loaded (``ale.runs.screening``) and
    only the variants that can run are kept; a task that does not load, needs a
    Windows VM, lacks a variant asked for, or needs data no source gives is left
    out and appended to ``skipped``; ``build_envs`` builds the task trees' declared
    environments first (what the runs would do), so a task needing one loads."""
    mentioned = _mentioned_tasks(exp)
    if not screen:
        counting = [d for d, (_, variants) in mentioned.items() if variants == "all"]
        with ThreadPoolExecutor(max(1, min(jobs, len(counting) or 1))) as pool:
            counts = dict(zip(counting, pool.map(task_variants, counting), strict=True))
        return [ResolvedTask(name, task_dir, tuple(sorted(set(
                    tuple(range(counts[task_dir])) if variants == "all" else variants or (0,)))))
                for task_dir, (name, variants) in mentioned.items()]
    dirs = list(mentioned)
    provider = exp.environment.provider
    mapped = tuple(exp.environment.vm_images) if provider == "qemu" else ()
    with ThreadPoolExecutor(max(1, min(jobs, len(dirs) or 1))) as pool:
        screens = dict(zip(dirs,
                           pool.map(lambda d: screen_task(d, provider, build_env=build_envs, vm_images=mapped), dirs),
                           strict=True))
    skipped = skipped if skipped is not None else []
    out = []
    for task_dir, (name, variants) in mentioned.items():
        sc = screens[task_dir]
        if sc.status != "ok":
            skipped.append(Skipped(name, str(task_dir), None, sc.status, sc.reason or ""))
            continue
        vs = tuple(range(len(sc.variants))) if variants == "all" else variants or (0,)
        data = exp.environment.data_source or sc.data_source
        keep = []
        for v in sorted(set(vs)):
            if v >= len(sc.variants):
                skipped.append(Skipped(name, str(task_dir), v, NO_VARIANT,
                                       f"variant {v} does not exist: the task has {len(sc.variants)} "
                                       f"(0..{len(sc.variants) - 1})"))
            elif sc.variants[v].unsupported:
                skipped.append(Skipped(name, str(task_dir), v, "unsupported", str(sc.variants[v].unsupported)))
            elif sc.variants[v].needs_data and not data:
                skipped.append(Skipped(name, str(task_dir), v, NO_DATA,
                                       no_data_reason(sc.variants[v], "environment.data_source")))
            else:
                keep.append(v)
        if keep:
            out.append(ResolvedTask(name, task_dir, tuple(keep)))
    return out


def check_agents(exp: Experiment) -> None:
    """Every agent and configuration the file names, checked before any run:
    ExperimentError naming ``agents[i]`` (with a "did you mean")."""
    from ale.agents.errors import AgentConfigError
    from ale.agents.registry import check_agent

    for i, entry in enumerate(exp.agents):
        for spec in exp.resolved_specs(entry):
            try:
                check_agent(spec)
            except AgentConfigError as e:
                raise ExperimentError(f"{exp._where()}agents[{i}] ({spec.display}): {e}") from e


def plan_experiment(exp: Experiment, *, build_envs: bool = False) -> tuple[list[PlannedUnit], list[Skipped]]:
    """The agents checked (``check_agents``), then ``plan_units`` and what was left
    out of it and why (``ale.runs.screening``): what ``ale exp run`` plans."""
    check_agents(exp)
    skipped: list[Skipped] = []
    return plan_units(exp, skipped=skipped, build_envs=build_envs), skipped


def plan_units(exp: Experiment, *, skipped: list[Skipped] | None = None, build_envs: bool = False) -> list[PlannedUnit]:
    """Every unit of the experiment that can run, deterministically ordered and
    named; what cannot is appended to ``skipped``."""
    policy = exp.isolation_policy()
    env = exp.environment
    # Relative to the experiment file's folder, like its other paths (a card's own spec: its task's).
    data_source = anchor_spec(env.data_source, exp.base_dir) if env.data_source else None
    runs_dir = str(exp.output_dir / layout.RUNS_DIR)
    units: list[PlannedUnit] = []
    seen: set[str] = set()
    tasks = resolve_tasks(exp, skipped=skipped, screen=True, build_envs=build_envs)
    cards = {t.task_dir: load_card(t.task_dir) for t in tasks}
    policies = {d: policy_for_card(policy, card)[0] for d, card in cards.items()}
    vm_images = {d: env.vm_images.get(card.snapshot or "") for d, card in cards.items()} \
        if env.provider == "qemu" else {}
    for task in tasks:
        for variant in task.variants:
            for agent in exp.agent_specs():
                for repeat in range(exp.repeats):
                    unit_id = sanitize(f"{task.task}-v{variant}-{agent.display}-r{repeat}", 120)
                    if unit_id in seen:
                        raise ExperimentError(
                            f"two runs share the id {unit_id!r} after sanitising; rename a task or label"
                        )
                    seen.add(unit_id)
                    plan = RunPlan(
                        run_id=attempt_run_id(unit_id, 1),
                        task_dir=str(task.task_dir),
                        variant=variant,
                        agent=agent,
                        data_source=data_source,
                        image=env.image,
                        policy=policies[task.task_dir],
                        limits=exp.limits,
                        runs_dir=runs_dir,
                        experiment=exp.name,
                        attempt=1,
                        signing_key=env.signing_key,
                        provider=env.provider,
                        vm_image=vm_images.get(task.task_dir),
                        judge_env=env.judge_env,
                        provision_software=env.provision_software,
                        software_overlay=str(exp.resolve(env.software_overlay)) if env.software_overlay else None,
                    )
                    units.append(PlannedUnit(unit_id, task.task, variant, agent.display, repeat, plan))
    return units


def plan_runs(exp: Experiment) -> list[RunPlan]:
    """The first attempt of every unit (see ``plan_units`` for the unit metadata)."""
    return [u.plan for u in plan_units(exp)]


def content_hash(exp: Experiment, units: list[PlannedUnit] | None = None) -> str:
    """What decides the runs: every planned RunPlan (paths, agents, policy, limits).

    Concurrency, retry policy, report options and the output folder are left
    out: changing them does not change what a run is.
    """
    units = plan_units(exp) if units is None else units
    h = hashlib.sha256()
    h.update(exp.name.encode())
    for u in units:
        h.update(b"\0" + u.plan.model_dump_json(exclude={"runs_dir"}).encode())
    return h.hexdigest()
