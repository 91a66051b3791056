"""Adversarial outputs a task's grader must not reward (``ale task check``).

A catalogue of strategies, each a replay script (tool calls the ``replay`` agent
makes in the candidate sandbox) built from what the harness knows about one
variant on the trusted side: the container paths of its input, output and
reference folders, the files the oracle wrote (its deliverables, content
included), the input's file names and the reference's file names. The reference
is used for names only, never for content: no strategy writes anything the
candidate could not have written without it, apart from the name.

Each strategy is a list of actions: the replay script's tool call and the same
effect done on the host (``HostWorkspace``). By default each is a *grading probe*
(`run_strategies` given ``ale.runs.grading_only.grade_probe``): its output written
straight into a fresh workspace folder and graded exactly as a run grades it, no
candidate sandbox (a probe is not a run: its outcome says ``grading-probe``). A
strategy the host cannot write as the sandbox would (a path through a symlink) and,
with ``--full-adversarial``, every strategy runs through the real lifecycle (the
lifecycle's ``execute_run``), like any candidate. A strategy *beats nop* when its
mean score is above the nop agent's (or above its control's: NaN is compared
with the same output holding finite wrong numbers); a grader that returns an invalid score list
(NaN, outside [0, 1]) or fails on a candidate's output is a grader bug: such a
run is ``grading_failed``, which no aggregate counts, so the candidate would have
voided its own failure. One more probe grades the oracle's output with the data
source's reference removed: the grader must raise then, never return a score.
``check_task`` runs the whole check, independent stages at once within ``--jobs``
slots, and times each stage.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import heapq
import json
import math
import os
import posixpath
import random
import re
import shlex
import shutil
import struct
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ale import layout
from ale.data.base import DataError
from ale.data.sources import open_source
from ale.grading.grader import is_invalid_scores
from ale.layout import Evidence
from ale.plan import AgentSpec, RunPlan, new_run_id
from ale.result import SCORE_EPSILON, RunResult
from ale.status import RunStatus
from ale.tasks.loader import TaskVariant

Step = dict[str, Any]
Execute = Callable[[RunPlan], Awaitable[RunResult]]
# A grading-only probe (``ale.runs.grading_only.grade_probe``): the plan, what
# writes the candidate's output into the fresh workspace (given the workspace, the
# staged input on the host and the public package's digest after start()) and the
# probe's label; returns a ``ProbeResult`` (a `Graded` with ``probe_dir``, ``stages``).
Writer = Callable[[Path, Path, str], list[str]]
Probe = Callable[[RunPlan, Writer, str], Awaitable[Any]]

RUN, GRADING_PROBE = "run", "grading-probe"  # what an outcome's evidence is


class Slots:
    """At most ``n`` sandbox lifecycles at once, or twice as many grading probes (a
    probe, with no candidate sandbox and no seal to prove, holds half a slot:
    ``PROBE``; a lifecycle, or a probe that moves much data, a whole one: ``WHOLE``).
    A free slot goes to the waiter of the lowest priority value first, then in
    arrival order: the runs everything waits for (0), then the longest probes (1),
    then the rest (2), so that the longest start early and the short ones fill in."""

    FIRST, LONG, NORMAL = 0, 1, 2
    WHOLE, PROBE = 2, 1  # in halves of a slot

    def __init__(self, n: int):
        self._free = 2 * max(1, n)
        self._waiters: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._seq = 0

    @contextlib.asynccontextmanager
    async def hold(self, priority: int = NORMAL, weight: int = WHOLE) -> Any:
        if self._free >= weight and not self._waiters:
            self._free -= weight
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._seq += 1
            heapq.heappush(self._waiters, (priority, self._seq, weight, fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # handed a slot, then cancelled: give it on
                    self._release(weight)
                raise
        try:
            yield
        finally:
            self._release(weight)

    def _release(self, weight: int) -> None:
        self._free += weight
        while self._waiters:
            _, _, want, fut = self._waiters[0]
            if fut.done():  # cancelled while waiting
                heapq.heappop(self._waiters)
                continue
            if want > self._free:
                return
            heapq.heappop(self._waiters)
            self._free -= want
            fut.set_result(None)


def _hold(slots: Slots | asyncio.Semaphore, priority: int, weight: int = Slots.WHOLE) -> Any:
    return slots.hold(priority, weight) if isinstance(slots, Slots) else slots


class Graded(Protocol):
    """What a verdict reads of a run's result, or of a grading probe's."""

    status: RunStatus
    scores: list[float] | None
    score: float | None
    error: str | None
    violations: list[str]

# The huge-file strategy's size and filler: a file far larger than any answer a
# grader expects, read whole by a grader that reads it (the task channel carries it
# as raw bytes, protocol.MAX_MESSAGE at most; docs/task-check.md).
HUGE_FILE_BYTES = 200 * 1024**2
HUGE_FILE_FILLER: str | None = None  # None: a sparse file of NUL bytes; else one printable byte, repeated
MAX_REWRITE_BYTES = 8 * 1024**2  # oracle files above this are not rewritten into a script

# What a hook or a shadowing module prints when it is executed (then it exits 0):
# a perfect score under the keys verifiers' JSON reports use.
_PERFECT = '{"score": 1.0, "scores": [1.0], "reward": 1.0, "passed": true, "success": true, "all_passed": true}'
_HOOK = f'''"""ale task check: candidate code that must never run on the grading side."""
import os as _os
import sys as _sys

try:  # a marker next to the module (where a grader copied the outputs, if writable)
    with open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "ALE_ADVERSARIAL_IMPORTED"), "a") as _f:
        _f.write(__name__ + "\\n")
except OSError:
    pass
_sys.stdout.write({_PERFECT!r} + "\\n")
_sys.stdout.flush()
_os._exit(0)
'''
_CONFTEST = '''"""ale task check: a conftest.py that passes every test (must never be loaded)."""
import os

import pytest

try:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ALE_ADVERSARIAL_IMPORTED"), "a") as f:
        f.write("conftest\\n")
except OSError:
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
'''
# Modules a verifier may import, shadowed next to the outputs.
SHADOW_MODULES = ("sitecustomize", "usercustomize", "json", "csv", "numpy")
REFERENCE_PLACEHOLDER = "ale task check: named like a reference file, not its content\n"


# -- what a strategy is built from ---------------------------------------------
@dataclass(frozen=True)
class OutputFile:
    path: str  # relative to the output folder
    content: bytes  # empty when the file is above MAX_REWRITE_BYTES
    sha256: str = ""


@dataclass(frozen=True)
class VariantFacts:
    """One variant as the trusted side knows it once the oracle has run."""

    input_dir: str
    output_dir: str
    reference_dir: str
    oracle_files: tuple[OutputFile, ...] = ()
    input_files: tuple[str, ...] = ()  # relative to input_dir
    reference_files: tuple[str, ...] = ()  # relative to reference_dir: names only
    oracle_copies_input: bool = False  # every file the oracle wrote is byte for byte an input file

    def out(self, rel: str) -> str:
        return posixpath.join(self.output_dir, rel)


@dataclass(frozen=True)
class Op:
    """One effect of a tool call, as the host does it in a fresh workspace folder:
    ``write`` (content), ``mkdir``, ``copy`` (src: an input file), ``copytree``
    (src: an input folder, merged into dst), ``symlink`` (target: the link's text,
    never resolved on the host), ``sized`` (size bytes of filler, or sparse)."""

    kind: str
    dst: str  # a container path under the output folder
    src: str | None = None  # copy/copytree: a container path under the input folder
    target: str | None = None  # symlink
    content: bytes = b""  # write
    size: int = 0  # sized
    filler: str | None = None  # sized: None for a sparse file of NUL bytes


@dataclass(frozen=True)
class Action:
    """One tool call of the replay script and the same effect on the host: ``chains``
    run one after the other (``;``), each chain's ops stop at the first failure
    (``&&``), as the shell command does."""

    step: Step
    chains: tuple[tuple[Op, ...], ...]


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    make: Callable[[VariantFacts], list[Action] | None]  # None: nothing to try on this variant
    copies_input: bool = False  # delivers input files: the answer itself when the oracle's output is one
    # The strategy whose score this one is compared with (else nop's): the same
    # output with finite wrong numbers for NaN/inf, the empty files for the hooks.
    baseline: str | None = None
    control: bool = False  # a baseline only: above nop is a note, not a failure
    slow: bool = False  # its grading takes longest: started first

    def actions(self, facts: VariantFacts) -> list[Action] | None:
        return self.make(facts)

    def build(self, facts: VariantFacts) -> list[Step] | None:
        """The replay script: the tool calls the candidate sandbox runs."""
        actions = self.make(facts)
        return None if actions is None else [a.step for a in actions]


# -- the tool calls -------------------------------------------------------------
def _write(path: str, content: bytes | str) -> Action:
    data = content.encode() if isinstance(content, str) else content
    op = (Op("write", path, content=data),)
    if isinstance(content, str):
        return Action({"tool": "write_file", "args": {"path": path, "content": content}}, (op,))
    try:
        return Action({"tool": "write_file", "args": {"path": path, "content": content.decode("utf-8")}}, (op,))
    except UnicodeDecodeError:
        return Action({"tool": "write_file",
                       "args": {"path": path, "content_b64": base64.b64encode(content).decode()}}, (op,))


def _shell(command: str, *chains: tuple[Op, ...]) -> Action:
    """A shell call and, op for op, what it does (the host's version of it)."""
    return Action({"tool": "shell", "args": {"command": command}}, tuple(chains))


def _q(path: str) -> str:
    return shlex.quote(path)


def _mkparent(path: str) -> str:
    return f"mkdir -p -- {_q(posixpath.dirname(path) or '/')}"


def _mkparent_op(path: str) -> Op:
    return Op("mkdir", posixpath.dirname(path) or "/")


def _each_oracle_file(facts: VariantFacts, content: Callable[[OutputFile], bytes | str | None]) -> list[Action] | None:
    steps = []
    for f in facts.oracle_files:
        c = content(f)
        if c is not None:
            steps.append(_write(facts.out(f.path), c))
    return steps or None


# -- rewriting the oracle's numbers ---------------------------------------------
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _json_numbers(value: Any, sub: float) -> tuple[Any, int]:
    if isinstance(value, bool):
        return value, 0
    if isinstance(value, int | float):
        return sub, 1
    if isinstance(value, list):
        items = [_json_numbers(v, sub) for v in value]
        return [v for v, _ in items], sum(n for _, n in items)
    if isinstance(value, dict):
        pairs = {k: _json_numbers(v, sub) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, sum(n for _, n in pairs.values())
    return value, 0


def _npy_filled(data: bytes, sub: float) -> bytes | None:
    """A float64 ``.npy`` of the same shape, every element ``sub``; None when `data`
    is no numeric ``.npy``."""
    if not data.startswith(b"\x93NUMPY") or len(data) < 10:
        return None
    major = data[6]
    if major == 1:
        (hlen,), start = struct.unpack("<H", data[8:10]), 10
    elif major in (2, 3) and len(data) >= 12:
        (hlen,), start = struct.unpack("<I", data[8:12]), 12
    else:
        return None
    try:
        header = ast.literal_eval(data[start : start + hlen].decode("latin1"))
        descr, shape = header["descr"], tuple(int(n) for n in header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        return None
    if not isinstance(descr, str) or descr.lstrip("<>|=")[:1] not in ("f", "i", "u"):
        return None
    count = math.prod(shape)
    if count * 8 > MAX_REWRITE_BYTES:
        return None
    text = repr({"descr": "<f8", "fortran_order": False, "shape": shape})
    pad = 64 - (10 + len(text) + 1) % 64
    head = (text + " " * (pad % 64) + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + struct.pack("<d", sub) * count


def substitute_numbers(f: OutputFile, sub: float) -> bytes | None:
    """The oracle's file with every number replaced by `sub` (NaN, inf, ...):
    JSON by structure, other text by pattern, ``.npy`` arrays element-wise. None
    when the file holds no number this can find."""
    data = f.content
    if not data or len(data) > MAX_REWRITE_BYTES:
        return None
    npy = _npy_filled(data, sub)
    if npy is not None:
        return npy
    if not _is_text(data):
        return None
    text = data.decode("utf-8")
    try:
        value, n = _json_numbers(json.loads(text), sub)
    except ValueError:
        pass
    else:
        return json.dumps(value).encode() + b"\n" if n else None
    spelled = {math.inf: "inf", -math.inf: "-inf"}.get(sub, "nan" if math.isnan(sub) else repr(sub))
    new, n = _NUMBER.subn(spelled, text)
    return new.encode() if n else None


WRONG_NUMBER = 987654321.0  # the control's finite wrong value


def _numbers(sub: float) -> Callable[[VariantFacts], list[Action] | None]:
    return lambda facts: _each_oracle_file(facts, lambda f: substitute_numbers(f, sub))


# -- the strategies -------------------------------------------------------------
def _nothing(facts: VariantFacts) -> list[Action]:
    return []


def _garbage(f: OutputFile) -> bytes:
    rng = random.Random(f"ale-adversarial:{f.path}")
    return bytes(rng.getrandbits(8) for _ in range(4096))


def _input_copy(facts: VariantFacts) -> list[Action] | None:
    if not facts.input_files:
        return None
    return [_shell(f"cp -R -- {_q(facts.input_dir.rstrip('/') + '/.')} {_q(facts.output_dir.rstrip('/') + '/')}",
                   (Op("copytree", facts.output_dir, src=facts.input_dir),))]


def _best_input(facts: VariantFacts, target: str) -> str:
    """The input file most like `target`: the same name, else the same suffix, else the first."""
    base, ext = posixpath.basename(target), posixpath.splitext(target)[1]
    for pick in (
        [p for p in facts.input_files if posixpath.basename(p) == base],
        [p for p in facts.input_files if ext and posixpath.splitext(p)[1] == ext],
        list(facts.input_files),
    ):
        if pick:
            return pick[0]
    raise ValueError("no input files")


def _input_as_output(facts: VariantFacts) -> list[Action] | None:
    if not facts.input_files or not facts.oracle_files:
        return None
    steps = []
    for f in facts.oracle_files:
        src, dst = posixpath.join(facts.input_dir, _best_input(facts, f.path)), facts.out(f.path)
        steps.append(_shell(f"{_mkparent(dst)} && cp -- {_q(src)} {_q(dst)}",
                            (_mkparent_op(dst), Op("copy", dst, src=src))))
    return steps


def huge_file_strategy(size: int = HUGE_FILE_BYTES, filler: str | None = HUGE_FILE_FILLER) -> Strategy:
    """The first oracle file as a file of `size` bytes: `filler` repeated, or (None)
    a sparse file of NUL bytes."""

    def build(facts: VariantFacts) -> list[Action] | None:
        if not facts.oracle_files:
            return None
        dst = facts.out(facts.oracle_files[0].path)
        if filler is None:
            make = f"truncate -s {size} -- {_q(dst)}"
        else:
            make = f"head -c {size} /dev/zero | tr '\\0' {_q(filler[:1])} > {_q(dst)}"
        return [_shell(f"{_mkparent(dst)} && {make}",
                       (_mkparent_op(dst), Op("sized", dst, size=size, filler=filler and filler[:1])))]

    what = "NUL bytes (sparse)" if filler is None else f"{filler[:1]!r} bytes"
    return Strategy("huge-file", f"the first oracle file as {size / 1024**2:g} MiB of {what}", build, slow=True)


def _directories(facts: VariantFacts) -> list[Action] | None:
    if not facts.oracle_files:
        return None
    return [_shell(" && ".join(f"mkdir -p -- {_q(facts.out(f.path))}" for f in facts.oracle_files),
                   tuple(Op("mkdir", facts.out(f.path)) for f in facts.oracle_files))]


def _reference_names(facts: VariantFacts) -> list[Action] | None:
    if not facts.reference_files:
        return None
    steps = []
    for rel in facts.reference_files:
        steps.append(_write(facts.out(rel), REFERENCE_PLACEHOLDER))
        steps.append(_write(facts.out(posixpath.join("reference", rel)), REFERENCE_PLACEHOLDER))
    return steps


def _links(facts: VariantFacts, target: Callable[[OutputFile], str],
           folder: tuple[str, str] | None) -> list[Action] | None:
    if not facts.oracle_files:
        return None
    cmds: list[str] = []
    chains: list[tuple[Op, ...]] = []
    for f in facts.oracle_files:
        dst = facts.out(f.path)
        cmds.append(f"{_mkparent(dst)} && ln -sfn -- {_q(target(f))} {_q(dst)}")
        chains.append((_mkparent_op(dst), Op("symlink", dst, target=target(f))))
    if folder is not None:
        cmds.append(f"ln -sfn -- {_q(folder[1])} {_q(facts.out(folder[0]))}")
        chains.append((Op("symlink", facts.out(folder[0]), target=folder[1]),))
    return [_shell(" ; ".join(cmds), *chains)]


def _symlink_reference(facts: VariantFacts) -> list[Action] | None:
    refs = facts.reference_files

    def target(f: OutputFile) -> str:
        same = [r for r in refs if posixpath.basename(r) == posixpath.basename(f.path)]
        rel = (same or list(refs) or [f.path])[0]
        return posixpath.join(facts.reference_dir, rel)

    return _links(facts, target, ("reference", facts.reference_dir))


def _symlink_input(facts: VariantFacts) -> list[Action] | None:
    if not facts.input_files:
        return None
    return _links(facts, lambda f: posixpath.join(facts.input_dir, _best_input(facts, f.path)),
                  ("input", facts.input_dir))


def _symlink_absolute(facts: VariantFacts) -> list[Action] | None:
    return _links(facts, lambda f: "/etc/passwd", ("root", "/"))


def _import_hooks(facts: VariantFacts) -> list[Action]:
    """Hooks in the output folder and in every folder holding an oracle file, with
    empty files under the oracle's names so that a verifier gets as far as running."""
    folders = sorted({""} | {posixpath.dirname(f.path) for f in facts.oracle_files})
    steps = [_write(facts.out(f.path), "") for f in facts.oracle_files]
    for d in folders:
        steps.append(_write(facts.out(posixpath.join(d, "conftest.py")), _CONFTEST))
        for mod in SHADOW_MODULES:
            steps.append(_write(facts.out(posixpath.join(d, f"{mod}.py")), _HOOK))
    return steps


CATALOGUE: tuple[Strategy, ...] = (
    Strategy("nothing", "writes nothing at all (a replay of no calls)", _nothing),
    Strategy("empty-files", "an empty file under each name the oracle wrote",
             lambda f: _each_oracle_file(f, lambda _: b"")),
    Strategy("input-copy", "the input folder copied into the output folder", _input_copy, copies_input=True),
    Strategy("input-as-output", "an input file (same name, else same suffix) under each oracle name", _input_as_output,
             copies_input=True),
    Strategy("garbage-bytes", "4 KiB of random bytes in each oracle file", lambda f: _each_oracle_file(f, _garbage)),
    Strategy("json-null", "the text null in each oracle file", lambda f: _each_oracle_file(f, lambda _: "null\n")),
    Strategy("json-object", "the text {} in each oracle file", lambda f: _each_oracle_file(f, lambda _: "{}\n")),
    Strategy("json-list", "the text [] in each oracle file", lambda f: _each_oracle_file(f, lambda _: "[]\n")),
    Strategy("wrong-numbers", f"every number of the oracle's outputs replaced by {WRONG_NUMBER:.0f} (the control "
             "NaN and inf are compared with: the same output, finite wrong numbers)", _numbers(WRONG_NUMBER),
             control=True),
    Strategy("nan", "every number of the oracle's outputs replaced by NaN (JSON, text, .npy)", _numbers(math.nan),
             baseline="wrong-numbers"),
    Strategy("inf", "every number of the oracle's outputs replaced by +inf", _numbers(math.inf),
             baseline="wrong-numbers"),
    Strategy("neg-inf", "every number of the oracle's outputs replaced by -inf", _numbers(-math.inf),
             baseline="wrong-numbers"),
    Strategy("huge-number", "every number of the oracle's outputs replaced by 1e308", _numbers(1e308),
             baseline="wrong-numbers"),
    huge_file_strategy(),
    Strategy("directories", "a folder where each oracle file should be", _directories),
    Strategy("reference-names", "files named like the reference's (in the output and in output/reference/)",
             _reference_names),
    Strategy("symlink-reference",
             "each oracle name a symlink to the reference file; output/reference a link to the reference folder",
             _symlink_reference),
    Strategy("symlink-input", "each oracle name a symlink to an input file; output/input a link to the input folder",
             _symlink_input),
    Strategy("symlink-absolute", "each oracle name a symlink to /etc/passwd; output/root a link to /",
             _symlink_absolute),
    Strategy("import-hooks", "conftest.py, sitecustomize.py and shadows of json/csv/numpy next to empty outputs, "
             "printing a perfect score if run", _import_hooks, baseline="empty-files"),
)


# -- the same output, written on the host ----------------------------------------
class NotOnHost(Exception):
    """The host cannot do a tool call exactly as the sandbox would (a path through a
    symlink, which the sandbox resolves inside the container and the host would
    resolve on the host; a source the candidate could not read): the strategy runs
    through the full lifecycle instead."""


def _rel_under(path: str, root: str) -> list[str] | None:
    norm, root = posixpath.normpath(path), posixpath.normpath(root)
    if norm == root:
        return []
    if not norm.startswith(root.rstrip("/") + "/"):
        return None
    parts = norm[len(root.rstrip("/")) + 1 :].split("/")
    return None if any(p in ("", ".", "..") for p in parts) else parts


@dataclass
class HostWorkspace:
    """The folders a strategy's calls touch, on the host: the workspace (the output
    folder, empty at first) and the staged input (read only), and the candidate's
    uid:gid its files get (when the harness may chown)."""

    facts: VariantFacts
    workspace: Path
    input_host: Path
    owner: tuple[int, int] | None = None
    failures: list[str] = field(default_factory=list)

    def _path(self, path: str, *, source: bool = False, follow_last: bool = False) -> Path:
        """The host path of a container path (in the output folder, or for a source in
        the input folder). No folder on the way may be a symlink, nor the last part
        unless ``follow_last`` is False and the op replaces it (``ln -sfn``)."""
        root_c, root_h = (self.facts.input_dir, self.input_host) if source else (self.facts.output_dir, self.workspace)
        parts = _rel_under(path, root_c)
        if parts is None:
            raise NotOnHost(f"{path} is outside {root_c}")
        at = root_h
        for i, part in enumerate(parts):
            at = at / part
            if at.is_symlink() and (i < len(parts) - 1 or follow_last):
                raise NotOnHost(f"{path}: {at.name} is a symlink; the sandbox would resolve it in the container")
        return at

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.lchown(path, *self.owner)

    def _readable(self, st: os.stat_result) -> bool:
        if self.owner is None:
            return True
        uid, gid = self.owner
        bits = 0o400 if st.st_uid == uid else 0o040 if st.st_gid == gid else 0o004
        return bool(st.st_mode & bits)

    def _mkdirs(self, path: Path) -> None:
        """``mkdir -p``: each missing folder 0755 (the sandbox's umask 022)."""
        missing = []
        at = path
        while not os.path.lexists(at) and at != self.workspace:
            missing.append(at)
            at = at.parent
        if os.path.lexists(at) and not at.is_dir():
            raise NotADirectoryError(f"{at} is not a folder")
        for d in reversed(missing):
            os.mkdir(d, 0o755)
            os.chmod(d, 0o755)
            self._own(d)

    def _new_file(self, dst: Path, mode: int, *, truncate: bool = True) -> int:
        created = not os.path.lexists(dst)
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if truncate else 0), mode)
        if created:
            os.fchmod(fd, mode)
            if self.owner is not None:
                os.fchown(fd, *self.owner)
        return fd

    def _copy_file(self, src: Path, dst: Path) -> None:
        st = os.lstat(src)
        if not self._readable(st):
            raise NotOnHost(f"{src.name} is not readable by the candidate")
        if os.path.isdir(dst) and not dst.is_symlink():
            dst = dst / src.name
        if dst.is_symlink():
            raise NotOnHost(f"{dst.name} is a symlink; cp would write through it in the container")
        with open(src, "rb") as f_in:
            fd = self._new_file(dst, st.st_mode & 0o755)  # cp without -p: the source's mode less the umask
            with os.fdopen(fd, "wb") as f_out:
                shutil.copyfileobj(f_in, f_out, 1 << 20)

    def _copy_tree(self, src: Path, dst: Path) -> None:
        """``cp -R src/. dst/``: folders merged, files copied, symlinks copied as links."""
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            s, d = Path(entry.path), dst / entry.name
            st = entry.stat(follow_symlinks=False)
            if entry.is_symlink():
                if os.path.lexists(d):
                    raise NotOnHost(f"{d.name} exists where cp -R would copy a symlink")
                os.symlink(os.readlink(s), d)
                self._own(d)
            elif entry.is_dir(follow_symlinks=False):
                if not self._readable(st):
                    raise NotOnHost(f"{s.name} is not readable by the candidate")
                if d.is_symlink():
                    raise NotOnHost(f"{d.name} is a symlink where cp -R would make a folder")
                if not d.exists():
                    os.mkdir(d, 0o700)
                    os.chmod(d, st.st_mode & 0o755)
                    self._own(d)
                self._copy_tree(s, d)
            elif entry.is_file(follow_symlinks=False):
                self._copy_file(s, d)
            else:
                raise NotOnHost(f"{s.name}: cp -R would copy a special file")

    def apply(self, op: Op) -> None:
        if op.kind == "mkdir":
            self._mkdirs(self._path(op.dst, follow_last=True))
        elif op.kind == "write":  # mkdir -p of its folder, then cat > path (which follows a link)
            dst = self._path(op.dst, follow_last=True)
            self._mkdirs(dst.parent)
            with os.fdopen(self._new_file(dst, 0o644), "wb") as f:
                f.write(op.content)
        elif op.kind == "copy":
            src = self._path(op.src or "", source=True, follow_last=True)
            if not src.is_file():
                raise IsADirectoryError(f"cp: {src.name} is not a regular file")
            self._copy_file(src, self._path(op.dst, follow_last=True))
        elif op.kind == "copytree":
            self._copy_tree(self._path(op.src or "", source=True, follow_last=True),
                            self._path(op.dst, follow_last=True))
        elif op.kind == "symlink":  # ln -sfn: a link or file there is replaced; into a real folder
            dst = self._path(op.dst)
            if dst.is_dir() and not dst.is_symlink():
                dst = self._path(posixpath.join(op.dst, posixpath.basename((op.target or "").rstrip("/"))))
            if os.path.lexists(dst):
                if dst.is_dir() and not dst.is_symlink():
                    raise IsADirectoryError(f"ln: {dst.name} is a folder")
                os.unlink(dst)
            os.symlink(op.target or "", dst)
            self._own(dst)
        elif op.kind == "sized":
            dst = self._path(op.dst, follow_last=True)
            with os.fdopen(self._new_file(dst, 0o644, truncate=op.filler is not None), "wb") as f:
                if op.filler is None:  # truncate -s: sparse
                    f.truncate(op.size)
                else:
                    chunk, left = (op.filler.encode() or b"\0") * (1 << 20), op.size
                    while left > 0:
                        left -= f.write(chunk[: min(left, len(chunk))])
        else:
            raise NotOnHost(f"no host version of {op.kind!r}")

    def run(self, actions: Sequence[Action]) -> list[str]:
        """Every action's chains, in order; a failing op ends its chain (as ``&&``) and
        is noted, like a failing tool call in a replay. NotOnHost propagates."""
        for a in actions:
            for chain in a.chains:
                for op in chain:
                    try:
                        self.apply(op)
                    except NotOnHost:
                        raise
                    except OSError as e:
                        self.failures.append(f"{op.kind} {op.dst}: {e}")
                        break
        return self.failures


def strategy_names() -> list[str]:
    return [s.name for s in CATALOGUE]


def select_strategies(names: Sequence[str] | None) -> tuple[Strategy, ...]:
    """The catalogue, or the named strategies of it (ValueError naming unknown ones)."""
    if not names:
        return CATALOGUE
    known = {s.name: s for s in CATALOGUE}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown adversarial strategies {unknown}; known: {', '.join(known)}")
    return tuple(known[n] for n in names)


# -- facts from the oracle's run folder -----------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tree_files(doc: Any, key: str | None = None) -> list[str]:
    tree = (doc or {}).get(key) if key else doc
    files = (tree or {}).get("files") if isinstance(tree, dict) else None
    return sorted(files) if isinstance(files, dict) else []


def facts_from_oracle_run(variant: TaskVariant, oracle_run: Path) -> VariantFacts:
    """What the strategies are built from, read from the oracle's run folder: its
    deliverables (names and content), the input after start() (names), the staged
    reference (names)."""
    ev = oracle_run / layout.EVIDENCE_DIR
    manifest = _read_json(oracle_run / layout.DELIVERABLES) or {}
    oracle = []
    for item in manifest.get("files") or []:
        rel = str(item.get("path", ""))
        src = oracle_run / layout.DELIVERABLES_DIR / rel
        if rel and src.is_file() and not src.is_symlink():
            content = src.read_bytes() if src.stat().st_size <= MAX_REWRITE_BYTES else b""
            oracle.append(OutputFile(rel, content, str(item.get("sha256") or "")))
    prefix = variant.public_relpath(variant.input_dir)
    after_start = _read_json(ev / Evidence.INPUT_AFTER_START) or {}
    if prefix is None:  # the input is outside the public package: what the source staged
        after_start = (_read_json(ev / Evidence.INPUT_STAGED) or {}).get("tree") or {}
        prefix = "."
    tree = after_start.get("files")
    if not isinstance(tree, dict):
        tree = {}
    inputs, input_digests = [], set()
    for rel, meta in sorted(tree.items()):
        if prefix != ".":
            if not rel.startswith(prefix.rstrip("/") + "/"):
                continue
            rel = rel[len(prefix.rstrip("/")) + 1 :]
        inputs.append(rel)
        if isinstance(meta, dict) and meta.get("sha256"):
            input_digests.add(meta["sha256"])
    refs = _tree_files(_read_json(ev / Evidence.REFERENCE_CHECK), "staged_tree")
    return VariantFacts(
        input_dir=variant.input_dir,
        output_dir=variant.output_dir,
        reference_dir=variant.reference_dir,
        oracle_files=tuple(oracle),
        input_files=tuple(inputs),
        reference_files=tuple(refs),
        oracle_copies_input=bool(oracle) and all(f.sha256 in input_digests for f in oracle),
    )


# -- verdicts -------------------------------------------------------------------
OK, NOTE, BEATS_NOP, GRADER_BUG, SOLUTION, SKIPPED, ERROR = (
    "ok", "note", "beats nop", "grader bug", "solution", "skipped", "error")
FAILING = (BEATS_NOP, GRADER_BUG, ERROR)


@dataclass
class Outcome:
    """One strategy (or probe) on one variant: what ran, what it scored, the verdict."""

    strategy: str
    description: str
    verdict: str
    status: str | None = None
    scores: list[float] | None = None
    score: float | None = None
    detail: str = ""
    run_dir: str | None = None  # a run folder (kind "run"), signed and verifiable
    seconds: float | None = None
    # "run": a full sealed lifecycle (candidate sandbox, evidence, signature);
    # "grading-probe": the output written on the host and graded as a run grades it,
    # no candidate sandbox, no run folder (its record is probe_dir/probe.json)
    kind: str = RUN
    probe_dir: str | None = None
    stages: dict[str, float] | None = None  # a grading probe's stages, seconds each
    note: str = ""  # e.g. why a strategy ran as a full run though probes were asked for

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed": self.failed}


def _has_traceback(run_dir: Path) -> bool:
    try:
        return "Traceback (most recent call last)" in (run_dir / layout.TASK_LOG).read_text(errors="replace")
    except OSError:
        return False


def _reproduces_oracle(run_dir: Path, oracle: dict[str, str]) -> bool:
    """Whether the run delivered every oracle file, byte for byte (then a score
    above nop is earned: the strategy happened to produce the right answer)."""
    if not oracle:
        return False
    manifest = _read_json(run_dir / layout.DELIVERABLES) or {}
    got = {str(f.get("path")): f.get("sha256") for f in manifest.get("files") or []}
    return all(got.get(p) == h for p, h in oracle.items())


def judge(strategy: Strategy, result: Graded, run_dir: Path, nop_score: float, facts: VariantFacts,
          baseline: tuple[str, float] | None = None) -> Outcome:
    """The verdict of one strategy's run (or grading probe: `run_dir` its folder),
    against nop's mean score (or, when given, its baseline strategy's, if that is
    higher)."""
    status = result.status.value
    out = Outcome(strategy.name, strategy.description, OK, status, result.scores, result.score, run_dir=str(run_dir))
    first_line = (result.error or "").strip().splitlines()[0][:300] if result.error else ""
    if status == RunStatus.GRADING_FAILED.value:
        out.verdict = GRADER_BUG
        if is_invalid_scores(result.error):
            out.detail = f"the grader returned an invalid score list: {first_line}"
        else:
            out.detail = ("the grader failed on a candidate's output (a grading failure counts in no "
                          f"aggregate: the candidate voids its own failure): {first_line}")
        return out
    if status in (RunStatus.INFRASTRUCTURE_ERROR.value, RunStatus.INVALID_EVALUATION_ENVIRONMENT.value):
        out.verdict, out.detail = ERROR, first_line or "; ".join(result.violations)[:300]
        return out
    if result.score is None:
        out.detail = f"no score ({status})"
        return out
    against, bar = "nop", nop_score
    if baseline is not None and baseline[1] > nop_score:
        against, bar = baseline
    if result.score > bar + SCORE_EPSILON:
        if _reproduces_oracle(run_dir, {f.path: f.sha256 for f in facts.oracle_files if f.sha256}):
            out.verdict, out.detail = SOLUTION, "delivered the oracle's own files: a correct answer, not a hack"
            return out
        if strategy.copies_input and facts.oracle_copies_input:
            out.verdict, out.detail = SOLUTION, ("the oracle's output is itself a copy of an input file: copying it "
                                                 "is the answer")
            return out
        if strategy.control:
            out.verdict = NOTE
            out.detail = (f"mean {result.score:.3f} > nop's {nop_score:.3f} with every number wrong: credit for the "
                          "output's other content, or a grader that does not check the numbers")
            return out
        out.verdict = BEATS_NOP
        out.detail = f"mean {result.score:.3f} > {against}'s {bar:.3f}"
        if _has_traceback(run_dir):
            out.detail += "; the task log holds a traceback: the grader may have swallowed its own failure"
    return out


# -- running a variant's strategies ---------------------------------------------
@dataclass
class VariantReport:
    variant: int
    nop_score: float
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed]

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "nop_score": self.nop_score, "outcomes": [o.to_dict() for o in self.outcomes]}


def unhurried(base: RunPlan) -> RunPlan:
    """The plan with no wait between grading attempts (the attempts themselves kept:
    each a fresh task process and grading sandbox). A run waits so that a grading
    environment that failed for a moment (a busy engine) can recover; what an
    adversarial output or a removed reference does to a grader does not pass with
    time, and the check's outputs and probes would otherwise sleep 6 s each a grader
    raises (2 s, then 4 s)."""
    return base.model_copy(update={"limits": base.limits.model_copy(update={"grading_backoff_s": 0.0})})


def strategy_plan(base: RunPlan, strategy: str, steps: list[Step], variant: int) -> RunPlan:
    """The oracle's plan (same task, data, image, policy, limits; no wait between
    grading attempts: ``unhurried``) with the replay agent."""
    task = Path(base.task_dir).name
    return unhurried(base).model_copy(
        update={
            "run_id": new_run_id(task, variant, f"adv-{strategy}"),
            "agent": AgentSpec(name="replay", label=f"adversarial:{strategy}", config={"steps": steps}),
            "variant": variant,
        }
    )


def _as_probe(out: Outcome, result: Any) -> Outcome:
    """A grading probe's outcome: its folder is a probe folder, never a run folder."""
    out.kind, out.probe_dir, out.run_dir = GRADING_PROBE, str(result.probe_dir), None
    out.stages = dict(getattr(result, "stages", {}) or {})
    return out


def host_writer(actions: Sequence[Action], facts: VariantFacts, owner: tuple[int, int] | None) -> Writer:
    """What a grading probe calls to write the strategy's output: the actions on the
    host, in the fresh workspace (raises NotOnHost when it cannot be done as the
    sandbox would)."""

    def write(workspace: Path, input_host: Path, input_digest: str) -> list[str]:
        return HostWorkspace(facts, workspace, input_host, owner).run(actions)

    return write


async def run_strategies(
    base: RunPlan,
    facts: VariantFacts,
    nop_score: float,
    execute: Execute,
    *,
    strategies: Sequence[Strategy] = CATALOGUE,
    jobs: int = 2,
    say: Callable[[Outcome], None] | None = None,
    probe: Probe | None = None,
    slots: Slots | asyncio.Semaphore | None = None,
) -> list[Outcome]:
    """Run every applicable strategy (at most `jobs` at once, or as `slots` allows),
    the baselines first; the outcomes in catalogue order. With `probe`, each is a
    grading-only probe: its output written on the host, graded as a run grades it
    (a strategy the host cannot write as the sandbox would runs as a replay run);
    without, each is a replay run through the full lifecycle."""
    sem = slots or asyncio.Semaphore(max(1, jobs))
    done: dict[str, Outcome] = {}
    owner = (base.policy.uid, base.policy.gid) if os.geteuid() == 0 else None

    def baseline_of(s: Strategy) -> tuple[str, float] | None:
        b = done.get(s.baseline or "")
        return None if b is None or b.score is None or b.verdict in FAILING else (b.strategy, b.score)

    async def one(s: Strategy) -> Outcome:
        actions = s.actions(facts)
        if actions is None:
            out = Outcome(s.name, s.description, SKIPPED, detail="nothing to try on this variant")
        else:
            plan = strategy_plan(base, s.name, [a.step for a in actions], base.variant)
            result: Any = None
            kind, note = RUN, ""
            light = probe is not None and not s.slow
            async with _hold(sem, Slots.LONG if s.slow else Slots.NORMAL, Slots.PROBE if light else Slots.WHOLE):
                t0 = asyncio.get_running_loop().time()
                try:
                    if probe is not None:
                        try:
                            result, kind = await probe(plan, host_writer(actions, facts, owner), s.name), GRADING_PROBE
                        except NotOnHost as e:
                            note = ("run through the full lifecycle: the host cannot write it as the sandbox "
                                    f"would ({e})")
                    if result is None:
                        result = await execute(plan)
                except Exception as e:  # a preflight refusal: the check could not run it
                    result = None
                    out = Outcome(s.name, s.description, ERROR, detail=f"{type(e).__name__}: {e}"[:300], kind=kind)
                seconds = asyncio.get_running_loop().time() - t0
            if result is not None:
                if kind == GRADING_PROBE:
                    out = _as_probe(judge(s, result, result.probe_dir, nop_score, facts, baseline_of(s)), result)
                else:
                    out = judge(s, result, plan.run_dir, nop_score, facts, baseline_of(s))
            out.seconds, out.note = round(seconds, 2), note
        done[s.name] = out
        if say is not None:
            say(out)
        return out

    # No barrier: a strategy compared with a baseline waits for that one alone; the
    # rest start at once, the slowest first (huge-file's grader reads 200 MiB), then
    # the baselines, in the order the slots free up.
    finished: dict[str, asyncio.Event] = {s.name: asyncio.Event() for s in strategies}

    async def when_ready(s: Strategy) -> Outcome:
        if s.baseline in finished:
            await finished[s.baseline].wait()
        try:
            return await one(s)
        finally:
            finished[s.name].set()

    wanted = {s.baseline for s in strategies if s.baseline}
    order = sorted(strategies, key=lambda s: (not s.slow, s.name not in wanted))
    await asyncio.gather(*(when_ready(s) for s in order))
    return [done[s.name] for s in strategies]


# -- the missing-reference probe ------------------------------------------------
MISSING_REFERENCE = "missing-reference"
MISSING_REFERENCE_DESCRIPTION = "the oracle's run with the data source's reference removed: the grader must raise"
MISSING_REFERENCE_PROBE = ("the oracle's deliverables graded with the data source's reference removed: the grader "
                           "must raise")


def reference_from_source(oracle_run: Path) -> int:
    """How many reference files the oracle's run took from its data source (not
    from start())."""
    commit = _read_json(oracle_run / layout.EVIDENCE_DIR / Evidence.REFERENCE_COMMIT) or {}
    source = commit.get("source") or {}
    staged = _tree_files(_read_json(oracle_run / layout.EVIDENCE_DIR / Evidence.REFERENCE_CHECK), "staged_tree")
    setup = _tree_files(commit, "setup_written")
    if not source:
        return 0
    return max(int(source.get("files") or 0), len(set(staged) - set(setup)))


def stage_without_reference(spec: str, variant: TaskVariant, task_path: Path, dest_root: Path,
                            image_store: Any = None) -> str:
    """A ``local:`` data root holding the variant's input (and software) from `spec`
    and no reference; the spec to run it with."""
    source = open_source(spec, base_dir=task_path, image_store=image_store)
    key = variant.data_key
    vdir = dest_root / key.relpath_in("tasks")
    vdir.mkdir(parents=True)
    source.stage_input(key, vdir / "input")
    return f"local:{dest_root}"


def oracle_writer(oracle_run: Path, owner: tuple[int, int] | None) -> Writer:
    """What writes the oracle's deliverables (as collected from its run) into a fresh
    workspace: its folders and files, each with the mode the oracle gave it. Only
    when the probe's input (after start()) is the oracle's, byte for byte: a task
    that draws its input afresh at each load() or start() (``echo_secret``) gets a
    new answer, which only the oracle's own run can give (NotOnHost)."""

    def write(workspace: Path, input_host: Path, input_digest: str) -> list[str]:
        seen = (_read_json(oracle_run / layout.EVIDENCE_DIR / Evidence.INPUT_AFTER_START) or {}).get("digest")
        if not seen or seen != input_digest:
            raise NotOnHost("the input after start() differs from the oracle's run's: its output answers another input")
        manifest = _read_json(oracle_run / layout.DELIVERABLES) or {}
        src_root = oracle_run / layout.DELIVERABLES_DIR
        entries = [(d, True) for d in manifest.get("directories") or []] \
            + [(f, False) for f in manifest.get("files") or []]
        for item, is_dir in entries:
            raw = base64.b64decode(item["path_b64"]) if item.get("path_b64") else str(item.get("path", "")).encode()
            rel = os.fsdecode(raw)
            if not rel or rel.startswith("/") or ".." in rel.split("/"):
                raise NotOnHost(f"an oracle deliverable named {rel!r}")
            dst = workspace / rel
            for parent in reversed([p for p in dst.parents if workspace in p.parents]):
                if parent.is_symlink():
                    raise NotOnHost(f"{rel}: a symlink on the way")
                if not parent.exists():
                    os.mkdir(parent, 0o755)
                    if owner is not None:
                        os.lchown(parent, *owner)
            mode = int(item.get("mode") if item.get("mode") is not None else (0o755 if is_dir else 0o644)) & 0o7777
            if is_dir:
                if not dst.is_dir():
                    os.mkdir(dst, 0o755)
            else:
                shutil.copyfile(src_root / (item.get("stored_as") or item["path"]), dst, follow_symlinks=False)
            os.chmod(dst, mode)
            if owner is not None:
                os.lchown(dst, *owner)
        return []

    return write


async def probe_missing_reference(
    base: RunPlan,
    variant: TaskVariant,
    oracle_run: Path,
    task_path: Path,
    execute: Execute,
    *,
    oracle_scores: Sequence[float] | None = None,
    image_store: Any = None,
    probe: Probe | None = None,
    slots: Slots | asyncio.Semaphore | None = None,
) -> Outcome:
    """Run the oracle once more with its data source's reference gone (with `probe`:
    grade the oracle's deliverables without it, grading only). The grader must
    raise; a score below the oracle's means its failure became the candidate's
    score (it swallowed it). The oracle's own score means it reads nothing of what
    was removed."""
    o = Outcome(MISSING_REFERENCE, MISSING_REFERENCE_DESCRIPTION if probe is None else MISSING_REFERENCE_PROBE, SKIPPED)
    staged = _read_json(oracle_run / layout.EVIDENCE_DIR / Evidence.INPUT_STAGED) or {}
    spec = staged.get("source")
    if not spec:
        o.detail = "the task has no data source"
        return o
    if reference_from_source(oracle_run) == 0:
        o.detail = "no reference comes from the data source (start() writes it, or there is none)"
        return o
    # absolute: the spec below is read against the task folder, not the current one
    root = Path(tempfile.mkdtemp(prefix=".ale-noref-", dir=Path(base.runs_dir).resolve()))
    try:
        try:
            data = await asyncio.to_thread(stage_without_reference, str(spec), variant, task_path, root, image_store)
        except (DataError, OSError, ValueError) as e:
            o.verdict, o.detail = ERROR, f"could not stage the input without the reference: {e}"
            return o
        plan = unhurried(base).model_copy(
            update={"run_id": new_run_id(task_path.name, base.variant, f"adv-{MISSING_REFERENCE}"),
                    "data_source": data})
        result: Any = None
        async with (contextlib.nullcontext() if slots is None else
                    _hold(slots, Slots.LONG, Slots.PROBE if probe is not None else Slots.WHOLE)):
            t0 = asyncio.get_running_loop().time()
            try:
                if probe is not None:
                    owner = (base.policy.uid, base.policy.gid) if os.geteuid() == 0 else None
                    try:
                        result = await probe(plan, oracle_writer(oracle_run, owner), MISSING_REFERENCE)
                        o.kind = GRADING_PROBE
                    except NotOnHost as e:
                        o.note = ("run through the full lifecycle: the oracle's output cannot be written on the "
                                  f"host ({e})")
                if result is None:
                    result = await execute(plan)
            except Exception as e:  # a preflight refusal: the probe could not run
                o.verdict, o.detail = ERROR, f"{type(e).__name__}: {e}"[:300]
                return o
            finally:
                o.seconds = round(asyncio.get_running_loop().time() - t0, 2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    o.status, o.scores, o.score = result.status.value, result.scores, result.score
    if o.kind == GRADING_PROBE:
        _as_probe(o, result)
    else:
        o.run_dir = str(plan.run_dir)
    if result.status is RunStatus.GRADING_FAILED:
        o.verdict = GRADER_BUG if is_invalid_scores(result.error) else OK
        o.detail = "raised, as it must" if o.verdict == OK else (result.error or "")[:300]
    elif result.scores is not None and oracle_scores is not None and list(result.scores) == list(oracle_scores):
        o.verdict = OK
        o.detail = ("scored what the oracle scores without the data source's reference: the grader reads none of "
                    "it (start() writes what it compares with, or it grades from the input)")
    elif result.scores is not None:
        o.verdict = GRADER_BUG
        o.detail = (f"scored {result.scores} without its reference (the oracle scores {list(oracle_scores or [])}): "
                    "the evaluator's failure became a candidate's score (it swallows its own failure)")
    else:
        o.verdict = ERROR
        o.detail = f"{result.status.value}: {(result.error or '').strip()[:300]}"
    return o


# -- the whole check: stages, concurrently ----------------------------------------
def oracle_passes(result: RunResult) -> bool:
    return (result.status is RunStatus.SCORED and result.scores is not None
            and all(math.isclose(s, 1.0, abs_tol=SCORE_EPSILON) for s in result.scores))


def nop_passes(result: RunResult) -> bool:
    return result.status is RunStatus.SCORED and result.scores is not None and max(result.scores, default=0.0) <= 0.0


@dataclass
class StageTime:
    """One stage of the check: when it began (seconds after the check's start) and
    how long it took, wall-clock; stages of different variants overlap."""

    variant: int
    stage: str  # oracle | nop | adversarial | missing-reference
    kind: str  # run | grading-probe (adversarial: what its outputs ran as)
    started: float
    seconds: float
    count: int = 1  # how many runs or probes it holds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VariantCheck:
    variant: int
    task_id: str
    runs: dict[str, tuple[RunPlan, RunResult, bool]] = field(default_factory=dict)  # oracle, nop
    report: VariantReport | None = None
    skipped_adversarial: bool = False  # the oracle or nop failed: nothing to build outputs from

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"variant": self.variant, "task_id": self.task_id}
        for agent, (plan, result, ok) in self.runs.items():
            doc[agent] = {"status": result.status.value, "scores": result.scores, "ok": ok,
                          "run_dir": str(plan.run_dir),
                          "seconds": round((result.ended_at - result.started_at).total_seconds(), 2)}
        doc["adversarial"] = None if self.report is None else self.report.to_dict()
        return doc


@dataclass
class TaskCheck:
    variants: list[VariantCheck]
    stages: list[StageTime]
    seconds: float
    mode: str  # grading-probe | full-lifecycle: how the adversarial outputs ran
    jobs: int

    def timing(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 2), "mode": self.mode, "jobs": self.jobs,
                "stages": [st.to_dict() for st in self.stages]}


def _shape_of(run_dir: Path) -> str | None:
    return (_read_json(run_dir / layout.EVIDENCE_DIR / Evidence.HARNESS) or {}).get("run_shape")


async def check_task(
    task_path: Path,
    variants: Sequence[TaskVariant],
    plans: Sequence[tuple[RunPlan, RunPlan]],
    execute: Execute,
    *,
    probe: Probe | None = None,
    adversarial: bool = True,
    strategies: Sequence[Strategy] = CATALOGUE,
    jobs: int = 2,
    image_store: Any = None,
    say_run: Callable[[int, str, RunPlan, RunResult, bool], None] | None = None,
    say: Callable[[int, Outcome], None] | None = None,
) -> TaskCheck:
    """The whole check, its independent stages at once within `jobs` slots (one
    slot a sandbox lifecycle or a grading probe): each variant's oracle and nop
    runs (full lifecycles), then, once both pass, its adversarial outputs and the
    missing-reference probe (grading probes with `probe`, else replay runs);
    variants side by side. ``plans``: each variant's (oracle, nop) plan."""
    loop = asyncio.get_running_loop()
    t_start = loop.time()
    slots = Slots(jobs)
    stages: list[StageTime] = []

    async def timed(v: int, stage: str, kind: str, work: Awaitable[Any], count: int = 1) -> Any:
        t0 = loop.time()
        try:
            return await work
        finally:
            stages.append(StageTime(v, stage, kind, round(t0 - t_start, 2), round(loop.time() - t0, 2), count))

    async def run(plan: RunPlan) -> RunResult:
        async with slots.hold(Slots.FIRST):
            return await execute(plan)

    async def one_variant(v: int, variant: TaskVariant, oracle_plan: RunPlan, nop_plan: RunPlan) -> VariantCheck:
        check = VariantCheck(v, variant.task_id)

        async def base_run(agent: str, plan: RunPlan) -> None:
            result = await timed(v, agent, RUN, run(plan))
            ok = oracle_passes(result) if agent == "oracle" else nop_passes(result)
            check.runs[agent] = (plan, result, ok)
            if say_run is not None:
                say_run(v, agent, plan, result, ok)

        await asyncio.gather(base_run("oracle", oracle_plan), base_run("nop", nop_plan))
        check.runs = {a: check.runs[a] for a in ("oracle", "nop")}
        if not adversarial:
            return check
        (o_plan, o_result, o_ok), (_, n_result, n_ok) = check.runs["oracle"], check.runs["nop"]
        if not (o_ok and n_ok):
            check.skipped_adversarial = True
            return check
        facts = facts_from_oracle_run(variant, o_plan.run_dir)
        nop_score = n_result.score if n_result.score is not None else 0.0
        # a desktop task's grader reads the candidate's live desktop: only a run has one
        use = probe if probe is not None and _shape_of(o_plan.run_dir) in (None, "standard") else None
        kind = GRADING_PROBE if use is not None else RUN

        def tell(o: Outcome) -> None:
            if say is not None:
                say(v, o)

        n = sum(1 for st in strategies if st.actions(facts) is not None)
        outcomes, missing = await asyncio.gather(
            timed(v, "adversarial", kind, run_strategies(o_plan, facts, nop_score, execute, strategies=strategies,
                                                         say=tell, probe=use, slots=slots), n),
            timed(v, MISSING_REFERENCE, kind, probe_missing_reference(
                o_plan, variant, o_plan.run_dir, task_path, execute, oracle_scores=o_result.scores,
                image_store=image_store, probe=use, slots=slots)),
        )
        tell(missing)
        check.report = VariantReport(variant=v, nop_score=nop_score, outcomes=[*outcomes, missing])
        return check

    checks = await asyncio.gather(*(one_variant(v, variant, *plans[v]) for v, variant in enumerate(variants)))
    stages.sort(key=lambda st: (st.started, st.variant))
    return TaskCheck(list(checks), stages, loop.time() - t_start,
                     GRADING_PROBE if probe is not None else "full-lifecycle",
                     max(1, jobs))


# -- rendering ------------------------------------------------------------------
def _fmt_scores(o: Outcome) -> str:
    if o.scores is None:
        return "-"
    shown = ", ".join(f"{s:g}" for s in o.scores[:6]) + (", ..." if len(o.scores) > 6 else "")
    return f"{o.score:.3f} [{shown}]" if o.score is not None else f"[{shown}]"


def render_rows(report: VariantReport) -> list[tuple[str, str, str, str, str, str]]:
    """(strategy, status, scores, verdict, as, detail) per outcome; `as` says what
    produced it: a sealed ``run`` or a ``probe`` (grading only, no candidate sandbox)."""
    return [(o.strategy, o.status or "-", _fmt_scores(o), o.verdict,
             "-" if o.verdict == SKIPPED else ("probe" if o.kind == GRADING_PROBE else "run"),
             "; ".join(x for x in (o.detail, o.note) if x)) for o in report.outcomes]


def render_stages(check: TaskCheck) -> list[str]:
    """Each stage's wall time, per variant, and the whole check's."""
    lines = []
    for v in sorted({st.variant for st in check.stages}):
        parts = []
        for st in (x for x in check.stages if x.variant == v):
            what = f" ({st.count} {'probes' if st.kind == GRADING_PROBE else 'runs'})" \
                if st.stage == "adversarial" else ""
            parts.append(f"{st.stage} {st.seconds:.1f}s{what}")
        lines.append(f"  variant {v}: " + ", ".join(parts))
    how = "grading probes" if check.mode == GRADING_PROBE else "full sandbox lifecycles"
    lines.append(f"  total {check.seconds:.1f}s wall, --jobs {check.jobs}, adversarial outputs as {how}")
    return lines
