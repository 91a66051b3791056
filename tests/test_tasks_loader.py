"""Loading task folders: discovery, cua_bench stand-in, ALE trees, variants, errors."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import types
from pathlib import Path

import pytest

from ale.data.base import VariantKey
from ale.tasks.loader import (
    TaskError,
    call_task_fn,
    load_task,
    load_variants,
    select_variant,
    task_code_hash,
)
from ale.tasks.runtime import cua_bench as compat


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def make_task(root: Path, main: str, domain: str = "demo", name: str = "t1") -> Path:
    task = root / domain / name
    write(task / "main.py", main)
    return task


@pytest.fixture
def clean_cua_bench():
    """Each test starts without `cua_bench` in sys.modules; the previous entry returns after."""
    saved = sys.modules.pop("cua_bench", None)
    yield
    sys.modules.pop("cua_bench", None)
    if saved is not None:
        sys.modules["cua_bench"] = saved


DECORATED = """
import cua_bench as cb

@cb.tasks_config(split="train")
def make_variants():
    return [cb.Task(description="do it", metadata={"variant": "base"})]

@cb.setup_task
async def prepare(cfg, session):
    return "prepared"

@cb.evaluate_task(split="train")
async def grade(cfg, session):
    return [1.0]

@cb.solve_task
def oracle(cfg, session):
    return "solved"

def evaluate(cfg, session):  # an unmarked name does not beat a mark
    return [0.0]
"""

NAMED = """
def load():
    return [{"description": "plain", "metadata": {}}]

def evaluate(cfg, session):
    return [0.5]
"""


# -- discovery -------------------------------------------------------------------
def test_functions_found_by_decorator_mark(tmp_path, clean_cua_bench):
    defn = load_task(make_task(tmp_path, DECORATED))
    assert defn.load_fn.__name__ == "make_variants"
    assert defn.start_fn.__name__ == "prepare"
    assert defn.evaluate_fn.__name__ == "grade"
    assert defn.solve_fn.__name__ == "oracle"
    assert defn.main_file == (tmp_path / "demo" / "t1" / "main.py").resolve()
    assert defn.name == "demo/t1"
    assert asyncio.run(call_task_fn(defn.evaluate_fn, None, None)) == [1.0]


def test_functions_found_by_ale_name(tmp_path, clean_cua_bench):
    defn = load_task(make_task(tmp_path, NAMED))
    assert defn.load_fn.__name__ == "load"
    assert defn.evaluate_fn.__name__ == "evaluate"
    assert defn.start_fn is None and defn.solve_fn is None
    (v,) = load_variants(defn)
    assert v.description == "plain" and v.cfg == {"description": "plain", "metadata": {}}


def test_two_marked_functions_of_one_kind_prefer_the_ale_name(tmp_path, clean_cua_bench):
    src = """
    import cua_bench as cb
    @cb.evaluate_task(split="train")
    def evaluate(cfg, s): return [1.0]
    @cb.evaluate_task(split="test")
    def evaluate_test(cfg, s): return [0.0]
    def load(): return [cb.Task(description="x")]
    """
    assert load_task(make_task(tmp_path, src)).evaluate_fn.__name__ == "evaluate"


def test_two_marked_functions_without_the_name_are_ambiguous(tmp_path, clean_cua_bench):
    src = """
    import cua_bench as cb
    @cb.evaluate_task
    def grade_a(cfg, s): return [1.0]
    @cb.evaluate_task
    def grade_b(cfg, s): return [0.0]
    def load(): return [cb.Task(description="x")]
    """
    with pytest.raises(
        TaskError,
        match=r"main\.py: several functions are marked @cb.evaluate_task \(grade_a, grade_b\)",
    ):
        load_task(make_task(tmp_path, src))


def test_module_names_are_unique_and_dataclasses_work(tmp_path, clean_cua_bench):
    src = """
    from __future__ import annotations
    from dataclasses import dataclass, field
    import cua_bench as cb

    @dataclass
    class Cfg:
        name: str = "x"
        tags: list[str] = field(default_factory=list)

    def load():
        return [cb.Task(description=Cfg().name)]

    def evaluate(cfg, s):
        return [1.0]
    """
    task = make_task(tmp_path, src)
    a, b = load_task(task), load_task(task)
    assert a.module is not b.module and a.module.__name__ != b.module.__name__
    assert sys.modules[a.module.__name__] is a.module


# -- cua_bench stand-in ----------------------------------------------------------
def test_import_cua_bench_works_without_the_package(tmp_path, clean_cua_bench):
    defn = load_task(make_task(tmp_path, DECORATED))
    assert sys.modules["cua_bench"] is compat
    assert defn.module.cb is compat


def test_real_cua_bench_is_used_when_present(tmp_path, monkeypatch, clean_cua_bench):
    pkg = tmp_path / "site" / "cua_bench"
    write(
        pkg / "__init__.py",
        """
        REAL = True

        class Task:
            def __init__(self, description="", task_id=None, metadata=None, computer=None):
                self.description, self.task_id, self.metadata = description, task_id, metadata or {}

        def _mark(kind):
            def outer(fn=None, **kw):
                def deco(f):
                    f._td_type = kind
                    return f
                return deco(fn) if callable(fn) else deco
            return outer

        tasks_config = _mark("tasks_config")
        setup_task = _mark("setup_task")
        evaluate_task = _mark("evaluate_task")
        solve_task = _mark("solve_task")
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    defn = load_task(make_task(tmp_path / "tasks_root", DECORATED))
    assert getattr(defn.module.cb, "REAL", False) is True
    assert sys.modules["cua_bench"] is not compat
    (v,) = load_variants(defn)
    assert type(v.cfg).__module__ == "cua_bench"


def test_an_already_imported_cua_bench_is_kept(tmp_path, clean_cua_bench):
    fake = types.ModuleType("cua_bench")
    for k in ("tasks_config", "setup_task", "evaluate_task", "solve_task", "Task"):
        setattr(fake, k, getattr(compat, k))
    sys.modules["cua_bench"] = fake
    defn = load_task(make_task(tmp_path, DECORATED))
    assert defn.module.cb is fake


# -- ALE tree layout -------------------------------------------------------------
COMMON_CONFIG = """
from __future__ import annotations
import os
from dataclasses import dataclass

@dataclass
class GeneralTaskConfig:
    REMOTE_OUTPUT_DIR: str = "output"
    DOMAIN_NAME: str = ""
    TASK_NAME: str = ""
    VARIANT_NAME: str = "base"
    TREE: str = "{tree}"

    @property
    def task_dir(self) -> str:
        return f"/data/{{self.DOMAIN_NAME}}/{{self.TASK_NAME}}/{{self.VARIANT_NAME}}"

    def to_metadata(self) -> dict:
        return {{
            "task_dir": self.task_dir,
            "input_dir": f"{{self.task_dir}}/input",
            "reference_dir": f"{{self.task_dir}}/reference",
            "remote_output_dir": f"{{self.task_dir}}/{{self.REMOTE_OUTPUT_DIR}}",
            "variant": self.VARIANT_NAME,
            "tree": self.TREE,
        }}
"""

ALE_MAIN = """
from __future__ import annotations
import logging
from dataclasses import dataclass
import cua_bench as cb
from tasks.common_config import GeneralTaskConfig

@dataclass
class TaskConfig(GeneralTaskConfig):
    DOMAIN_NAME: str = "demo"
    TASK_NAME: str = "t1"

    @property
    def task_description(self) -> str:
        return f"write {self.task_dir}/output/answer.txt"

@cb.tasks_config(split="train")
def load():
    cfg = TaskConfig()
    return [cb.Task(description=cfg.task_description, metadata=cfg.to_metadata(),
                    computer={"provider": "computer", "setup_config": {"os_type": "linux"}})]

@cb.setup_task(split="train")
async def start(task_cfg, session: cb.DesktopSession):
    pass

@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session: cb.DesktopSession) -> list[float]:
    return [1.0]
"""


def make_ale_tree(root: Path, tree: str) -> Path:
    write(root / "tasks" / "__init__.py", "")
    write(root / "tasks" / "common_config.py", COMMON_CONFIG.format(tree=tree))
    return make_task(root / "tasks", ALE_MAIN)


def test_ale_tree_layout_imports_tasks_package(tmp_path, clean_cua_bench):
    task = make_ale_tree(tmp_path / "repo", "one")
    path_before = list(sys.path)
    defn = load_task(task)
    assert sys.path == path_before
    assert "tasks" not in sys.modules and "tasks.common_config" not in sys.modules
    (v,) = load_variants(defn)
    assert v.input_dir == "/data/demo/t1/base/input"
    assert v.output_dir == "/data/demo/t1/base/output"
    assert v.reference_dir == "/data/demo/t1/base/reference"
    assert v.metadata["tree"] == "one"
    assert v.data_key == VariantKey("demo", "t1", "base")


def test_ale_tree_restores_previous_tasks_module_and_trees_do_not_leak(
    tmp_path, monkeypatch, clean_cua_bench
):
    sentinel = types.ModuleType("tasks")
    monkeypatch.setitem(sys.modules, "tasks", sentinel)
    a = load_task(make_ale_tree(tmp_path / "a", "one"))
    assert sys.modules["tasks"] is sentinel
    b = load_task(make_ale_tree(tmp_path / "b", "two"))
    assert sys.modules["tasks"] is sentinel
    assert load_variants(a)[0].metadata["tree"] == "one"
    assert load_variants(b)[0].metadata["tree"] == "two"


def test_task_importing_tasks_outside_a_tree_says_so(tmp_path, clean_cua_bench):
    src = "from tasks.common_config import GeneralTaskConfig\ndef load(): return []\ndef evaluate(c, s): return []\n"
    with pytest.raises(
        TaskError, match=r"main\.py: import failed: .*sits in no tree: no ancestor folder is named tasks"
    ):
        load_task(make_task(tmp_path, src))


# -- load() and variants ----------------------------------------------------------
def test_load_is_called_once_and_cfg_is_the_original_object(tmp_path, clean_cua_bench):
    src = """
    import secrets
    import cua_bench as cb
    CALLS = 0

    @cb.tasks_config
    def load():
        global CALLS
        CALLS += 1
        return [cb.Task(description="copy", metadata={"token": secrets.token_hex(8)})]

    @cb.evaluate_task
    def evaluate(cfg, s): return [1.0]
    """
    defn = load_task(make_task(tmp_path, src))
    assert defn.module.CALLS == 0
    variants = load_variants(defn)
    assert defn.module.CALLS == 1
    v = select_variant(variants, 0)
    assert defn.module.CALLS == 1
    assert v.cfg.metadata["token"] == v.metadata["token"]
    assert isinstance(v.cfg, compat.Task)


def test_variant_defaults_and_data_keys(tmp_path, clean_cua_bench):
    src = """
    import cua_bench as cb
    def load():
        return [
            cb.Task(description="a"),
            cb.Task(description="b", task_id="custom/id", metadata={"task_tag": "tagged"}),
            cb.Task(description="c", metadata={"data_domain": "dd", "data_task": "tt", "data_variant": "vv",
                                               "variant": "ignored"}),
            {"description": "d", "input_dir": "/in/", "remote_output_dir": "/out", "reference_dir": "/ref"},
        ]
    def evaluate(cfg, s): return [1.0]
    """
    variants = load_variants(load_task(make_task(tmp_path, src, domain="science", name="sim")))
    a, b, c, d = variants
    assert (a.index, a.input_dir, a.output_dir, a.reference_dir) == (
        0,
        "/input",
        "/workspace",
        "/reference",
    )
    assert a.data_key == VariantKey("science", "sim", "0") and a.task_id == "science/sim/0"
    assert b.data_key == VariantKey("science", "sim", "tagged") and b.task_id == "custom/id"
    assert c.data_key == VariantKey("dd", "tt", "vv")
    assert (d.input_dir, d.output_dir, d.reference_dir) == ("/in", "/out", "/ref")
    assert d.metadata == {"input_dir": "/in/", "remote_output_dir": "/out", "reference_dir": "/ref"}
    assert d.data_key.relpath == "tasks/science/sim/3"


def test_async_load_is_awaited_outside_an_event_loop(tmp_path, clean_cua_bench):
    src = """
    import cua_bench as cb
    async def load(): return [cb.Task(description="async")]
    def evaluate(cfg, s): return [1.0]
    """
    (v,) = load_variants(load_task(make_task(tmp_path, src)))
    assert v.description == "async"


def test_select_variant_out_of_range_names_the_file(tmp_path, clean_cua_bench):
    defn = load_task(make_task(tmp_path, DECORATED))
    variants = load_variants(defn)
    with pytest.raises(TaskError) as e:
        select_variant(variants, 3)
    assert "variant 3 out of range (task has 1 variants: 0..0)" in str(e.value)
    assert str(defn.main_file) in str(e.value)
    with pytest.raises(TaskError, match="variant -1 out of range"):
        select_variant(variants, -1)


def test_call_task_fn_runs_sync_and_async():
    async def a(x, y):
        return x + y

    def s(x, y):
        return x * y

    assert asyncio.run(call_task_fn(a, 2, 3)) == 5
    assert asyncio.run(call_task_fn(s, 2, 3)) == 6


# -- malformed tasks -----------------------------------------------------------------
EVAL = "def evaluate(cfg, s): return [1.0]\n"


@pytest.mark.parametrize(
    ("main", "pattern"),
    [
        ("def load(:\n  pass\n", r"main\.py: syntax error at line 1"),
        (
            "import no_such_module_for_ale_tests\n",
            r"main\.py: import failed: No module named 'no_such_module_for_ale_tests'",
        ),
        (
            "raise RuntimeError('boom')\n",
            r"main\.py: raised RuntimeError while being imported: boom",
        ),
        ("import sys\nsys.exit(3)\n", r"main\.py: raised SystemExit while being imported"),
        ("def load(): return [{'description': 'x'}]\n", r"main\.py: defines no evaluate\(\)"),
        (EVAL, r"main\.py: defines no load\(\)"),
    ],
)
def test_malformed_main_raises_task_error_naming_the_file(tmp_path, clean_cua_bench, main, pattern):
    task = make_task(tmp_path, main)
    with pytest.raises(TaskError, match=pattern) as e:
        load_task(task)
    assert str(task.resolve() / "main.py") in str(e.value)


@pytest.mark.parametrize(
    ("load_body", "pattern"),
    [
        ("return []", r"load\(\) returned no variants"),
        ("return {'description': 'x'}", r"load\(\) must return a list of variants, got dict"),
        ("return None", r"load\(\) must return a list of variants, got NoneType"),
        ("raise KeyError('cfg')", r"load\(\) raised KeyError"),
        ("return [42]", r"variant 0 is a int; expected a cb.Task"),
        ("return [{'description': ''}]", r"variant 0 has an empty description"),
        ("return [{'description': 'x', 'metadata': 'nope'}]", r"variant 0 metadata must be a dict"),
        (
            "return [{'description': 'x', 'metadata': {'input_dir': 'input'}}]",
            r"'input_dir' must be an absolute POSIX path.*'input'",
        ),
        (
            "return [{'description': 'x', 'metadata': {'remote_output_dir': 'E:\\\\agenthle\\\\out'}}]",
            r"'remote_output_dir' must be an absolute POSIX path",
        ),
        (
            "return [{'description': 'x', 'metadata': {'reference_dir': '/a/../etc'}}]",
            r"'reference_dir' must not contain '\.\.'",
        ),
        (
            "return [{'description': 'x', 'metadata': {'input_dir': '/'}}]",
            r"must not be the container's root",
        ),
        (
            "return [{'description': 'x', 'metadata': {'input_dir': '/w/in', 'remote_output_dir': '/w'}}]",
            r"input_dir '/w/in' and remote_output_dir '/w' overlap",
        ),
        (
            "return [{'description': 'x', 'metadata': {'variant': 'a/b'}}]",
            r"data variant 'a/b' is not usable",
        ),
    ],
)
def test_bad_variants_raise_task_error_naming_the_file(
    tmp_path, clean_cua_bench, load_body, pattern
):
    task = make_task(tmp_path, f"def load():\n    {load_body}\n{EVAL}")
    defn = load_task(task)
    with pytest.raises(TaskError, match=pattern) as e:
        load_variants(defn)
    assert str(defn.main_file) in str(e.value)


def test_missing_folder_or_main(tmp_path):
    with pytest.raises(TaskError, match="no such directory"):
        load_task(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match=r"empty/main\.py: missing"):
        load_task(tmp_path / "empty")


def test_bad_card_fails_the_load(tmp_path, clean_cua_bench):
    task = make_task(tmp_path, NAMED)
    (task / "task_card.json").write_text('{"vm": {"timeout_s": "soon"}}')
    with pytest.raises(TaskError, match=r"task_card\.json: vm\.timeout_s must be a number"):
        load_task(task)


# -- code hash -----------------------------------------------------------------------
def test_code_hash_covers_every_file_but_pycache(tmp_path, clean_cua_bench):
    task = make_task(tmp_path, NAMED)
    h0 = load_task(task).code_hash
    assert h0 == task_code_hash(task)
    write(task / "__pycache__" / "main.cpython-311.pyc", "junk")
    assert task_code_hash(task) == h0
    write(task / "helpers" / "data.txt", "1")
    h1 = task_code_hash(task)
    assert h1 != h0
    (task / "helpers" / "data.txt").write_text("2")
    assert task_code_hash(task) not in (h0, h1)
    (task / "helpers" / "data.txt").unlink()
    assert task_code_hash(task) == h0  # files count, empty folders do not
    (task / "task_card.json").write_text("{}")
    assert task_code_hash(task) != h0
