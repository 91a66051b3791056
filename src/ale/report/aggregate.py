"""Aggregate an experiment's results: means with bootstrap intervals, pass rates,
pass@k, per-task scores, counts by status, and difficulty tiers.

Definitions (docs/experiments.md repeats them for readers of a report):

- Only the **final attempt** of each unit (task, variant, agent, repeat) enters
  a report; earlier attempts (infrastructure errors that were retried) are counted
  in ``attempts`` only.
- **Headline** numbers (an agent's mean, interval, pass rate, pass@k) admit a run
  by ``ale.status.headline_score``: a valid score as it is, and a run found
  invalid *after the agent started* (``invalid_attribution`` ``after_agent_start``:
  possibly the candidate's doing) as **0**, flagged for review in
  ``flagged_runs``. Invalid runs charged to the harness (``before_agent``) or to the
  controller's configuration, grading failures, infrastructure errors and runs
  without a score are left out.
- **Valid-only** numbers (``valid_mean`` beside the headline, and the difficulty
  tiers) admit a run only if ``ale.status.counts_toward_score`` says so: no
  invalid run of any kind.
- An **item** is one task variant, named ``<task>@v<variant>``.
- An agent's **item score** is the mean of its admitted runs on that item (over
  repeats). Its **mean** is the mean of its item scores (each item weighs the
  same, however many repeats it had).
- The **95% interval** is a percentile bootstrap over items: ``samples`` resamples
  of the agent's items with replacement (numpy ``default_rng(seed)``, seed 0 by
  default, so a report is reproducible), the 2.5th and 97.5th percentiles of the
  resampled means. With one item the interval is that item's score.
- **Pass rate** at ``threshold`` (default 0.5: a task counts as passed when at
  least half of its graded checks pass): per item, the share of admitted runs
  scoring ``>= threshold``; averaged over items.
- **pass@k** (only when some item has at least two admitted runs): per item with
  ``n`` admitted runs of which ``c`` pass, the unbiased estimator
  ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021), averaged over the items with
  ``n >= k``; reported for k = 1 .. the largest n.
- **Cost**: each run's ``extra.billing`` (its gateway record's re-derived usage:
  requests, input, output and cached input tokens, and US dollars where priced),
  summed per agent (``AgentSummary.usage``) and per task and agent
  (``usage_by_task``) over final attempts, and over every attempt (``usage_all_attempts``:
  retried attempts spent too). ``ale verify EXP`` re-derives these sums from runs
  whose billing it checked against their records.
- **Model failures**: a run the model's provider ended (``model_failure`` the
  provider's or the operator's: ``infrastructure_error``) is left out of the headline
  and counted per class in ``AgentSummary.model_failures`` and ``counts_by_kind``
  (``infrastructure_error/<class>``); the agent's own (context length, refusal) count
  for the agent as its run does.
- **Tiers** by the best agent's item score (valid runs only): ``near-term`` if
  ``>= near_term_min`` (0.8), ``last-exam`` if ``< last_exam_below`` (0.2),
  ``full-spectrum`` in between; items with no admitted run are ``unclassified``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ale import layout
from ale.result import RunResult, reason_line
from ale.runs.experiment import ReportSpec, TierSpec
from ale.runs.store import UnitInfo, iter_results, read_units, unit_of
from ale.status import (
    AgentLimit,
    InvalidAttribution,
    ModelFailure,
    RunStatus,
    counts_toward_score,
    headline_score,
    is_charged,
)

TIERS = ("near-term", "full-spectrum", "last-exam")
COUNTING_POLICY = (
    "Headline means, pass rates and pass@k count every run an agent started: a run found invalid after "
    "the agent started (possibly the candidate's doing), and a run whose grader failed again and again on "
    "the candidate's signed deliverables, count as 0 and are flagged for review. Runs invalid before the "
    "agent started (the harness could not prove the seal; retried) or because of the controller's "
    "configuration, grading failures the harness can show were its own (the grading environment; retried) "
    "and infrastructure errors are left out. The valid-only mean and the difficulty tiers use valid runs alone."
)
UNCLASSIFIED = "unclassified"


class RunRow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str
    unit_id: str
    item: str
    task: str
    variant: int
    agent: str
    repeat: int
    attempt: int
    status: RunStatus
    score: float | None
    counted: bool  # a valid score (valid-only numbers, tiers)
    headline: float | None = None  # the run's value in the headline numbers (None: left out)
    attribution: InvalidAttribution | None = None
    error: str | None = None
    path: str | None = None  # the run folder, relative to the experiment folder
    trajectory: str | None = None  # trajectory.json, relative to the experiment folder
    warnings: list[str] = Field(default_factory=list)  # result.extra["warnings"]: counted, worth a look
    environment: str | None = None  # the image the run's sandboxes started from (result.extra["environment"])
    model_failure: ModelFailure | None = None  # result.model_failure: the model call that ended the run, named
    agent_limit: AgentLimit | None = None  # result.agent_limit: the limit that stopped the agent
    usage: dict[str, float | int] = Field(default_factory=dict)  # result.extra["billing"]["total"]
    # A run resumed from an interrupted attempt's record (result.resumed): from where,
    # turns replayed, where it diverged. Absent (not null) for every other run.
    resumed: dict[str, Any] | None = Field(None, exclude_if=lambda v: v is None)
    _reason: str | None = PrivateAttr(default=None)  # from the result (its violations too); never serialised

    @property
    def reason(self) -> str | None:
        """Why the run did not score, in one line (ale.result.reason_line); None when scored."""
        return self._reason or reason_line(self)


class AgentSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str
    runs: int  # final attempts
    counted: int  # admitted runs
    items: int  # items with at least one admitted run
    mean: float | None  # headline: invalid runs after the agent started count as 0
    ci_low: float | None
    ci_high: float | None
    pass_rate: float | None
    pass_at_k: dict[int, float] = Field(default_factory=dict)
    statuses: dict[str, int] = Field(default_factory=dict)
    valid_mean: float | None = None  # valid runs only
    flagged: int = 0  # runs invalid after the agent started (counted as 0 above)
    usage: dict[str, float | int] = Field(default_factory=dict)  # summed billing of its final attempts
    model_failures: dict[str, int] = Field(default_factory=dict)  # final attempts by named model failure


class AgentItemScore(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mean: float | None  # headline; None: no admitted run
    scores: list[float]  # headline scores, by repeat
    runs: int  # final attempts, admitted or not
    valid_mean: float | None = None  # valid runs only (what the tiers use)


class ItemRow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item: str
    task: str
    variant: int
    best: float | None
    tier: str
    agents: dict[str, AgentItemScore]


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")
    experiment: str | None
    generated_at: datetime
    pass_threshold: float
    bootstrap_samples: int
    seed: int
    confidence: float = 0.95
    tier_rules: TierSpec
    total_runs: int
    attempts: int
    counts_by_status: dict[str, int]
    agents: list[AgentSummary]
    items: list[ItemRow]
    tiers: dict[str, list[str]]
    invalid_runs: list[RunRow]
    runs: list[RunRow]
    flagged_runs: list[RunRow] = Field(default_factory=list)  # charged to the candidate (counted as 0): review them
    # Each kind of run the policy treats apart: "<status>" or "<status>/<attribution>" -> runs.
    counts_by_kind: dict[str, int] = Field(default_factory=dict)
    # runs whose result carries warnings (e.g. deliverables cut at a limit)
    warned_runs: list[RunRow] = Field(default_factory=list)
    # task -> agent -> summed billing
    usage_by_task: dict[str, dict[str, dict[str, float | int]]] = Field(default_factory=dict)
    # every attempt's billing, retried ones too
    usage_all_attempts: dict[str, float | int] = Field(default_factory=dict)
    # Resumed runs: how many, turns replayed, how many diverged (absent when none).
    resumed: dict[str, int] | None = Field(None, exclude_if=lambda v: v is None)
    counting_policy: str = COUNTING_POLICY


def item_name(task: str, variant: int) -> str:
    return f"{task}@v{variant}"


def bootstrap_ci(
    values: list[float], *, samples: int, seed: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap of the mean of ``values`` (resampled with replacement)."""
    if not values:
        raise ValueError("bootstrap of no values")
    arr = np.asarray(values, dtype=float)
    if len(arr) == 1:
        return float(arr[0]), float(arr[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(arr), size=(samples, len(arr)))
    means = arr[idx].mean(axis=1)
    alpha = (1 - confidence) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one item: n samples, c of them correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def tier_of(best: float | None, rules: TierSpec) -> str:
    if best is None:
        return UNCLASSIFIED
    if best >= rules.near_term_min:
        return "near-term"
    if best < rules.last_exam_below:
        return "last-exam"
    return "full-spectrum"


def run_usage(r: RunResult) -> dict[str, float | int]:
    """A run's billed total (``extra.billing.total``), numbers only."""
    billing = (r.extra or {}).get("billing")
    total = billing.get("total") if isinstance(billing, dict) else None
    return {k: v for k, v in (total or {}).items() if isinstance(v, int | float) and not isinstance(v, bool)}


def source_usage(r: RunResult) -> dict[str, float | int]:
    """What the interrupted attempt a resumed run continued had spent (``result.resumed.source_usage``,
    its record's upstream answers): that attempt left no result of its own; its replayed turns are not billed again."""
    resumed = r.resumed
    u = resumed.get("source_usage") if isinstance(resumed, dict) else None
    return {k: v for k, v in (u or {}).items() if isinstance(v, int | float) and not isinstance(v, bool)}


def resumed_row(r: RunResult) -> dict[str, Any] | None:
    resumed = r.resumed
    if not isinstance(resumed, dict):
        return None
    return {k: resumed.get(k) for k in ("source_run_id", "replayed_turns", "diverged_at", "live_from", "divergence")}


def add_usage(into: dict[str, float | int], u: dict[str, float | int]) -> None:
    for k, v in u.items():
        into[k] = round(into.get(k, 0) + v, 8) if isinstance(v, float) or isinstance(into.get(k), float) \
            else into.get(k, 0) + v


def _final_attempts(results: Iterable[RunResult], units: dict[str, UnitInfo],
                    spent: dict[str, float | int] | None = None) -> tuple[list[tuple[RunResult, UnitInfo]], int]:
    latest: dict[str, tuple[RunResult, UnitInfo]] = {}
    attempts = 0
    for r in results:
        attempts += 1
        if spent is not None:
            add_usage(spent, run_usage(r))
            add_usage(spent, source_usage(r))  # an interrupted attempt a resume continued: its own spend
        u = unit_of(r, units)
        if u.unit_id not in latest or r.attempt > latest[u.unit_id][0].attempt:
            latest[u.unit_id] = (r, u)
    return sorted(latest.values(), key=lambda x: x[0].run_id), attempts


def aggregate(
    results: Iterable[RunResult],
    *,
    units: dict[str, UnitInfo] | None = None,
    options: ReportSpec | None = None,
    run_paths: dict[str, str] | None = None,
    experiment: str | None = None,
) -> Report:
    """The report over ``results`` (every attempt; only each unit's last counts).

    ``units`` maps unit ids to their task/agent/repeat (``units.json``); without
    it they are read from the results. ``run_paths`` maps run ids to their folder
    relative to the experiment folder (for links).
    """
    opts = options or ReportSpec()
    units = units or {}
    run_paths = run_paths or {}
    spent: dict[str, float | int] = {}
    finals, attempts = _final_attempts(results, units, spent)

    rows: list[RunRow] = []
    for r, u in finals:
        counted = counts_toward_score(r.status, r.score)
        attribution = r.invalid_attribution
        path = run_paths.get(r.run_id)
        trajectory = f"{path}/{layout.TRAJECTORY}" if path else None
        row = RunRow(
                run_id=r.run_id,
                unit_id=u.unit_id,
                item=item_name(u.task, u.variant),
                task=u.task,
                variant=u.variant,
                agent=u.agent,
                repeat=u.repeat,
                attempt=r.attempt,
                status=RunStatus(r.status),
                score=r.score,
                counted=counted,
                headline=headline_score(r.status, r.score, attribution),
                attribution=attribution,
                error=r.error,
                path=path,
                trajectory=trajectory,
                warnings=[str(w) for w in (r.extra or {}).get("warnings", [])],
                environment=((r.extra or {}).get("environment") or {}).get("image"),
                model_failure=r.model_failure,
                agent_limit=r.agent_limit,
                usage=run_usage(r),
                resumed=resumed_row(r),
            )
        row._reason = reason_line(r)
        rows.append(row)

    counts: dict[str, int] = {s.value: 0 for s in RunStatus}
    for row in rows:
        counts[row.status.value] += 1

    agents = sorted({row.agent for row in rows})
    item_keys: dict[str, tuple[str, int]] = {}
    for row in rows:
        item_keys.setdefault(row.item, (row.task, row.variant))
    items_sorted = sorted(item_keys)

    # (agent, item) -> headline scores, valid scores, and run counts
    scores: dict[tuple[str, str], list[float]] = defaultdict(list)
    valid: dict[tuple[str, str], list[float]] = defaultdict(list)
    run_counts: dict[tuple[str, str], int] = defaultdict(int)
    for row in sorted(rows, key=lambda x: (x.agent, x.item, x.repeat)):
        run_counts[(row.agent, row.item)] += 1
        if row.headline is not None:
            scores[(row.agent, row.item)].append(row.headline)
        if row.counted:
            assert row.score is not None
            valid[(row.agent, row.item)].append(row.score)

    summaries: list[AgentSummary] = []
    for agent in agents:
        agent_rows = [row for row in rows if row.agent == agent]
        item_means = []
        pass_fracs = []
        per_item_nc: list[tuple[int, int]] = []
        for item in items_sorted:
            s = scores.get((agent, item), [])
            if not s:
                continue
            item_means.append(sum(s) / len(s))
            c = sum(1 for v in s if v >= opts.pass_threshold)
            pass_fracs.append(c / len(s))
            per_item_nc.append((len(s), c))
        statuses: dict[str, int] = defaultdict(int)
        usage: dict[str, float | int] = {}
        for row in agent_rows:
            statuses[row.status.value] += 1
            add_usage(usage, row.usage)
        valid_means = [sum(v) / len(v) for item in items_sorted if (v := valid.get((agent, item)))]
        mean = ci_low = ci_high = pass_rate = None
        pak: dict[int, float] = {}
        if item_means:
            mean = sum(item_means) / len(item_means)
            ci_low, ci_high = bootstrap_ci(item_means, samples=opts.bootstrap_samples, seed=opts.seed)
            pass_rate = sum(pass_fracs) / len(pass_fracs)
            max_n = max(n for n, _ in per_item_nc)
            if max_n >= 2:
                for k in range(1, max_n + 1):
                    vals = [pass_at_k(n, c, k) for n, c in per_item_nc if n >= k]
                    pak[k] = sum(vals) / len(vals)
        summaries.append(
            AgentSummary(
                agent=agent,
                runs=len(agent_rows),
                counted=sum(1 for row in agent_rows if row.counted),
                items=len(item_means),
                mean=mean,
                ci_low=ci_low,
                ci_high=ci_high,
                pass_rate=pass_rate,
                pass_at_k=pak,
                statuses=dict(statuses),
                valid_mean=(sum(valid_means) / len(valid_means)) if valid_means else None,
                flagged=sum(1 for row in agent_rows if _flagged(row)),
                usage=usage,
                model_failures=dict(sorted(Counter(row.model_failure.value for row in agent_rows
                                                   if row.model_failure).items())),
            )
        )

    item_rows: list[ItemRow] = []
    tiers: dict[str, list[str]] = {t: [] for t in (*TIERS, UNCLASSIFIED)}
    for item in items_sorted:
        task, variant = item_keys[item]
        per_agent: dict[str, AgentItemScore] = {}
        for agent in agents:
            s = scores.get((agent, item), [])
            v = valid.get((agent, item), [])
            n = run_counts.get((agent, item), 0)
            if n == 0:
                continue
            per_agent[agent] = AgentItemScore(
                mean=(sum(s) / len(s)) if s else None, scores=s, runs=n, valid_mean=(sum(v) / len(v)) if v else None
            )
        means = [a.valid_mean for a in per_agent.values() if a.valid_mean is not None]
        best = max(means) if means else None
        tier = tier_of(best, opts.tiers)
        tiers[tier].append(item)
        item_rows.append(ItemRow(item=item, task=task, variant=variant, best=best, tier=tier, agents=per_agent))

    return Report(
        experiment=experiment,
        generated_at=datetime.now(UTC),
        pass_threshold=opts.pass_threshold,
        bootstrap_samples=opts.bootstrap_samples,
        seed=opts.seed,
        tier_rules=opts.tiers,
        total_runs=len(rows),
        attempts=attempts,
        counts_by_status=counts,
        agents=summaries,
        items=item_rows,
        tiers=tiers,
        invalid_runs=[row for row in rows if row.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT],
        runs=rows,
        flagged_runs=[row for row in rows if _flagged(row)],
        counts_by_kind=dict(sorted(Counter(_kind(row) for row in rows).items())),
        warned_runs=[row for row in rows if row.warnings],
        usage_by_task=_usage_by_task(rows),
        usage_all_attempts=spent,
        resumed=_resumed_counts(rows),
    )


def _resumed_counts(rows: list[RunRow]) -> dict[str, int] | None:
    resumed = [row.resumed for row in rows if row.resumed]
    if not resumed:
        return None
    return {"runs": len(resumed), "replayed_turns": sum(int(r.get("replayed_turns") or 0) for r in resumed),
            "diverged": sum(1 for r in resumed if r.get("diverged_at"))}


def _usage_by_task(rows: list[RunRow]) -> dict[str, dict[str, dict[str, float | int]]]:
    out: dict[str, dict[str, dict[str, float | int]]] = {}
    for row in sorted(rows, key=lambda x: (x.task, x.agent, x.run_id)):
        if row.usage:
            add_usage(out.setdefault(row.task, {}).setdefault(row.agent, {}), row.usage)
    return out


def _flagged(row: RunRow) -> bool:
    return is_charged(row.status, row.attribution)


def _kind(row: RunRow) -> str:
    if row.status is RunStatus.INFRASTRUCTURE_ERROR and row.model_failure is not None:
        return f"{row.status.value}/{row.model_failure.value}"  # the model's provider ended it: counted apart
    return f"{row.status.value}/{row.attribution}" if row.attribution else row.status.value


def load_report(exp_dir: str | Path, options: ReportSpec | None = None) -> Report:
    """The report of an experiment folder, from its run folders (the truth).

    Report options come from ``options``, else from the experiment recorded in
    ``experiment.json``, else the defaults.
    """
    import json

    root = Path(exp_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such experiment folder")
    name = None
    record = root / layout.EXPERIMENT_RECORD
    if record.is_file():
        data = json.loads(record.read_text())
        name = data.get("name")
        if options is None and isinstance(data.get("experiment"), dict):
            rep = data["experiment"].get("report")
            if rep is not None:
                options = ReportSpec.model_validate(rep)
    results = []
    paths = {}
    from ale.runs.regrade import apply_latest_grading

    for run_dir, result in iter_results(root):
        results.append(apply_latest_grading(run_dir, result))  # a regraded run counts with its latest grading
        paths[result.run_id] = run_dir.relative_to(root).as_posix()
    if not results and not (root / layout.RUNS_DIR).is_dir():
        raise FileNotFoundError(f"{root}: not an experiment folder (no runs/ inside)")
    return aggregate(results, units=read_units(root), options=options, run_paths=paths, experiment=name)
