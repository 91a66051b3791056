"""A whole run on a baked image: data from the image, reference.7z opened only at grading."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid

import pytest

from ale.data.baked import bake_image
from ale.data.sealing import seal_variant
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider
from ale.sandbox.docker_images import DockerImageStore
from ale.status import RunStatus
from tests.conftest import EXAMPLES, REPO, TOOLS_IMAGE, our_containers
from tests.test_run_e2e import plan_for, shell, trajectory

pytestmark = pytest.mark.docker

@pytest.fixture(scope="module")
def baked_word_count(docker_client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baked-run")
    root = tmp / "data"
    shutil.copytree(REPO / "examples" / "data" / "tasks" / "files" / "word_count", root / "tasks" / "files" / "word_count")
    store = tmp / "grader" / "secrets.json"
    for variant in ("essay", "poem"):
        seal_variant(root / "tasks" / "files" / "word_count" / variant, store, remove_clear=True)
    tag = f"ale-test-baked-run:{uuid.uuid4().hex[:8]}"
    bake_image(DockerImageStore(docker_client), root, None, tag, TOOLS_IMAGE, say=lambda s: None)
    yield tag, store
    docker_client.images.remove(tag, force=True)


def test_oracle_on_a_baked_image_scores_and_verifies(baked_word_count, docker_client, tmp_path, monkeypatch):
    tag, store = baked_word_count
    monkeypatch.setenv("ALE_GRADER_SECRETS", str(store))
    plan = plan_for(EXAMPLES / "files" / "word_count", tmp_path, agent="oracle", data=f"image:{tag}", image=tag)
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores == [1.0, 1.0]
    commit = json.loads((plan.run_dir / "evidence" / "reference-commit.json").read_text())
    assert commit["source"]["kind"] == "archive"
    assert our_containers(docker_client, **{"ale.run_id": plan.run_id}) == []
    assert verify_run_dir(plan.run_dir).valid


def test_the_agent_cannot_open_the_archive_from_inside(baked_word_count, docker_client, tmp_path, monkeypatch):
    tag, store = baked_word_count
    monkeypatch.setenv("ALE_GRADER_SECRETS", str(store))
    passwords = [e["password"] for e in json.loads(store.read_text())["archives"].values()]
    assert passwords
    pw = passwords[0]
    half = len(pw) // 2
    steps = [
        shell("find / -name 'reference.7z' -not -path '/proc/*' 2>/dev/null"),
        shell("for f in $(find / -name 'reference.7z' -not -path '/proc/*' 2>/dev/null); do head -c 16 \"$f\" >/dev/null || echo DENIED; done"),
        shell(f"A='{pw[:half]}'; B='{pw[half:]}'; grep -rlsF \"$A$B\" / --exclude-dir=proc --exclude-dir=sys | head -3; echo end"),
        shell("ls /opt/ale-data 2>&1 | head; env | grep -ci pass; echo done"),
    ]
    plan = plan_for(EXAMPLES / "files" / "word_count", tmp_path, agent="replay", steps=steps, data=f"image:{tag}", image=tag)
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    t = trajectory(plan)
    archives = [line for line in t[0]["stdout"].splitlines() if line.endswith("reference.7z")]
    assert archives, t[0]  # the archives are in the image the candidate runs in...
    assert t[1]["stdout"].count("DENIED") == len(archives), t[1]  # ...and unreadable to it
    assert t[2]["stdout"].strip() == "end", t[2]  # the password is in no file the agent can read
    assert pw not in json.dumps(t)
