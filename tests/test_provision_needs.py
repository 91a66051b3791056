"""Where a task's software needs come from, merged with their origins: the card's
``software`` list, a variant's ``input/runtime_env/`` manifests, ale's own cards'
``environment`` block, an operator's overlay; and ``ale task list --json``'s
``software`` field. Task trees written here; no Docker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ale.provision.needs import Provisioning, listing_software, resolve_needs, software_summary
from ale.provision.sources import ProvisionError, load_overlay, parse_overlay

MAIN = """\
import cua_bench as cb

@cb.tasks_config(split="train")
def load():
    return [cb.Task(description="d", metadata={})]

@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session):
    return [0.0]
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def task(root: Path, name: str, card: dict) -> Path:
    d = root / "lab" / name
    write(d / "main.py", MAIN)
    write(d / "task_card.json", json.dumps(card))
    return d


LINUX = {"snapshot": "cpu-free-ubuntu"}


def test_a_task_declaring_pandas_and_a_debian_tool(tmp_path: Path) -> None:
    d = task(tmp_path, "intervals", {"vm": LINUX, "software": ["Python", "pandas", "BEDTools", "NumPy"]})
    p = resolve_needs(d)
    assert p.complete and p.declared == ["Python", "pandas", "BEDTools", "NumPy"]
    assert p.spec.debian == ("bedtools",) and p.spec.python == ("pandas",)
    by = {n.name: n for n in p.needs}
    assert by["pandas"].origin == "task_card.json:software"
    assert by["pandas"].provided_by.python == ["pandas"] and by["pandas"].check == 'python3 -c "import pandas"'
    assert by["BEDTools"].provided_by.debian == ["bedtools"]
    assert by["Python"].provided_by.base and by["NumPy"].provided_by.base
    assert software_summary(p) == {"declared": ["Python", "pandas", "BEDTools", "NumPy"],
                                   "provisioned": ["Python", "pandas", "BEDTools", "NumPy"], "missing": []}


def test_unknown_and_unprovidable_names_are_reported(tmp_path: Path) -> None:
    d = task(tmp_path, "mixed", {"vm": LINUX, "software": [
        "R", "Frobnicator 9000", "Docker", "Amber 22 / SLURM", "Python (`software/python`)", "Python 3.9"]})
    p = resolve_needs(d)
    assert not p.complete
    missing = {m.name: m for m in p.missing}
    assert set(missing) == {"Frobnicator 9000", "Docker", "Amber 22", "SLURM", "Python 3.9"}
    assert missing["Frobnicator 9000"].kind == "unknown" and "not in the catalogue" in missing["Frobnicator 9000"].why
    assert missing["Docker"].kind == "container"
    assert missing["Amber 22"].declared_as == "Amber 22 / SLURM"
    (ships,) = [n for n in p.needs if n.name == "Python (`software/python`)"]
    assert ships.source == "task-data" and ships.provided_by.model_dump(exclude_defaults=True) == {}
    summary = software_summary(p)
    assert summary["provisioned"] == ["R", "Python (`software/python`)"]
    assert summary["by_task_data"][0]["name"] == "Python (`software/python`)"
    assert {"name": "Docker", "why": missing["Docker"].why} in summary["missing"]
    assert p.spec.debian == ("r-base",)


def test_a_variants_runtime_env_manifests_go_to_the_store_with_lock_files(tmp_path: Path) -> None:
    d = task(tmp_path, "with_env", {"vm": LINUX, "software": ["Python"]})
    inp = tmp_path / "data" / "with_env" / "base" / "input"
    write(inp / "runtime_env" / "requirements.txt",
          "# pinned\npandas==2.2.3\nscipy>=1.10 ; python_version >= '3.9'\n--index-url https://example.invalid\n")
    write(inp / "runtime_env" / "pyproject.toml", '[project]\nname = "x"\nversion = "0"\nrequires-python = ">=3.10"\n'
          'dependencies = ["statsmodels>=0.14"]\n[dependency-groups]\ndev = ["pytest"]\n')
    write(inp / "runtime_env" / "uv.lock", 'version = 1\n[[package]]\nname = "statsmodels"\nversion = "0.14.4"\n')
    p = resolve_needs(d, input_dir=inp)
    assert p.spec.store_only == ("pandas==2.2.3", "pytest", 'scipy>=1.10; python_version >= "3.9"', "statsmodels>=0.14")
    assert p.spec.python == ("uv",)  # uv sync needs uv
    assert [lf.name for lf in p.spec.lockfiles] == ["pyproject.toml", "requirements.txt", "uv.lock"]
    assert {lf.origin for lf in p.spec.lockfiles} == {
        "input/runtime_env/requirements.txt", "input/runtime_env/pyproject.toml", "input/runtime_env/uv.lock"}
    by = {n.name: n for n in p.needs}
    assert by["pandas==2.2.3"].origin == "input/runtime_env/requirements.txt"
    assert by["requires-python >=3.10"].provided_by.base
    # an option line is not silently skipped
    assert [m.kind for m in p.missing] == ["invalid"] and "--index-url" in p.missing[0].why
    assert p.declared == ["Python"]  # manifests are needs, not the card's declared names


def test_a_graders_uv_run_with_requirements_go_to_the_store(tmp_path: Path) -> None:
    """ALE's moodle grader runs `uv run --with pandas==2.2.3` offline in the grading
    sandbox: the pinned version (not the card's latest pandas) must be in the store."""
    d = task(tmp_path, "moodle", {"vm": LINUX, "software": ["Python", "pandas", "uv"]})
    write(d / "main.py", MAIN + """
async def grade(session, meta):
    await session.run_command(
        f'cd /tmp && uv run --isolated --no-project --with pandas==2.2.3 --python "/usr/bin/python" '
        f'python score.py --with-care {meta["x"]}')
""")
    write(d / "scripts" / "run.sh", "uvx --with 'numpy<3' --with=scipy python -c pass\n")
    write(d / "scripts" / "notes.py", "# --with pandas==1.0 in a file that never runs uv is not a need\n")
    p = resolve_needs(d)
    assert p.complete and p.spec.python == ("pandas", "uv")
    assert set(p.spec.store_only) == {"pandas==2.2.3", "numpy<3", "scipy"}
    by = {n.name: n.origin for n in p.needs}
    assert by["pandas==2.2.3"] == "main.py: uv run --with" and by["numpy<3"] == "scripts/run.sh: uv run --with"
    assert "pandas==2.2.3" not in software_summary(p)["declared"]
    assert [n.origin for n in p.needs if n.name == "pandas"] == ["task_card.json:software"]  # already there: no second need


def _requiring_python(tmp_path: Path, spec: str) -> Provisioning:
    """What a task with no software of its own resolves to when its variant's
    runtime_env/pyproject.toml says ``requires-python = spec``."""
    d = task(tmp_path, "py", {"vm": LINUX})
    write(tmp_path / "input" / "runtime_env" / "pyproject.toml",
          f'[project]\nname = "x"\nversion = "0"\nrequires-python = "{spec}"\n')
    return resolve_needs(d, input_dir=tmp_path / "input")


def test_runtime_env_asking_for_another_python_is_missing(tmp_path: Path) -> None:
    p = _requiring_python(tmp_path, "==3.9.*")
    assert [m.kind for m in p.missing] == ["version"] and "3.11" in p.missing[0].why


def test_runtime_env_asking_for_an_older_python_gets_an_ubuntu_releases(tmp_path: Path) -> None:
    p = _requiring_python(tmp_path, "==3.10.*")
    assert p.complete and p.spec.python_version == "3.10"


def test_runtime_env_asking_for_a_newer_python_gets_the_oldest_release_that_meets_it(tmp_path: Path) -> None:
    p = _requiring_python(tmp_path, ">=3.12")
    assert p.complete and p.spec.python_version == "3.12"
    assert _requiring_python(tmp_path, ">=3.13").spec.python_version == "3.13"


def test_an_environment_block_is_read(tmp_path: Path) -> None:
    d = task(tmp_path, "own", {"software": ["pandas"], "environment": {
        "debian": ["bedtools"], "python": ["scipy>=1.10"], "store_only": ["polars"],
        "python_version": "3.11", "lockfile": "env/uv.lock"}})
    write(d / "env" / "uv.lock", "version = 1\n")
    p = resolve_needs(d)
    assert p.complete
    assert p.spec.debian == ("bedtools",) and p.spec.python == ("pandas", "scipy>=1.10")
    assert p.spec.store_only == ("polars",) and p.spec.python_version is None  # 3.11 is the base
    assert [(lf.name, lf.text) for lf in p.spec.lockfiles] == [("uv.lock", "version = 1\n")]
    assert {n.origin for n in p.needs if n.name != "pandas"} == {"task_card.json:environment"}
    assert p.declared == ["pandas", "bedtools", "scipy>=1.10", "polars", "Python 3.11", "env/uv.lock"]


def test_an_environment_block_naming_an_image(tmp_path: Path) -> None:
    d = task(tmp_path, "img", {"software": ["pandas", "Docker"], "environment": {"image": "example/ale-env:1"}})
    p = resolve_needs(d)
    assert p.image == "example/ale-env:1" and p.spec.empty and p.complete
    assert {n.provided_by.image for n in p.needs} == {"example/ale-env:1"}


@pytest.mark.parametrize(("block", "message"), [
    ({"debian": ["bedtools"], "pip": ["x"]}, r"task_card.json: environment: unknown key 'pip'"),
    ({"debian": ["Not Valid"]}, r"task_card.json: environment.debian: 'Not Valid' is not a Debian package name"),
    ({"python": ["pandas >>> 2"]}, r"environment.python: .*not a PEP 508 requirement"),
    ({"python_version": "three"}, r"environment.python_version: 'three' is not a Python version"),
    ({"image": "x:1", "debian": ["curl"]}, r"image names a ready image; it cannot be combined with debian"),
    ({"lockfile": "../../outside.lock"}, r"environment.lockfile '../../outside.lock' leaves the task folder"),
    ([], r"environment must be an object"),
])
def test_a_bad_environment_block_is_refused_naming_the_card(tmp_path: Path, block: object, message: str) -> None:
    d = task(tmp_path, "bad", {"environment": block})
    with pytest.raises(ProvisionError, match=message) as e:
        resolve_needs(d)
    assert str(d / "task_card.json") in str(e.value)


def test_an_overlay_adds_needs_and_mappings(tmp_path: Path) -> None:
    a = task(tmp_path, "alpha", {"vm": LINUX, "software": ["GrowthBook", "Frobnicator"]})
    b = task(tmp_path, "beta", {"vm": LINUX, "software": ["Python 3.9"]})
    ov_file = write(tmp_path / "overlay.yaml", """\
all:
  python: [rich]
tasks:
  "lab/alpha":
    software: [Frobnicator]
    debian: [jq]
mappings:
  Frobnicator: {debian: [frob-tools], check: "frob --version"}
python_versions: ["3.9"]
""")
    ov = load_overlay(ov_file)
    pa = resolve_needs(a, overlay=ov)
    assert pa.complete, pa.missing
    assert pa.spec.debian == ("frob-tools", "jq") and pa.spec.python == ("growthbook", "rich")
    origins = {(n.name, n.origin) for n in pa.needs}
    assert ("rich", f"overlay {ov_file}:all") in origins
    assert ("jq", f"overlay {ov_file}:tasks[lab/alpha]") in origins
    assert ("Frobnicator", "task_card.json:software") in origins
    pb = resolve_needs(b, overlay=ov)
    assert pb.complete and pb.spec.python_version == "3.9" and pb.spec.debian == ()
    assert resolve_needs(b).missing[0].kind == "version"  # without the overlay


def test_a_bad_overlay_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match=r"o.yaml: tasks.x.pip: unknown key"):
        parse_overlay({"tasks": {"x": {"pip": ["a"]}}}, "o.yaml")
    with pytest.raises(ProvisionError, match=r"o.yaml: mappings.Foo.debian: 'Bad Name' is not a Debian package name"):
        parse_overlay({"mappings": {"Foo": {"debian": ["Bad Name"]}}}, "o.yaml")
    bad = write(tmp_path / "bad.yaml", "all: [\n")
    with pytest.raises(ProvisionError, match="invalid YAML"):
        load_overlay(bad)


def test_listing_software_reports_a_bad_block_without_failing(tmp_path: Path) -> None:
    d = task(tmp_path, "bad", {"environment": {"nope": 1}})
    sw = listing_software(d)
    assert sw is not None and "unknown key 'nope'" in sw["error"]


def test_task_list_json_has_the_software_field(tmp_path: Path) -> None:
    task(tmp_path, "good", {"vm": LINUX, "software": ["pandas", "BEDTools"]})
    task(tmp_path, "partial", {"vm": LINUX, "software": ["R", "Docker"]})
    task(tmp_path, "windows", {"vm": {"snapshot": "cpu-free"}, "software": ["Excel"]})
    p = subprocess.run([sys.executable, "-m", "ale.cli", "task", "list", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(p.stdout)}
    assert rows["good"]["software"] == {"declared": ["pandas", "BEDTools"], "provisioned": ["pandas", "BEDTools"], "missing": []}
    sw = rows["partial"]["software"]
    assert sw["declared"] == ["R", "Docker"] and sw["provisioned"] == ["R"]
    assert [m["name"] for m in sw["missing"]] == ["Docker"] and "container" in sw["missing"][0]["why"]
    assert rows["windows"]["status"] == "unsupported" and rows["windows"]["software"]["declared"] == ["Excel"]
    human = subprocess.run([sys.executable, "-m", "ale.cli", "task", "list", str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert human.returncode == 0, human.stderr
    assert "software 1/2 (missing: Docker)" in human.stdout and "software 2/2" in human.stdout
    assert "software: 1 of 2 ok task(s) have every declared name provisioned; 1 distinct name(s) missing" in human.stderr


def test_the_corpus_bench_counts_a_tree(tmp_path: Path) -> None:
    task(tmp_path, "good", {"vm": LINUX, "software": ["pandas", "NCBI BLAST+"]})
    task(tmp_path, "bad", {"vm": LINUX, "software": ["Docker"]})
    task(tmp_path, "windows", {"vm": {"snapshot": "cpu-free"}, "software": ["Excel"]})
    bench = Path(__file__).resolve().parents[1] / "bench" / "corpus_software.py"
    p = subprocess.run([sys.executable, str(bench), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("2 task(s); 3 distinct declared name(s); 1 fully provisioned, 1 not")
    assert "lab/bad: Docker" in p.stdout and "container    Docker: a nested container runtime" in p.stdout
