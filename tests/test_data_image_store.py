"""The image: source and bake_image over the ImageStore protocol alone: an in-memory
store stands in for the engine (no Docker here; the real one is test_data_baked.py)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from ale.data.baked import LABEL_DATA_INDEX, ImageSource, bake_image
from ale.data.base import (
    DataError,
    ImageInfo,
    ImageNotFound,
    ImageStore,
    ReferenceError,
    VariantKey,
)
from ale.data.hashing import hash_tree
from ale.data.sealing import seal_variant
from ale.data.sources import open_source
from ale.status import RunStatus
from tests.test_data_support import ALE_PASSWORD, KEY, make_ale_archive, make_variant, tree_of


class FolderReader:
    def __init__(self, fs_root: Path, log: list[str]) -> None:
        self.fs_root = fs_root
        self.log = log

    def _local(self, path: str) -> Path:
        assert path.startswith("/")
        return self.fs_root / path.lstrip("/")

    def exists(self, path: str) -> bool:
        return self._local(path).exists()

    def get_tar(self, path: str) -> Iterator[bytes] | None:
        p = self._local(path)
        if not p.exists():
            return None
        self.log.append(path)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(p, arcname=p.name)  # as `docker cp` does: the entry under its own name
        data = buf.getvalue()
        return iter([data[i : i + 4096] for i in range(0, len(data), 4096)])


class FolderImageStore:
    """Images as folders: build copies the context's COPY source to the image's data root."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.images: dict[str, ImageInfo] = {"ale-tools:latest": ImageInfo("sha256:tools", {})}
        self.readers = 0
        self.open_readers = 0
        self.log: list[str] = []

    def lookup(self, ref: str) -> ImageInfo:
        if ref not in self.images:
            raise ImageNotFound(f"image {ref} is not in the test store")
        return self.images[ref]

    def build(self, context: Path, *, tag: str, labels: Mapping[str, str]) -> str:
        dockerfile = (context / "Dockerfile").read_text().splitlines()
        assert dockerfile[0] == "FROM ale-tools:latest"
        _copy, _chown, src, dst = dockerfile[1].split()
        image_id = f"sha256:{len(self.images):064d}"
        shutil.copytree(context / src, self.base / image_id / dst.strip("/"))
        self.images[tag] = self.images[image_id] = ImageInfo(image_id, dict(labels))
        return image_id

    @contextmanager
    def reader(self, image_id: str) -> Iterator[FolderReader]:
        self.readers += 1
        self.open_readers += 1
        try:
            yield FolderReader(self.base / image_id, self.log)
        finally:
            self.open_readers -= 1


def _as_store(store: FolderImageStore) -> ImageStore:
    return store  # type-checks the fake against the protocol


@pytest.fixture
def store(tmp_path: Path) -> FolderImageStore:
    return FolderImageStore(tmp_path / "engine")


def test_bake_an_ale_root_and_read_it_back(store: FolderImageStore, tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "data"
    v = make_variant(root, layout="ale", software=True)
    clear = tree_of(v / "reference")
    make_ale_archive(v)
    grader = tmp_path / "grader.json"
    other = make_variant(root, "dom/other/base", layout="tasks")
    seal_variant(other, grader, remove_clear=True)
    image_id = bake_image(_as_store(store), root, None, "ale-data:t", say=lambda s: None)
    index = json.loads(store.images[image_id].labels[LABEL_DATA_INDEX])
    assert sorted(index) == ["dom/task/v0", "tasks/dom/other/base"]  # each variant keeps its layout
    baked = store.base / image_id / "opt/ale-data"
    assert (baked / "dom/task/v0/reference.7z").is_file() and not (baked / "dom/task/v0/reference").exists()

    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", ALE_PASSWORD)
    src = open_source("image:ale-data:t", image_store=store, secret_store=grader)
    assert isinstance(src, ImageSource) and src.image_id == image_id
    assert src.variants() == [VariantKey("dom", "other", "base"), KEY]
    assert src.stage_input(KEY, tmp_path / "run" / "input") == hash_tree(v / "input")
    assert tree_of(tmp_path / "run" / "software") == tree_of(v / "software")
    assert src.layout_of(KEY) == "ale" and src.location(KEY) == "ale-data:t:/opt/ale-data/dom/task/v0"
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "archive"
    src.stage_reference(KEY, tmp_path / "g" / "reference", c)
    assert tree_of(tmp_path / "g" / "reference") == clear
    okey = VariantKey("dom", "other", "base")
    src.stage_reference(okey, tmp_path / "g2" / "reference", src.commit_reference(okey))  # the grader's store
    assert src.layout_of(okey) == "tasks"
    assert store.open_readers == 0 and store.readers >= 3  # a fresh reader per staging, all closed
    with pytest.raises(DataError, match=r"variant folder ale-data:t:/opt/ale-data/tasks/dom/task/v0 not found"):
        open_source("image:ale-data:t#layout=tasks", image_store=store).stage_input(KEY, tmp_path / "x")


def test_wrong_password_from_an_image_names_the_archive(store: FolderImageStore, tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "data"
    make_ale_archive(make_variant(root, layout="ale"))
    bake_image(store, root, [KEY], "ale-data:w", say=lambda s: None)
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", "wrong")
    src = open_source("image:ale-data:w", image_store=store, secret_store=tmp_path / "none.json")
    with pytest.raises(ReferenceError, match=r"reference archive ale-data:w:/opt/ale-data/dom/task/v0/reference.7z .*wrong password") as e:
        src.stage_reference(KEY, tmp_path / "g" / "reference", src.commit_reference(KEY))
    assert e.value.status is RunStatus.GRADING_FAILED
    assert list((tmp_path / "g").iterdir()) == []


def test_an_image_without_an_index_is_probed(store: FolderImageStore, tmp_path: Path) -> None:
    root = tmp_path / "data"
    v = make_variant(root, layout="ale", reference=False)
    image_id = bake_image(store, root, None, "ale-data:n", say=lambda s: None)
    store.images["plain:1"] = ImageInfo(image_id, {})  # someone else's image: no ale labels
    src = open_source("image:plain:1", image_store=store)
    assert src.stage_input(KEY, tmp_path / "in") == hash_tree(v / "input")
    assert src.layout_of(KEY) == "ale"
    assert src.commit_reference(KEY) is None
    with pytest.raises(DataError, match="has no ale.data.variants label: its variants cannot be listed"):
        src.variants()
    with pytest.raises(DataError, match=r"neither plain:1:/opt/ale-data/dom/task/v9 \(ALE layout\) nor .*tasks/dom/task/v9 .*unknown"):
        src.stage_input(VariantKey("dom", "task", "v9"), tmp_path / "x")


def test_an_index_with_both_layouts_is_ambiguous(store: FolderImageStore, tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_variant(root, layout="ale", reference=False)
    image_id = bake_image(store, root, None, "ale-data:a", say=lambda s: None)
    index = {"dom/task/v0": {"archive": None}, "tasks/dom/task/v0": {"archive": None}}
    store.images["amb:1"] = ImageInfo(image_id, {LABEL_DATA_INDEX: json.dumps(index)})
    with pytest.raises(DataError, match=r"under both layouts: amb:1:/opt/ale-data/dom/task/v0 \(ALE layout\) and amb:1:/opt/ale-data/tasks/dom/task/v0"):
        open_source("image:amb:1", image_store=store).commit_reference(KEY)
    assert open_source("image:amb:1#layout=ale", image_store=store).commit_reference(KEY) is None


def test_bake_errors(store: FolderImageStore, tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_variant(root, layout="ale")
    with pytest.raises(DataError, match=rf"{root}/dom/task/v0: reference/ is not sealed"):
        bake_image(store, root, None, "x:1", say=lambda s: None)
    with pytest.raises(DataError, match="base image nope:1 not found locally .*ale image build"):
        bake_image(store, root, None, "x:1", "nope:1", say=lambda s: None)
    with pytest.raises(DataError, match=rf"no variants under {root} \(looked for {root}/tasks/<domain>/<task>/<variant>\)"):
        bake_image(store, root, None, "x:1", layout="tasks", say=lambda s: None)
    with pytest.raises(DataError, match="baked data image gone:1 not found"):
        open_source("image:gone:1", image_store=store)
