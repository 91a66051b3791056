"""Load a task folder (ALE / cua-bench format) and describe its variants.

A task is a folder with ``main.py`` and optionally ``task_card.json``. Its
functions are found by the cua-bench decorator mark (``fn._td_type``) and, for
ALE files, by name: ``load`` (variants), ``start`` (setup, optional),
``evaluate`` (grader) and ``solve`` (oracle, optional).

Runs use ``ale.tasks.process``: the task's code in its own interpreter, one per
run. This module is the harness-side half both share: the variant rules (paths
inside the sandbox, data keys, the public package) and, for unit tests of task
code, an in-process ``load_task``. The import rules themselves live in
``runtime/_ale_task_worker/importer.py`` (standard library only).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from ale.data.base import VariantKey
from ale.defaults import DEFAULT_INPUT_DIR, DEFAULT_OUTPUT_DIR
from ale.tasks.card import TaskCard, load_card
from ale.tasks.errors import TaskError
from ale.tasks.runtime._ale_task_worker import importer

DEFAULT_REFERENCE_DIR = "/reference"

_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._+-]+$")


@dataclass
class TaskDefinition:
    """A loaded task folder: its module, its functions, its card and a code hash."""

    path: Path
    main_file: Path
    module: ModuleType
    load_fn: Callable[..., Any]
    start_fn: Callable[..., Any] | None
    evaluate_fn: Callable[..., Any]
    solve_fn: Callable[..., Any] | None
    card: TaskCard
    code_hash: str  # sha256 over every file in the task folder (see task_code_hash)

    @property
    def name(self) -> str:
        """``<domain>/<task>``: the folder's parent and own name."""
        return f"{self.path.parent.name}/{self.path.name}"


@dataclass
class TaskVariant:
    """One variant of a task, as the harness uses it."""

    index: int
    task_id: str
    description: str  # the agent's prompt
    metadata: dict[str, Any]
    cfg: Any  # the object load() returned; passed unchanged to start/evaluate/solve
    input_dir: str
    output_dir: str
    reference_dir: str
    data_key: VariantKey
    main_file: Path | None = None  # the task's main.py, for error messages
    task_dir: str | None = None  # ALE: <root>/<domain>/<task>/<variant>, holding input/ software/ output/
    software_dir: str | None = None
    computer: dict[str, Any] | None = None  # cua-bench's computer spec (provider, setup_config.os_type)

    @property
    def public_root(self) -> str:
        """Where the public package is mounted (read-only): the task folder for ALE
        tasks (``input/``, ``software/`` and the workspace's mount point inside),
        else the input folder itself."""
        return self.task_dir or self.input_dir

    def public_relpath(self, container_path: str) -> str | None:
        """``container_path`` relative to the public root, or None when outside it."""
        root = self.public_root
        if container_path == root:
            return "."
        if container_path.startswith(root.rstrip("/") + "/"):
            return container_path[len(root.rstrip("/")) + 1 :]
        return None


# -- hashing ---------------------------------------------------------------------
def task_code_hash(task_dir: str | Path) -> str:
    """sha256 over every file in the folder, by sorted relative path.

    Each entry contributes ``relpath NUL sha256(content) LF``; symlinks contribute
    their target text instead of being followed; ``__pycache__`` folders and
    ``.pyc`` files are left out (they change whenever the task is imported).
    """
    root = Path(task_dir)
    entries: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for d in dirnames:
            full = Path(dirpath) / d
            if full.is_symlink():
                rel = full.relative_to(root).as_posix()
                entries.append((rel, "symlink:" + os.readlink(full)))
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                entries.append((rel, "symlink:" + os.readlink(full)))
                continue
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for chunk in iter(partial(f.read, 1 << 20), b""):
                    h.update(chunk)
            entries.append((rel, h.hexdigest()))
    outer = hashlib.sha256()
    for rel, digest in sorted(entries):
        outer.update(rel.encode() + b"\0" + digest.encode() + b"\n")
    return outer.hexdigest()


def load_task(task_dir: str | Path) -> TaskDefinition:
    """Import ``task_dir/main.py`` in this process and find its functions; read its card.

    Raises ``TaskError`` naming the file for a missing folder or main.py, a syntax
    or import error, or a missing ``load``/``evaluate``. For unit tests of task
    code only: runs execute task code in a task process (``ale.tasks.process``).
    """
    path = Path(task_dir).expanduser().resolve()
    if not path.is_dir():
        raise TaskError(f"{path}: not a task folder (no such directory)")
    card = load_card(path)
    main, module, fns = importer.load_module(path)
    return TaskDefinition(
        path=path,
        main_file=main,
        module=module,
        load_fn=fns["load"],
        start_fn=fns.get("start"),
        evaluate_fn=fns["evaluate"],
        solve_fn=fns.get("solve"),
        card=card,
        code_hash=task_code_hash(path),
    )


# -- variants --------------------------------------------------------------------
def _container_dir(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise TaskError(f"{where}: metadata {key!r} must be a non-empty string path, got {value!r}")
    if "\\" in value or not value.startswith("/"):
        raise TaskError(
            f"{where}: metadata {key!r} must be an absolute POSIX path inside the container, got {value!r}"
        )
    if ".." in value.split("/"):
        raise TaskError(f"{where}: metadata {key!r} must not contain '..', got {value!r}")
    norm = posixpath.normpath(value)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if norm == "/":
        raise TaskError(f"{where}: metadata {key!r} must not be the container's root '/'")
    return norm


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _segment(value: Any, what: str, where: str) -> str:
    text = str(value)
    if not _SEGMENT_RE.match(text) or text in (".", ".."):
        raise TaskError(
            f"{where}: {what} {text!r} is not usable as a data folder name (letters, digits, . _ + - only)"
        )
    return text


def describe_variant(
    task_path: Path, main_file: Path, fields: tuple[str, str | None, dict[str, Any], Any], index: int, cfg: Any = None
) -> TaskVariant:
    """The harness's view of one variant, from what ``load()`` returned for it
    (``importer.variant_fields``): its paths inside the sandbox, checked, and its
    data key. ``TaskError`` names the file and the value at fault."""
    where = f"{main_file} load()"
    description, task_id, meta, computer = fields
    input_dir = _container_dir(meta.get("input_dir", DEFAULT_INPUT_DIR), "input_dir", where)
    output_dir = _container_dir(meta.get("remote_output_dir", DEFAULT_OUTPUT_DIR), "remote_output_dir", where)
    reference_dir = _container_dir(meta.get("reference_dir", DEFAULT_REFERENCE_DIR), "reference_dir", where)
    for (ka, a), (kb, b) in itertools.combinations(
        (("input_dir", input_dir), ("remote_output_dir", output_dir), ("reference_dir", reference_dir)), 2
    ):
        if _nested(a, b):
            raise TaskError(
                f"{where}: variant {index}: {ka} {a!r} and {kb} {b!r} overlap; they must be separate folders"
            )
    task_dir = _container_dir(meta["task_dir"], "task_dir", where) if meta.get("task_dir") else None
    software_dir = _container_dir(meta["software_dir"], "software_dir", where) if meta.get("software_dir") else None
    if task_dir is not None and not _inside(input_dir, task_dir):
        task_dir = None  # the input lives elsewhere: the public package is the input alone
    if task_dir is not None and (reference_dir == task_dir or not _inside(reference_dir, task_dir)) \
            and _inside(task_dir, reference_dir):
        raise TaskError(f"{where}: variant {index}: task_dir {task_dir!r} lies inside reference_dir {reference_dir!r}")
    variant_name = next(
        (meta[k] for k in ("data_variant", "variant", "task_tag", "variant_name") if meta.get(k) not in (None, "")),
        str(index),
    )
    key = VariantKey(
        domain=_segment(meta.get("data_domain") or meta.get("domain_name") or task_path.parent.name,
                        "data domain", where),
        task=_segment(meta.get("data_task") or meta.get("task_name") or task_path.name, "data task", where),
        variant=_segment(variant_name, "data variant", where),
    )
    return TaskVariant(
        index=index,
        task_id=task_id or f"{key.domain}/{key.task}/{key.variant}",
        description=description,
        metadata=meta,
        cfg=cfg,
        input_dir=input_dir,
        output_dir=output_dir,
        reference_dir=reference_dir,
        data_key=key,
        main_file=main_file,
        task_dir=task_dir,
        software_dir=software_dir,
        computer=computer if isinstance(computer, dict) else None,
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def load_variants(defn: TaskDefinition) -> list[TaskVariant]:
    """Call the task's ``load()`` once (in this process) and describe each variant.

    The caller keeps the list for every phase: ``load()`` may draw random values
    (a per-run secret), so calling it again would give a different task.
    """
    items = importer.call_load(defn.load_fn, defn.main_file)
    where = f"{defn.main_file} load()"
    return [
        describe_variant(defn.path, defn.main_file, importer.variant_fields(item, i, where), i, cfg=item)
        for i, item in enumerate(items)
    ]


def select_variant(variants: list[TaskVariant], index: int) -> TaskVariant:
    n = len(variants)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
        span = f"0..{n - 1}" if n else "none"
        source = next((v.main_file for v in variants if v.main_file is not None), None)
        prefix = f"{source}: " if source is not None else ""
        raise TaskError(f"{prefix}variant {index} out of range (task has {n} variants: {span})")
    return variants[index]


call_task_fn = importer.call_task_fn
