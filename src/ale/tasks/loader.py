"""Load a task folder (ALE / cua-bench format) and its variants.

A task is a folder with ``main.py`` and optionally ``task_card.json``. Its
functions are found by the cua-bench decorator mark (``fn._td_type``) and, for
ALE files, by name: ``load`` (variants), ``start`` (setup, optional),
``evaluate`` (grader) and ``solve`` (oracle, optional).

Import rules:

- ``import cua_bench as cb`` works without the upstream package: when
  ``cua_bench`` cannot be found, the stand-in ``ale.tasks.compat.cua_bench`` is
  registered under that name (and only then).
- A task inside an ALE tree (an ancestor directory ``tasks`` with
  ``__init__.py``, e.g. ``<root>/tasks/<domain>/<name>/main.py`` doing
  ``from tasks.common_config import ...``) is imported with ``<root>`` on
  ``sys.path``; afterwards the path entry is removed and whatever ``tasks``
  modules were loaded before are put back, so trees never leak into each other.
  Limitation: a ``tasks.*`` import executed lazily inside a task function at call
  time does not see the tree.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import itertools
import os
import posixpath
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from ale.data.base import VariantKey
from ale.defaults import DEFAULT_INPUT_DIR, DEFAULT_OUTPUT_DIR
from ale.tasks.card import TaskCard, load_card
from ale.tasks.compat import cua_bench as compat
from ale.tasks.errors import TaskError

MAIN_FILE = "main.py"
TD_TYPES = {
    "tasks_config": "load",
    "setup_task": "start",
    "evaluate_task": "evaluate",
    "solve_task": "solve",
}
DEFAULT_REFERENCE_DIR = "/reference"

_module_counter = itertools.count(1)
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


# -- import machinery ------------------------------------------------------------
def ensure_cua_bench() -> None:
    """Make ``import cua_bench`` work: the stand-in, only when no real one exists."""
    if "cua_bench" in sys.modules:
        return
    if importlib.util.find_spec("cua_bench") is not None:
        return

    sys.modules["cua_bench"] = compat


def find_tasks_tree_root(task_dir: Path) -> Path | None:
    """The root of an ALE tree holding ``task_dir``: the parent of the nearest
    ancestor named ``tasks`` that is a package (has ``__init__.py``)."""
    for parent in task_dir.parents:
        if parent.name == "tasks" and (parent / "__init__.py").is_file():
            return parent.parent
    return None


def _is_tasks_module(name: str) -> bool:
    return name == "tasks" or name.startswith("tasks.")


@contextmanager
def _tree_on_path(root: Path | None) -> Iterator[None]:
    if root is None:
        yield
        return
    saved = {k: v for k, v in sys.modules.items() if _is_tasks_module(k)}
    for k in saved:
        del sys.modules[k]
    entry = str(root)
    sys.path.insert(0, entry)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        with suppress(ValueError):
            sys.path.remove(entry)
        for k in [k for k in sys.modules if _is_tasks_module(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


def _module_name(task_dir: Path) -> str:
    safe = re.sub(r"[^A-Za-z0-9_]", "_", f"{task_dir.parent.name}_{task_dir.name}")[:60]
    return f"_ale_task_{safe}_{next(_module_counter)}"


def _import_main(main: Path, tree_root: Path | None) -> ModuleType:
    name = _module_name(main.parent)
    spec = importlib.util.spec_from_file_location(name, main)
    if spec is None or spec.loader is None:
        raise TaskError(f"{main}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec: dataclasses and pickling look the module up by name.
    sys.modules[name] = module
    try:
        with _tree_on_path(tree_root):
            spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        where = f"line {e.lineno}" if e.lineno else "unknown line"
        src = Path(e.filename) if e.filename else main
        detail = f" (in {src})" if src.resolve() != main.resolve() else ""
        raise TaskError(f"{main}: syntax error at {where}{detail}: {e.msg}") from e
    except ImportError as e:
        sys.modules.pop(name, None)
        hint = ""
        if getattr(e, "name", None) and _is_tasks_module(e.name or "") and tree_root is None:
            hint = " (the task imports `tasks.*` but sits in no tree with a tasks/__init__.py)"
        raise TaskError(f"{main}: import failed: {e}{hint}") from e
    except (Exception, SystemExit) as e:
        sys.modules.pop(name, None)
        raise TaskError(f"{main}: raised {type(e).__name__} while being imported: {e}") from e
    return module


def _find_functions(module: ModuleType, main: Path) -> dict[str, Callable[..., Any]]:
    """Role -> function: by decorator mark first, then by the ALE name."""
    found: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
    for attr, value in vars(module).items():
        kind = getattr(value, "_td_type", None) if callable(value) else None
        if isinstance(kind, str) and kind in TD_TYPES:
            found.setdefault(TD_TYPES[kind], []).append((attr, value))
    out: dict[str, Callable[..., Any]] = {}
    for role, candidates in found.items():
        # The same function bound to two names is one function.
        unique = list({id(fn): (attr, fn) for attr, fn in candidates}.values())
        if len(unique) == 1:
            out[role] = unique[0][1]
            continue
        named = [fn for attr, fn in unique if attr == role]
        if len(named) == 1:
            out[role] = named[0]
            continue
        names = ", ".join(sorted(attr for attr, _ in unique))
        kind = next(k for k, r in TD_TYPES.items() if r == role)
        raise TaskError(
            f"{main}: several functions are marked @cb.{kind} ({names}); keep one, or name it {role}()"
        )
    for role in TD_TYPES.values():
        if role not in out:
            fn = getattr(module, role, None)
            if callable(fn) and not isinstance(fn, type):
                out[role] = fn
    return out


def load_task(task_dir: str | Path) -> TaskDefinition:
    """Import ``task_dir/main.py`` and find its functions; read its card.

    Raises ``TaskError`` naming the file for a missing folder or main.py, a syntax
    or import error, or a missing ``load``/``evaluate``.
    """
    path = Path(task_dir).expanduser().resolve()
    if not path.is_dir():
        raise TaskError(f"{path}: not a task folder (no such directory)")
    main = path / MAIN_FILE
    if not main.is_file():
        raise TaskError(f"{main}: missing (a task folder needs a main.py)")
    card = load_card(path)
    code_hash = task_code_hash(path)
    ensure_cua_bench()
    module = _import_main(main, find_tasks_tree_root(path))
    fns = _find_functions(module, main)
    if "load" not in fns:
        raise TaskError(
            f"{main}: defines no load() (a function returning the variants, @cb.tasks_config)"
        )
    if "evaluate" not in fns:
        raise TaskError(f"{main}: defines no evaluate() (the grader, @cb.evaluate_task)")
    return TaskDefinition(
        path=path,
        main_file=main,
        module=module,
        load_fn=fns["load"],
        start_fn=fns.get("start"),
        evaluate_fn=fns["evaluate"],
        solve_fn=fns.get("solve"),
        card=card,
        code_hash=code_hash,
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


def _variant_fields(item: Any, index: int, where: str) -> tuple[str, str | None, dict[str, Any]]:
    if isinstance(item, Mapping):
        description = item.get("description", "")
        task_id = item.get("task_id")
        if "metadata" in item:
            metadata = item["metadata"]
        else:
            metadata = {
                k: v for k, v in item.items() if k not in ("description", "task_id", "computer")
            }
    elif any(hasattr(item, a) for a in ("description", "task_id", "metadata")):
        description = getattr(item, "description", "")
        task_id = getattr(item, "task_id", None)
        metadata = getattr(item, "metadata", None)
    else:
        raise TaskError(
            f"{where}: variant {index} is a {type(item).__name__}; expected a cb.Task "
            "(description, task_id, metadata) or a dict"
        )
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise TaskError(
            f"{where}: variant {index} metadata must be a dict, got {type(metadata).__name__}"
        )
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise TaskError(
            f"{where}: variant {index} description must be a string, got {type(description).__name__}"
        )
    if not description.strip():
        raise TaskError(f"{where}: variant {index} has an empty description (the agent's prompt)")
    if task_id is not None and not isinstance(task_id, str):
        task_id = str(task_id)
    return description, task_id, dict(metadata)


def _make_variant(defn: TaskDefinition, item: Any, index: int) -> TaskVariant:
    where = f"{defn.main_file} load()"
    description, task_id, meta = _variant_fields(item, index, where)
    input_dir = _container_dir(meta.get("input_dir", DEFAULT_INPUT_DIR), "input_dir", where)
    output_dir = _container_dir(
        meta.get("remote_output_dir", DEFAULT_OUTPUT_DIR), "remote_output_dir", where
    )
    reference_dir = _container_dir(
        meta.get("reference_dir", DEFAULT_REFERENCE_DIR), "reference_dir", where
    )
    for (ka, a), (kb, b) in itertools.combinations(
        (
            ("input_dir", input_dir),
            ("remote_output_dir", output_dir),
            ("reference_dir", reference_dir),
        ),
        2,
    ):
        if _nested(a, b):
            raise TaskError(
                f"{where}: variant {index}: {ka} {a!r} and {kb} {b!r} overlap; they must be separate folders"
            )
    variant_name = next(
        (
            meta[k]
            for k in ("data_variant", "variant", "task_tag", "variant_name")
            if meta.get(k) not in (None, "")
        ),
        str(index),
    )
    key = VariantKey(
        domain=_segment(meta.get("data_domain") or defn.path.parent.name, "data domain", where),
        task=_segment(meta.get("data_task") or defn.path.name, "data task", where),
        variant=_segment(variant_name, "data variant", where),
    )
    return TaskVariant(
        index=index,
        task_id=task_id or f"{key.domain}/{key.task}/{key.variant}",
        description=description,
        metadata=meta,
        cfg=item,
        input_dir=input_dir,
        output_dir=output_dir,
        reference_dir=reference_dir,
        data_key=key,
        main_file=defn.main_file,
    )


def _call_load(defn: TaskDefinition) -> Any:
    try:
        result = defn.load_fn()
        if inspect.isawaitable(result):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(_await(result))
            if inspect.iscoroutine(result):
                result.close()
            raise TaskError(
                f"{defn.main_file}: load() is async and an event loop is already running; make load() synchronous"
            )
        return result
    except TaskError:
        raise
    except Exception as e:
        raise TaskError(f"{defn.main_file}: load() raised {type(e).__name__}: {e}") from e


async def _await(aw: Any) -> Any:
    return await aw


def load_variants(defn: TaskDefinition) -> list[TaskVariant]:
    """Call the task's ``load()`` once and describe each variant.

    The caller keeps the list for every phase: ``load()`` may draw random values
    (a per-run secret), so calling it again would give a different task.
    """
    result = _call_load(defn)
    if not isinstance(result, list | tuple):
        raise TaskError(
            f"{defn.main_file}: load() must return a list of variants, got {type(result).__name__}"
        )
    if not result:
        raise TaskError(f"{defn.main_file}: load() returned no variants (an empty list)")
    return [_make_variant(defn, item, i) for i, item in enumerate(result)]


def select_variant(variants: list[TaskVariant], index: int) -> TaskVariant:
    n = len(variants)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
        span = f"0..{n - 1}" if n else "none"
        source = next((v.main_file for v in variants if v.main_file is not None), None)
        prefix = f"{source}: " if source is not None else ""
        raise TaskError(f"{prefix}variant {index} out of range (task has {n} variants: {span})")
    return variants[index]


async def call_task_fn(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a task function, sync or async alike, and return its result."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
