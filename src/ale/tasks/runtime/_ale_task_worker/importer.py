"""Import a task folder's ``main.py`` and find its functions (standard library only).

Runs in the task process (``serve.py``) with the task tree's own interpreter, and
in the harness for unit tests of task code (``ale.tasks.loader``).

- ``import cua_bench as cb`` works without the upstream package: when no
  ``cua_bench`` can be imported, the stand-in next to this package is used.
- A task inside an ALE tree (an ancestor folder named ``tasks``, a PEP 420
  namespace package or a regular one, e.g. ``<root>/tasks/<domain>/<name>/main.py``
  doing ``from tasks.linux_runtime import LinuxTaskConfig``) is imported with
  ``<root>`` on ``sys.path``. In the task process it stays there for the process's
  life, so ``tasks.*`` imports executed lazily inside task functions see the tree.
  In the harness (``persistent=False``) the entry is removed afterwards and the
  ``tasks`` modules loaded before are put back.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType
from typing import Any

MAIN_FILE = "main.py"
TD_TYPES = {
    "tasks_config": "load",
    "setup_task": "start",
    "evaluate_task": "evaluate",
    "solve_task": "solve",
}
ROLES = tuple(TD_TYPES.values())
_RUNTIME_DIR = Path(__file__).resolve().parent.parent
_module_counter = itertools.count(1)


class TaskError(ValueError):
    """A task folder is malformed: the message names the file and what is wrong."""


def ensure_cua_bench() -> None:
    """Make ``import cua_bench`` work: the stand-in, only when no real one exists."""
    if "cua_bench" in sys.modules:
        return
    if importlib.util.find_spec("cua_bench") is not None:
        return
    loaded = sys.modules.get("ale.tasks.runtime.cua_bench")  # the harness's own copy, when in it
    if loaded is not None:
        sys.modules["cua_bench"] = loaded
        return
    spec = importlib.util.spec_from_file_location("cua_bench", _RUNTIME_DIR / "cua_bench" / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cua_bench"] = module
    spec.loader.exec_module(module)


def find_tree_root(task_dir: Path) -> Path | None:
    """The root of an ALE tree holding ``task_dir``: the parent of the nearest
    ancestor folder named ``tasks`` (with or without ``__init__.py``)."""
    for parent in task_dir.parents:
        if parent.name == "tasks" and parent.is_dir():
            return parent.parent
    return None


def _is_tasks_module(name: str) -> bool:
    return name == "tasks" or name.startswith("tasks.")


@contextmanager
def _tree_on_path(root: Path | None, persistent: bool) -> Iterator[None]:
    if root is None:
        yield
        return
    entry = str(root)
    if persistent:
        if entry not in sys.path:
            sys.path.insert(0, entry)
        importlib.invalidate_caches()
        yield
        return
    saved = {k: v for k, v in sys.modules.items() if _is_tasks_module(k)}
    for k in saved:
        del sys.modules[k]
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


def import_main(main: Path, tree_root: Path | None, *, persistent: bool = False) -> ModuleType:
    """Import ``main`` as a fresh module; ``TaskError`` (naming the file) on any failure."""
    name = _module_name(main.parent)
    spec = importlib.util.spec_from_file_location(name, main)
    if spec is None or spec.loader is None:
        raise TaskError(f"{main}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec: dataclasses and pickling look the module up by name.
    sys.modules[name] = module
    try:
        with _tree_on_path(tree_root, persistent):
            spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        where = f"line {e.lineno}" if e.lineno else "unknown line"
        src = Path(e.filename) if e.filename else main
        detail = f" (in {src})" if src.resolve() != main.resolve() else ""
        raise TaskError(f"{main}: syntax error at {where}{detail}: {e.msg}") from e
    except ImportError as e:
        sys.modules.pop(name, None)
        raise TaskError(f"{main}: import failed: {e}{import_hint(e, tree_root)}") from e
    except (Exception, SystemExit) as e:
        sys.modules.pop(name, None)
        raise TaskError(f"{main}: raised {type(e).__name__} while being imported: {e}") from e
    return module


def import_hint(e: ImportError, tree_root: Path | None) -> str:
    """What to do about an ImportError: a ``tasks.*`` module outside a tree, or a
    missing third-party package (which the tree's environment should declare)."""
    missing = getattr(e, "name", None) or ""
    if _is_tasks_module(missing) and tree_root is None:
        return " (the task imports `tasks.*` but sits in no tree: no ancestor folder is named tasks)"
    if isinstance(e, ModuleNotFoundError) and missing and not _is_tasks_module(missing):
        top = missing.split(".")[0]
        package = PACKAGE_OF.get(top, top)
        return (
            f" (module {top!r} is not installed in the task environment: add {package!r} to the dependencies "
            "in the tree's pyproject.toml (tasks/pyproject.toml), then `ale task env TASK_DIR` builds it)"
        )
    return ""


# Import names whose PyPI distribution is called otherwise (what the hint names).
PACKAGE_OF = {
    "computer": "cua-computer", "cv2": "opencv-python-headless", "PIL": "pillow", "skimage": "scikit-image",
    "sklearn": "scikit-learn", "fitz": "PyMuPDF", "pymupdf": "PyMuPDF", "yaml": "pyyaml", "dotenv": "python-dotenv",
    "bs4": "beautifulsoup4", "Bio": "biopython", "docx": "python-docx", "pptx": "python-pptx",
}


def find_functions(module: ModuleType, main: Path) -> dict[str, Callable[..., Any]]:
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
    for role in ROLES:
        if role not in out:
            fn = getattr(module, role, None)
            if callable(fn) and not isinstance(fn, type):
                out[role] = fn
    if "load" not in out:
        raise TaskError(f"{main}: defines no load() (a function returning the variants, @cb.tasks_config)")
    if "evaluate" not in out:
        raise TaskError(f"{main}: defines no evaluate() (the grader, @cb.evaluate_task)")
    return out


def load_module(task_dir: Path, *, persistent: bool = False) -> tuple[Path, ModuleType, dict[str, Callable[..., Any]]]:
    """Import ``task_dir/main.py`` and find its functions: (main, module, functions)."""
    path = Path(task_dir).expanduser().resolve()
    if not path.is_dir():
        raise TaskError(f"{path}: not a task folder (no such directory)")
    main = path / MAIN_FILE
    if not main.is_file():
        raise TaskError(f"{main}: missing (a task folder needs a main.py)")
    ensure_cua_bench()
    module = import_main(main, find_tree_root(path), persistent=persistent)
    return main, module, find_functions(module, main)


def call_load(load_fn: Callable[..., Any], main: Path) -> list[Any]:
    """Call ``load()`` (sync or async, outside any event loop) and return its list."""
    try:
        result = load_fn()
        if inspect.isawaitable(result):
            import asyncio  # only for an async load(): a task process starts faster without it

            try:
                asyncio.get_running_loop()
            except RuntimeError:
                result = asyncio.run(_await(result))
            else:
                if inspect.iscoroutine(result):
                    result.close()
                raise TaskError(
                    f"{main}: load() is async and an event loop is already running; make load() synchronous"
                )
    except TaskError:
        raise
    except Exception as e:
        raise TaskError(f"{main}: load() raised {type(e).__name__}: {e}") from e
    if not isinstance(result, list | tuple):
        raise TaskError(f"{main}: load() must return a list of variants, got {type(result).__name__}")
    if not result:
        raise TaskError(f"{main}: load() returned no variants (an empty list)")
    return list(result)


async def _await(aw: Any) -> Any:
    return await aw


def variant_fields(item: Any, index: int, where: str) -> tuple[str, str | None, dict[str, Any], Any]:
    """(description, task_id, metadata, computer) of one item ``load()`` returned."""
    computer = None
    if isinstance(item, Mapping):
        description = item.get("description", "")
        task_id = item.get("task_id")
        computer = item.get("computer")
        if "metadata" in item:
            metadata = item["metadata"]
        else:
            metadata = {k: v for k, v in item.items() if k not in ("description", "task_id", "computer")}
    elif any(hasattr(item, a) for a in ("description", "task_id", "metadata")):
        description = getattr(item, "description", "")
        task_id = getattr(item, "task_id", None)
        metadata = getattr(item, "metadata", None)
        computer = getattr(item, "computer", None)
    else:
        raise TaskError(
            f"{where}: variant {index} is a {type(item).__name__}; expected a cb.Task "
            "(description, task_id, metadata) or a dict"
        )
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise TaskError(f"{where}: variant {index} metadata must be a dict, got {type(metadata).__name__}")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise TaskError(f"{where}: variant {index} description must be a string, got {type(description).__name__}")
    if not description.strip():
        raise TaskError(f"{where}: variant {index} has an empty description (the agent's prompt)")
    if task_id is not None and not isinstance(task_id, str):
        task_id = str(task_id)
    return description, task_id, dict(metadata), computer


async def call_task_fn(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a task function, sync or async alike, and return its result."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
