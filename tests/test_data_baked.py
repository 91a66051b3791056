"""Baked images with real Docker: input staged from a fresh helper container, the
reference only as a root-only reference.7z whose password never enters any container."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from ale.data.baked import ImageSource, bake_image
from ale.data.base import DataError, ReferenceError, VariantKey
from ale.data.hashing import hash_tree
from ale.data.sealing import seal_variant
from ale.data.sources import open_source
from ale.sandbox.docker_images import DockerImageStore
from tests.conftest import TOOLS_IMAGE
from tests.test_data_support import make_variant, tree_of

pytestmark = pytest.mark.docker
KEY = VariantKey("dom", "task", "v0")


@pytest.fixture(scope="module")
def baked(docker_client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baked")
    store = tmp / "secrets" / "grader-secrets.json"
    v = make_variant(tmp / "data", software=True)
    seal_variant(v, store, remove_clear=True)
    make_variant(tmp / "data", "dom/task/v1", reference=False)
    tag = f"ale-test-baked:{uuid.uuid4().hex[:10]}"
    image_id = bake_image(DockerImageStore(docker_client), tmp / "data", None, tag, TOOLS_IMAGE, say=lambda s: None)
    try:
        yield {"tag": tag, "id": image_id, "root": tmp / "data", "store": store, "variant": v}
    finally:
        for c in docker_client.containers.list(all=True, filters={"ancestor": image_id, "label": "ale.managed=1"}):
            c.remove(force=True)
        docker_client.images.remove(image_id, force=True)


def _helpers(client) -> list:
    return client.containers.list(all=True, filters={"label": ["ale.managed=1", "ale.role=data-helper"]})


def test_baked_stage_input_commit_and_reference(docker_client, baked, tmp_path: Path) -> None:
    before = {c.id for c in _helpers(docker_client)}
    src = open_source(f"image:{baked['tag']}", image_store=DockerImageStore(docker_client), secret_store=baked["store"])
    assert isinstance(src, ImageSource) and src.image_id == baked["id"]
    v = baked["variant"]
    tree = src.stage_input(KEY, tmp_path / "run" / "input")
    assert tree == hash_tree(v / "input")
    assert tree_of(tmp_path / "run" / "software") == tree_of(v / "software")
    manifest = json.loads((v / "manifest.json").read_text())
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "archive" and c.sha256 == manifest["reference_archive"]["sha256"]
    src.stage_reference(KEY, tmp_path / "grade" / "reference", c)
    assert (tmp_path / "grade" / "reference" / "answer.txt").read_text() == "REFERENCE-MARKER-42\n"
    assert sorted(os.listdir(tmp_path / "grade")) == ["reference"]
    # a variant without reference
    none_key = VariantKey("dom", "task", "v1")
    assert src.commit_reference(none_key) is None
    src.stage_reference(none_key, tmp_path / "grade2" / "reference", None)
    assert not any((tmp_path / "grade2" / "reference").iterdir())
    # a wrong commitment is grading_failed, and nothing is left
    from ale.data.base import ReferenceCommitment

    with pytest.raises(ReferenceError, match="does not match"):
        src.stage_reference(KEY, tmp_path / "grade3" / "reference", ReferenceCommitment("archive", "0" * 64, 2))
    assert os.listdir(tmp_path / "grade3") == []
    with pytest.raises(DataError, match=r"/opt/ale-data/tasks/dom/task/v7 \(tasks layout\) exists \(available: v0, v1\)"):
        src.stage_input(VariantKey("dom", "task", "v7"), tmp_path / "nope")
    # every helper container was removed
    assert {c.id for c in _helpers(docker_client)} == before


def test_candidate_cannot_read_or_decrypt_the_reference(docker_client, baked, label) -> None:
    password = next(iter(json.loads(baked["store"].read_text())["archives"].values()))["password"]
    image = docker_client.images.get(baked["id"])
    assert password not in json.dumps(image.attrs)
    assert password not in json.dumps(image.history())
    archive = f"/opt/ale-data/{KEY.relpath}/reference.7z"
    script = (
        f"id -u; cat {archive} >/dev/null 2>&1 && echo READABLE || echo DENIED; "
        "test -r /opt/ale-data/tasks/dom/task/v0/input/a.txt && echo INPUT-OK; "
        f"grep -rIl -F -e '{password}' / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -3; "
        "env; echo END"
    )
    c = docker_client.containers.create(
        baked["id"],
        ["sh", "-c", script],
        user="1000:1000",
        network_mode="none",
        labels={"ale.managed": "1", "ale.test": label},
    )
    try:
        c.start()
        assert c.wait(timeout=120)["StatusCode"] == 0
        out = c.logs().decode()
    finally:
        c.remove(force=True)
    lines = out.splitlines()
    assert lines[0] == "1000"
    assert "DENIED" in lines and "READABLE" not in lines and "INPUT-OK" in lines
    assert password not in out  # not in any readable file, nor in the environment
    assert lines[-1] == "END"


def test_bake_refuses_unsealed_variants(docker_client, tmp_path: Path) -> None:
    store = DockerImageStore(docker_client)
    make_variant(tmp_path / "data")
    with pytest.raises(DataError, match="is not sealed"):
        bake_image(store, tmp_path / "data", None, "ale-test-never:x", TOOLS_IMAGE, say=lambda s: None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no variants under .*/empty \(looked for .*/empty/<domain>/<task>/<variant> and .*/empty/tasks/<domain>"):
        bake_image(store, tmp_path / "empty", None, "ale-test-never:x", TOOLS_IMAGE, say=lambda s: None)
    assert not docker_client.images.list(name="ale-test-never")


def test_missing_image_is_a_clear_error(docker_client) -> None:
    with pytest.raises(DataError, match="baked data image ale-test-missing:nope not found"):
        open_source("image:ale-test-missing:nope", image_store=DockerImageStore(docker_client))
    with pytest.raises(DataError, match="an image: source needs an image store"):
        open_source("image:ale-test-missing:nope")


def test_bake_an_ale_layout_root(docker_client, tmp_path: Path, monkeypatch) -> None:
    """ALE's layout baked as is (no tasks/ level in the image), ALE's own reference.7z
    opened with ALE_REFERENCE_ARCHIVE_PASSWORD, every helper container removed."""
    from tests.test_data_support import ALE_PASSWORD, make_ale_archive

    store = DockerImageStore(docker_client)
    v = make_variant(tmp_path / "data", layout="ale")
    clear = tree_of(v / "reference")
    make_ale_archive(v)
    tag = f"ale-test-baked-ale:{uuid.uuid4().hex[:10]}"
    image_id = bake_image(store, tmp_path / "data", None, tag, TOOLS_IMAGE, say=lambda s: None)
    before = {c.id for c in _helpers(docker_client)}
    try:
        monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", ALE_PASSWORD)
        src = open_source(f"image:{tag}", image_store=store, secret_store=tmp_path / "none.json")
        assert src.variants() == [KEY]
        assert src.stage_input(KEY, tmp_path / "run" / "input") == hash_tree(v / "input")
        assert src.layout_of(KEY) == "ale" and src.location(KEY) == f"{tag}:/opt/ale-data/dom/task/v0"
        with store.reader(image_id) as reader:
            assert reader.exists("/opt/ale-data/dom/task/v0/reference.7z")
            assert not reader.exists("/opt/ale-data/tasks")
            assert reader.get_tar("/opt/ale-data/nothing") is None
        c = src.commit_reference(KEY)
        src.stage_reference(KEY, tmp_path / "g" / "reference", c)
        assert tree_of(tmp_path / "g" / "reference") == clear
        assert {c.id for c in _helpers(docker_client)} == before
    finally:
        docker_client.images.remove(image_id, force=True)
