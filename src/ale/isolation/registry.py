"""What a seal rule is, when it runs, and the one registry every rule is listed in.

A rule is one small named function that reads one kind of evidence (a source:
the `docker inspect` capture, the two captures together, the probes' output,
the workspace listing) at some moments of the sandbox's life, and returns its
verdict ``(ok, observed, detail)``. The `@rule` decorator registers it under the
id of the `Check` it produces (the id old run folders and `ale verify` compare),
with the value it expects and the moments it applies to. Its docstring says what
it checks (first paragraph) and why (the rest): `docs/isolation.md` is generated
from it (`python -m ale.isolation.rules --markdown`).

Evidence that lacks what a rule reads makes its check *unknown* (``ok=None``),
and unknown counts as a failure: each source says which exceptions mean "the
evidence lacks it" and how the check names that.

The rules live in `inspect_rules`, `probe_rules` and `workspace_rules`; `rules`
lists them all and judges a moment. A VM's rules (`vm_rules`) read their own sources
(`VM_SOURCES`) and are judged by `vm_rules.judge_vm_state`.
"""

from __future__ import annotations

import inspect as _pyinspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

# The sandbox's moments: created and never started, running, exited. The one word
# for them (`ale.result.Phase` is the run's lifecycle, a different thing).
Moment = Literal["before", "running", "after"]
MOMENTS: tuple[Moment, ...] = ("before", "running", "after")

# How a planned value is compared. "exact": the sandbox is the one planned (a run's
# own verification: the harness created the container itself, so any difference is
# the engine doing something else). "at_least": the sandbox is at least as strict as
# planned (`ale verify-container`, a container someone else created): a rule that
# orders its field passes a stricter value and says how it differs (`Stricter`).
Fit = Literal["exact", "at_least"]
FITS: tuple[Fit, ...] = ("exact", "at_least")


def as_moment(value: str) -> Moment:
    """A moment from its name; anything else is a programming error."""
    for m in MOMENTS:
        if value == m:
            return m
    raise ValueError(f"not a moment: {value!r} (one of {', '.join(MOMENTS)})")


@dataclass
class Check:
    """One verified aspect of the container. ``ok=None`` means unknown: a failure."""

    id: str
    ok: bool | None
    expected: Any
    observed: Any
    detail: str = ""
    # How a passing sandbox is stricter than planned (empty: as planned).
    stricter: str = ""

    def to_dict(self) -> dict[str, Any]:
        # Shallow on purpose: the values are JSON data read from inspect or probes,
        # and dataclasses.asdict's deep copy is the costliest step of a run's checks.
        doc = {"id": self.id, "ok": self.ok, "expected": self.expected, "observed": self.observed,
               "detail": self.detail}
        if self.stricter:  # only then: a check as planned keeps the shape old evidence has
            doc["stricter"] = self.stricter
        return doc

    @property
    def passed(self) -> bool:
        return self.ok is True


def failures(checks: Iterable[Check]) -> list[Check]:
    """Checks that did not pass (failed or unknown)."""
    return [c for c in checks if c.ok is not True]


# A rule's verdict: passed (None: unknown), what it observed, and a human detail.
Verdict = tuple[bool | None, Any, str]


class Stricter(str):
    """A verdict's detail saying how a passing sandbox is stricter than planned: the
    check records it (`Check.stricter`) and `ale verify-container` reports it."""


def stricter_notes(checks: Iterable[Check]) -> list[str]:
    """One line per passing check whose sandbox is stricter than planned."""
    return [f"{c.id}: {c.stricter}" for c in checks if c.ok is True and c.stricter]


def limit_fits(fit: Fit, observed: float, planned: float, *, what: str,
               show: Callable[[float], str] = lambda v: f"{v:g}", tolerance: float = 0.0) -> tuple[bool, str]:
    """A limit where lower is stricter: as planned, or (`fit` "at_least") below it,
    which passes and says so (the detail is then a `Stricter`)."""
    if abs(observed - planned) <= tolerance:
        return True, ""
    if fit == "at_least" and observed < planned:
        return True, Stricter(f"{what} {show(observed)}, below the planned {show(planned)}")
    if observed > planned:
        return False, f"{what} {show(observed)}, above the planned {show(planned)}"
    return False, f"{what} {show(observed)}, below the planned {show(planned)} (a run's own sandbox is the one planned)"


class Missing(Exception):
    """A field a rule reads is absent from the document: its check is unknown."""

    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


@dataclass(frozen=True)
class Source:
    """A kind of evidence the rules read, and how its gaps read as unknown."""

    name: str
    reads: str  # what the evidence is, for the docs
    # (exception types, the detail of the unknown check), tried in order
    unknown: tuple[tuple[tuple[type[Exception], ...], Callable[[Exception], str]], ...]

    def unknown_detail(self, e: Exception) -> str | None:
        for kinds, detail in self.unknown:
            if isinstance(e, kinds):
                return detail(e)
        return None


def _missing_field(e: Exception) -> str:
    return f"missing field {cast(Missing, e).path}"


def _unparsable_value(e: Exception) -> str:
    return f"unparsable value: {type(e).__name__}: {e}"


_DOCUMENT_GAPS: tuple[tuple[tuple[type[Exception], ...], Callable[[Exception], str]], ...] = (
    ((Missing,), _missing_field),
    ((TypeError, ValueError, AttributeError), _unparsable_value),
)
INSPECT = Source("inspect", "the container's `docker inspect` document at that moment", _DOCUMENT_GAPS)
CAPTURES = Source("captures", "the inspect captures at create and after exit, together", _DOCUMENT_GAPS)
PROBES = Source(
    "probes",
    "the probe script's output (run inside the sandbox as the candidate user)",
    (
        ((KeyError,), lambda e: f"missing probe section or field {e.args[0]}"),
        ((ValueError, IndexError, TypeError), lambda e: f"unparsable probe output: {e}"),
    ),
)
WORKSPACE = Source(
    "workspace",
    "the host's listing of the workspace folder (lstat, no link followed)",
    (((Missing,), _missing_field), ((KeyError, TypeError, ValueError, AttributeError), _unparsable_value)),
)
SOURCES: tuple[Source, ...] = (INSPECT, CAPTURES, PROBES, WORKSPACE)
# A VM's evidence (`vm_rules`): what QEMU itself reports at a moment, the two captures
# together, and the probes run in the guest. Judged by `vm_rules.judge_vm_state` and its
# siblings, never by the container's `rules.judge`.
VM_CAPTURE = Source("vm", "what QEMU reports of the running VM (QMP, HMP, /proc/PID) at that moment "
                    "(`ale.sandbox.qemu.capture.capture_vm`)", _DOCUMENT_GAPS)
VM_CAPTURES = Source("vm captures", "the VM captures before and after the agent, together", _DOCUMENT_GAPS)
VM_PROBES = Source("vm probes", "the probe script's output, run in the guest as the candidate user",
                   PROBES.unknown)
VM_SOURCES: tuple[Source, ...] = (VM_CAPTURE, VM_CAPTURES, VM_PROBES)


S = TypeVar("S")


@dataclass(frozen=True)
class Rule:
    """One registered rule: its check id, when it applies, what it expects."""

    id: str  # the Check id; "{moment}" in it stands for the moment judged
    source: Source
    area: str
    moments: tuple[Moment, ...]
    summary: str  # what it checks (the docstring's first paragraph)
    why: str  # why it matters (the rest of the docstring)
    verdict: Callable[[Any], Verdict]  # of the source's subject, which has a ``moment``
    expected_of: Callable[[Any], Any]
    when: Callable[[Any], bool] | None = None
    when_doc: str = ""  # in which case it applies beyond its moments, for the docs

    @property
    def name(self) -> str:
        return self.verdict.__name__

    def ids(self) -> tuple[str, ...]:
        """Every check id this rule can produce."""
        if "{moment}" not in self.id:
            return (self.id,)
        return tuple(self.id.format(moment=m) for m in self.moments)

    def check_id(self, moment: Moment) -> str:
        return self.id.format(moment=moment) if "{moment}" in self.id else self.id

    def applies(self, subject: Any) -> bool:
        """At the subject's moment, with the evidence the subject carries."""
        return subject.moment in self.moments and (self.when is None or bool(self.when(subject)))

    def check(self, subject: Any) -> Check:
        """Run this rule alone on one subject; a gap in the evidence is unknown."""
        cid = self.check_id(subject.moment)
        expected = self.expected_of(subject)
        try:
            ok, observed, detail = self.verdict(subject)
        except Exception as e:  # only the source's gaps are unknown; anything else is a bug
            why = self.source.unknown_detail(e)
            if why is None:
                raise
            return Check(cid, None, expected, None, why)
        note = str(detail) if ok and isinstance(detail, Stricter) else ""
        return Check(cid, None if ok is None else bool(ok), expected, observed, str(detail), note)


REGISTRY: dict[str, Rule] = {}


def _constant(value: Any) -> Callable[[Any], Any]:
    return lambda _subject: value


def rule(
    check_id: str,
    *,
    source: Source,
    area: str,
    expected: Any = None,
    moments: Iterable[Moment] = MOMENTS,
    when: Callable[[Any], bool] | None = None,
    when_doc: str = "",
) -> Callable[[Callable[[S], Verdict]], Callable[[S], Verdict]]:
    """Register the decorated verdict function as the rule producing `check_id`.

    ``expected`` is the value the check records as expected: a constant, or a
    function of the subject (a policy value). ``when`` narrows the rule to the
    subjects that carry what it reads (``when_doc`` says so in the docs).
    Within a source, registration order is the order of the checks a judge returns.
    """
    moments = tuple(moments)
    for m in moments:
        as_moment(m)

    def register(fn: Callable[[S], Verdict]) -> Callable[[S], Verdict]:
        text = _pyinspect.getdoc(fn) or ""
        summary, _, why = text.partition("\n\n")
        if not summary.strip():
            raise ValueError(f"rule {check_id} ({fn.__name__}) has no docstring")
        if check_id in REGISTRY:
            raise ValueError(f"rule {check_id} is registered twice")
        REGISTRY[check_id] = Rule(
            id=check_id,
            source=source,
            area=area,
            moments=moments,
            summary=" ".join(summary.split()),
            why=" ".join(why.split()),
            verdict=fn,
            expected_of=expected if callable(expected) else _constant(expected),
            when=when,
            when_doc=when_doc,
        )
        fn.rule = REGISTRY[check_id]  # type: ignore[attr-defined]
        return fn

    return register


def rules_of(source: Source, *, area: str | None = None) -> list[Rule]:
    """The registered rules reading `source` (of one area), in registration order."""
    return [r for r in REGISTRY.values() if r.source is source and (area is None or r.area == area)]


def judge_subject(source: Source, subject: Any) -> list[Check]:
    """Every rule of `source` that applies to the subject, in registration order."""
    return [r.check(subject) for r in rules_of(source) if r.applies(subject)]
