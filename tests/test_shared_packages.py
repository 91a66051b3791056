"""Runs of the same variant share one staged, hashed, read-only public package
(ale.runs.packages): real runs, real overlay mounts (root)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs import packages
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import MIB, IsolationPolicy
from ale.status import RunStatus
from tests.conftest import EXAMPLES, TOOLS_IMAGE, require

pytestmark = pytest.mark.docker

MAIN = '''
import cua_bench as cb

@cb.tasks_config
def load():
    return [cb.Task(description="copy /input/data.txt to /workspace/out.txt", task_id="share-0",
                    metadata={"input_dir": "/input", "remote_output_dir": "/workspace", "reference_dir": "/reference",
                              "variant": "base"})]

@cb.setup_task
async def start(cfg, session):
    if WRITE:
        await session.write_file("/input/from_start.txt", "written by start()")

@cb.evaluate_task
async def evaluate(cfg, session):
    want = (await session.read_file("/reference/want.txt")).strip()
    got = (await session.read_file("/workspace/out.txt")).strip() if await session.file_exists("/workspace/out.txt") else ""
    return [1.0 if got == want else 0.0]
'''


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    require(os.geteuid() == 0, "shared packages mount overlays: root only")
    root = tmp_path / "package-cache"
    monkeypatch.setenv("ALE_PACKAGE_CACHE", str(root))
    monkeypatch.delenv("ALE_SHARED_PACKAGES", raising=False)
    return root


def tree(tmp_path: Path, *, write: bool = False, name: str = "share") -> Path:
    task = tmp_path / "tasks" / "dom" / name
    task.mkdir(parents=True)
    (task / "main.py").write_text(MAIN.replace("WRITE", repr(write)))
    (task / "task_card.json").write_text(json.dumps({"title": "share", "data_source": "local:../../../data"}))
    variant = tmp_path / "data" / "tasks" / "dom" / name / "base"
    (variant / "input").mkdir(parents=True)
    (variant / "input" / "data.txt").write_text("forty-two\n")
    (variant / "reference").mkdir()
    (variant / "reference" / "want.txt").write_text("forty-two\n")
    return task


def run(task: Path, tmp_path: Path, docker_client, steps: list[dict] | None = None):
    plan = RunPlan(run_id=f"p-{uuid.uuid4().hex[:8]}", task_dir=str(task),
                   agent=AgentSpec(name="replay", config={"steps": steps or [
                       {"tool": "shell", "args": {"command": "cp /input/data.txt /workspace/out.txt; ls /input"}}]}),
                   image=TOOLS_IMAGE, policy=IsolationPolicy(memory_bytes=512 * MIB), runs_dir=str(tmp_path / "runs"))
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.status, result.error, result.violations)
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
    staged = json.loads((plan.run_dir / "evidence" / "input-staged.json").read_text())
    after = json.loads((plan.run_dir / "evidence" / "input-after-start.json").read_text())
    steps_out = json.loads((plan.run_dir / "trajectory.json").read_text())["steps"]
    return staged, after, steps_out[0]["stdout"]


def entries(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")] if cache.is_dir() else []


def test_runs_of_a_variant_share_one_package_and_record_the_same_input(tmp_path, docker_client, cache, monkeypatch) -> None:
    task = tree(tmp_path)
    a, a_tree, _ = run(task, tmp_path, docker_client)
    b, b_tree, _ = run(task, tmp_path, docker_client)
    assert a["shared_package"]["key"] == b["shared_package"]["key"] and len(entries(cache)) == 1
    assert a_tree["digest"] == b_tree["digest"]
    monkeypatch.setenv("ALE_SHARED_PACKAGES", "off")  # the same input, staged by the run itself
    c, c_tree, _ = run(task, tmp_path, docker_client)
    assert "shared_package" not in c and c_tree == a_tree


def test_what_start_writes_stays_in_its_run(tmp_path, docker_client, cache) -> None:
    task = tree(tmp_path, write=True)
    a, a_tree, listing = run(task, tmp_path, docker_client)
    assert "from_start.txt" in listing and "from_start.txt" in a_tree["files"]
    (entry,) = entries(cache)
    assert not (entry / "public" / "from_start.txt").exists()  # the shared package is untouched
    pkg = packages.SharedPackage(entry.name, entry, json.loads((entry / "meta.json").read_text()), None)
    assert pkg.unchanged() and "from_start.txt" not in pkg.meta["public_tree"]["files"]


def test_a_changed_source_gets_a_new_package(tmp_path, docker_client, cache) -> None:
    task = tree(tmp_path)
    a, _, _ = run(task, tmp_path, docker_client)
    data = tmp_path / "data" / "tasks" / "dom" / "share" / "base" / "input" / "data.txt"
    data.write_text("forty-two\n")  # same bytes, a new file version: a new fingerprint
    b, _, _ = run(task, tmp_path, docker_client)
    assert a["shared_package"]["key"] != b["shared_package"]["key"]


def test_a_package_changed_on_disk_is_never_reused(tmp_path, docker_client, cache) -> None:
    task = tree(tmp_path)
    a, a_tree, _ = run(task, tmp_path, docker_client)
    (entry,) = entries(cache)
    target = entry / "public" / "data.txt"
    os.chmod(target, 0o644)
    target.write_text("tampered\n")
    b, b_tree, listing = run(task, tmp_path, docker_client)  # scores 1.0: it saw the real input again
    assert b["shared_package"]["created_at"] != a["shared_package"]["created_at"] and b_tree == a_tree
    assert (entry / "public" / "data.txt").read_text() == "forty-two\n"


def test_the_cache_is_bounded_and_cleanup_removes_what_no_run_uses(tmp_path, docker_client, cache, monkeypatch) -> None:
    for n in range(2):
        run(tree(tmp_path, name=f"share{n}"), tmp_path, docker_client)
    assert len(entries(cache)) == 2
    monkeypatch.setenv("ALE_PACKAGE_CACHE_MAX_BYTES", "1")
    run(tree(tmp_path, name="share2"), tmp_path, docker_client)
    assert len(entries(cache)) == 1  # the others were evicted, the one just used kept
    removed, left = packages.clear_unused()
    assert len(removed) == 1 and left == 0


def test_the_example_tasks_share_across_agents(tmp_path, docker_client, cache) -> None:
    """word_count's essay variant, oracle then nop: one package, both verify."""
    task = tmp_path / "tasks" / "files" / "word_count"
    shutil.copytree(EXAMPLES / "files" / "word_count", task)
    card = json.loads((task / "task_card.json").read_text())
    card["data_source"] = f"local:{EXAMPLES.parent / 'data'}"
    (task / "task_card.json").write_text(json.dumps(card))
    keys = []
    for agent in ("oracle", "nop"):
        plan = RunPlan(run_id=f"w-{agent}", task_dir=str(task), agent=AgentSpec(name=agent), image=TOOLS_IMAGE,
                       policy=IsolationPolicy(memory_bytes=512 * MIB), runs_dir=str(tmp_path / "runs"))
        result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
        assert result.status is RunStatus.SCORED and verify_run_dir(plan.run_dir).valid
        keys.append(json.loads((plan.run_dir / "evidence" / "input-staged.json").read_text())["shared_package"]["key"])
    assert keys[0] == keys[1]


def test_the_entry_hash_reuses_the_copy_pass_and_equals_a_fresh_hash(tmp_path, monkeypatch) -> None:
    """The built entry's tree (ev.hash_tree with the copy's digests) is a fresh hash's, whether a file's
    digest comes from the copy pass or is read again (a stale size is re-read); and the copy's
    digests are really used: the files they cover are not read again."""
    from ale.data.hashing import copy_tree_hashing
    from ale.record import evidence as ev

    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "deep.bin").write_bytes(os.urandom(300_000))
    (src / "top.txt").write_text("top\n")
    public = tmp_path / "public"
    (public / "input").mkdir(parents=True)
    (public / "software").mkdir()
    (public / "software" / "tool.sh").write_text("#!/bin/sh\n")  # not hashed by the copy: read here
    (public / "output").mkdir()  # the workspace's mount point: empty, not recorded
    copied = copy_tree_hashing(src, public / "input")
    hashed = {f"input/{rel}": f for rel, f in copied["files"].items()}
    fresh = ev.hash_tree(public)
    read: list[str] = []
    real_read = ev._sha256_and_size

    def counting(path: Path) -> tuple[str, int]:
        read.append(Path(path).relative_to(public).as_posix())
        return real_read(path)

    monkeypatch.setattr(ev, "_sha256_and_size", counting)
    assert ev.hash_tree(public, known=hashed) == fresh
    assert read == ["software/tool.sh"]  # the copied input is not read again: its digests come from the copy
    # A cached digest of the right size is taken as it is (it was taken in the same pass that wrote the file).
    planted = {**hashed, "input/top.txt": {"sha256": "f" * 64, "size": 4}}
    assert ev.hash_tree(public, known=planted)["files"]["input/top.txt"]["sha256"] == "f" * 64
    read.clear()
    wrong = {**hashed, "input/top.txt": {"sha256": "0" * 64, "size": 999}}  # a size that does not match: read again
    assert ev.hash_tree(public, known=wrong) == fresh
    assert sorted(read) == ["input/top.txt", "software/tool.sh"]
    os.symlink("top.txt", public / "input" / "link")  # a link: recorded as ever
    assert ev.hash_tree(public, known=hashed) == ev.hash_tree(public)


def _in_use_elsewhere(cache: Path) -> list[str]:
    """The entries some open descriptor of this process still holds (its shared lock):
    an exclusive non-blocking lock on each entry's in-use file fails while one does."""
    import fcntl

    held = []
    for e in entries(cache):
        fd = os.open(e / packages.IN_USE, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            held.append(e.name)
        finally:
            os.close(fd)
    return held


def test_a_grading_probe_releases_the_shared_package(tmp_path, docker_client, cache) -> None:
    """``ale task check``'s grading probe stages from the shared package as a run does,
    and lets go of it when it ends (it once held the lock until the process exited, so
    the cache could never evict the entry)."""
    from ale.runs.grading_only import grade_probe

    task = tree(tmp_path)
    plan = RunPlan(run_id=f"p-{uuid.uuid4().hex[:8]}", task_dir=str(task), agent=AgentSpec(name="nop"),
                   image=TOOLS_IMAGE, policy=IsolationPolicy(memory_bytes=512 * MIB), runs_dir=str(tmp_path / "runs"))

    def write(workspace: Path, _input: Path, _digest: str) -> list[str]:
        (workspace / "out.txt").write_text("forty-two\n")
        return []

    result = asyncio.run(grade_probe(plan, write, "right", provider=DockerProvider(docker_client)))
    assert result.score == 1.0, (result.status, result.error)
    assert len(entries(cache)) == 1, "the probe staged through the shared package"
    assert _in_use_elsewhere(cache) == [], "the probe still holds the shared package's lock"
    (entry,) = entries(cache)
    assert packages.evict(cache, limit=0) == [entry.name], "an entry no run uses is evicted"


def test_a_regrade_releases_the_shared_package(tmp_path, docker_client, cache) -> None:
    """``ale regrade`` stages the input again from the shared package and lets go of
    it when it ends, as a run and a grading probe do."""
    from ale.runs.regrade import regrade_run

    task = tree(tmp_path)
    run(task, tmp_path, docker_client)
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    outcome = asyncio.run(regrade_run(run_dir, reason="lock test", provider=DockerProvider(docker_client)))
    assert outcome.new["score"] == 1.0, outcome
    assert len(entries(cache)) == 1 and _in_use_elsewhere(cache) == [], "the regrade still holds the shared package's lock"
