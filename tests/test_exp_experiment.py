"""Experiment files: validation messages, task lists, matrices, deterministic plans."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ale.runs.experiment import (
    ExperimentError,
    content_hash,
    load_experiment,
    plan_runs,
    plan_units,
    read_task_list,
)

MAIN = "def load():\n    return [{'description': 'a'}, {'description': 'b'}, {'description': 'c'}]\n\ndef evaluate(cfg, session):\n    return [1.0]\n"


def make_tasks(root: Path, names: list[str]) -> None:
    for n in names:
        d = root / n
        d.mkdir(parents=True, exist_ok=True)
        (d / "main.py").write_text(MAIN)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    make_tasks(tmp_path / "tasks", ["demo/hello", "demo/world", "other/x"])
    write(tmp_path / "lists" / "near.txt", "# near-term\ndemo/hello\n\ndemo/world  # trailing comment\n")
    return tmp_path


def test_minimal_experiment_plans_deterministically(tree: Path) -> None:
    f = write(tree / "exp.yaml", """
        name: demo
        tasks_root: tasks
        agents:
          - name: oracle
          - name: nop
        tasks:
          - lists/near.txt
        repeats: 2
    """)
    exp = load_experiment(f)
    units = plan_units(exp)
    assert [u.unit_id for u in units] == [
        "demo-hello-v0-oracle-r0", "demo-hello-v0-oracle-r1", "demo-hello-v0-nop-r0", "demo-hello-v0-nop-r1",
        "demo-world-v0-oracle-r0", "demo-world-v0-oracle-r1", "demo-world-v0-nop-r0", "demo-world-v0-nop-r1",
    ]
    plans = plan_runs(exp)
    assert plans[0].run_id == "demo-hello-v0-oracle-r0-a1"
    assert plans[0].attempt == 1 and plans[0].experiment == "demo"
    assert plans[0].task_dir == str((tree / "tasks" / "demo" / "hello").resolve())
    assert plans[0].runs_dir == str(tree / "results" / "demo" / "runs")
    assert units[0].plan_for(3).run_id == "demo-hello-v0-oracle-r0-a3"
    # Same file, same plan, same hash.
    again = load_experiment(f)
    assert [p.model_dump() for p in plan_runs(again)] == [p.model_dump() for p in plans]
    assert content_hash(again) == content_hash(exp)


def test_content_hash_ignores_concurrency_but_not_tasks(tree: Path) -> None:
    base = "name: d\ntasks_root: tasks\nagents: [{name: oracle}]\ntasks: [demo/hello]\n"
    h1 = content_hash(load_experiment(write(tree / "a.yaml", base)))
    h2 = content_hash(load_experiment(write(tree / "b.yaml", base + "concurrency: 7\n")))
    h3 = content_hash(load_experiment(write(tree / "c.yaml", base.replace("[demo/hello]", "[demo/hello, demo/world]"))))
    h4 = content_hash(load_experiment(write(tree / "d.yaml", base + "limits: {wall_time_s: 5}\n")))
    assert h1 == h2
    assert h1 != h3 and h1 != h4


def test_globs_variants_and_explicit_entries(tree: Path) -> None:
    f = write(tree / "exp.yaml", """
        name: g
        tasks_root: tasks
        agents: [{name: nop}]
        tasks:
          - glob: "demo/*"
            variants: [1, 0]
          - path: other/x
            variants: all
          - demo/hello          # already listed: first mention wins
    """)
    units = plan_units(load_experiment(f))
    got = [(u.task, u.variant) for u in units]
    assert got == [("demo/hello", 0), ("demo/hello", 1), ("demo/world", 0), ("demo/world", 1),
                   ("other/x", 0), ("other/x", 1), ("other/x", 2)]


def test_matrix_expands_agent_configs(tree: Path) -> None:
    f = write(tree / "exp.yaml", """
        name: m
        tasks_root: tasks
        agents:
          - name: llm
            label: gpt
            config: {max_output_tokens: 100}
            matrix: {model: [a, b], temperature: [0, 1]}
        tasks: [demo/hello]
    """)
    exp = load_experiment(f)
    specs = exp.agent_specs()
    assert [s.display for s in specs] == [
        "gpt[model=a,temperature=0]", "gpt[model=a,temperature=1]",
        "gpt[model=b,temperature=0]", "gpt[model=b,temperature=1]",
    ]
    assert specs[1].config == {"max_output_tokens": 100, "model": "a", "temperature": 1}
    ids = [u.unit_id for u in plan_units(exp)]
    assert ids[0] == "demo-hello-v0-gpt-model-a-temperature-0-r0"
    assert len(set(ids)) == 4


def test_unknown_key_names_key_location_and_suggestion(tree: Path) -> None:
    f = write(tree / "exp.yaml", """
        name: bad
        agents: [{name: nop, lable: x}]
        tasks: [tasks/demo/hello]
        enviroment: {image: foo}
    """)
    with pytest.raises(ExperimentError) as e:
        load_experiment(f)
    msg = str(e.value)
    assert "unknown key 'lable' in agents[0]; did you mean 'label'?" in msg
    assert "unknown key 'enviroment' in (top level); did you mean 'environment'?" in msg
    assert str(f) in msg


def test_nested_and_inline_policy_errors(tree: Path) -> None:
    f = write(tree / "exp.yaml", """
        name: bad
        agents: [{name: nop}]
        tasks: [tasks/demo/hello]
        limits: {wall_time: 5}
        environment:
          policy: {pids_limt: 10}
    """)
    with pytest.raises(ExperimentError, match=r"unknown key 'wall_time' in limits; did you mean 'wall_time_s'\?"):
        load_experiment(f)
    f2 = write(tree / "exp2.yaml", """
        name: bad
        agents: [{name: nop}]
        tasks: [tasks/demo/hello]
        environment:
          policy: {pids_limt: 10}
    """)
    with pytest.raises(ExperimentError, match=r"unknown key 'pids_limt' in environment.policy; did you mean 'pids_limit'\?"):
        load_experiment(f2)


def test_policy_file_resolves_relative_to_experiment(tree: Path) -> None:
    write(tree / "conf" / "policy.yaml", "pids_limit: 99\nmemory_bytes: 1073741824\ncpus: 1\n")
    f = write(tree / "exp.yaml", """
        name: p
        tasks_root: tasks
        agents: [{name: nop}]
        tasks: [demo/hello]
        environment: {policy: conf/policy.yaml, image: "img:1", data_source: "local:/data"}
        output: out/here
    """)
    exp = load_experiment(f)
    plan = plan_runs(exp)[0]
    assert plan.policy.pids_limit == 99 and plan.image == "img:1" and plan.data_source == "local:/data"
    assert exp.output_dir == tree / "out" / "here"



def test_a_relative_data_source_resolves_against_the_experiment_file(tree: Path, monkeypatch) -> None:
    f = write(tree / "conf" / "exp.yaml", """
        name: d
        tasks_root: ../tasks
        agents: [{name: nop}]
        tasks: [demo/hello]
        environment: {data_source: "local:../data#layout=ale"}
    """)
    monkeypatch.chdir("/")
    plan = plan_runs(load_experiment(f))[0]
    assert plan.data_source == f"local:{(tree / 'data').resolve()}#layout=ale"

@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("name: 'has space'\nagents: [{name: nop}]\ntasks: [tasks/demo/hello]\n", "name: Value error, name 'has space'"),
        ("name: x\nagents: []\ntasks: [tasks/demo/hello]\n", "agents: List should have at least 1 item"),
        ("name: x\nagents: [{name: nop}]\ntasks: [tasks/nope]\n", "has no main.py"),
        ("name: x\nagents: [{name: nop}]\ntasks: [{glob: 'tasks/zzz*'}]\n", "matches no task folder"),
        ("name: x\nagents: [{name: nop}]\ntasks: [{path: a, glob: b}]\n", "exactly one of 'list', 'glob' or 'path'"),
        ("name: x\nagents: [{name: nop}, {name: nop}]\ntasks: [tasks/demo/hello]\n", "both produce the label 'nop'"),
        ("name: x\nagents: [{name: nop}]\ntasks: [tasks/demo/hello]\nrepeats: 0\n", "repeats: Input should be greater than or equal to 1"),
        ("- just a list\n", "must be a mapping"),
        ("name: x\nagents: [{name: nop}]\ntasks: [missing.txt]\n", "cannot read task list"),
    ],
)
def test_validation_messages(tree: Path, body: str, expected: str) -> None:
    f = write(tree / "exp.yaml", body)
    with pytest.raises(ExperimentError) as e:
        plan_units(load_experiment(f))
    assert expected in str(e.value)


def test_yaml_task_list_with_variants(tree: Path) -> None:
    lst = write(tree / "lists" / "sel.yaml", "- path: demo/hello\n  variants: [0, 2]\n- demo/world\n")
    entries = read_task_list(lst)
    assert [(e.path, e.variants) for e in entries] == [("demo/hello", (0, 2)), ("demo/world", None)]
    f = write(tree / "exp.yaml", "name: y\ntasks_root: tasks\nagents: [{name: nop}]\ntasks: [lists/sel.yaml]\n")
    assert [(u.task, u.variant) for u in plan_units(load_experiment(f))] == [
        ("demo/hello", 0), ("demo/hello", 2), ("demo/world", 0)]
