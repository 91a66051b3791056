"""The local: source, hashing while copying, and the reference commitment (tree kind)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ale.data.base import DataError, ReferenceCommitment, ReferenceError, VariantKey
from ale.data.hashing import hash_tree, tree_digest
from ale.data.local import LocalSource
from ale.data.sealing import build_manifest, write_manifest
from ale.data.sources import open_source
from ale.status import RunStatus
from tests.test_data_support import make_variant, tree_of

KEY = VariantKey("dom", "task", "v0")


def test_open_source_specs(tmp_path: Path) -> None:
    assert isinstance(open_source("local:data", base_dir=tmp_path), LocalSource)
    assert open_source("local:data", base_dir=tmp_path).root == tmp_path / "data"
    assert open_source("data", base_dir=tmp_path).root == tmp_path / "data"
    assert open_source(f"local:{tmp_path}").root == tmp_path
    with pytest.raises(DataError, match="unknown data source"):
        open_source("ftp://example/x")
    with pytest.raises(DataError, match="empty"):
        open_source("  ")


def test_stage_input_copies_hashes_and_fixes_modes(tmp_path: Path) -> None:
    make_variant(tmp_path / "data", software=True)
    src = open_source("data", base_dir=tmp_path)
    dest = tmp_path / "run" / "input"
    dest.mkdir(parents=True)
    tree = src.stage_input(KEY, dest)
    assert tree_of(dest) == tree_of(tmp_path / "data" / KEY.relpath / "input")
    assert (dest / "empty").is_dir()
    assert tree == hash_tree(dest)
    assert tree["count"] == 3 and set(tree["files"]) == {"a.txt", "sub/b.bin", "run.sh"}
    assert tree["digest"] == tree_digest(tree["files"])
    # readable by uid 1000, exec bits kept, no write for others
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o744
    assert stat.S_IMODE((dest / "a.txt").stat().st_mode) & 0o644 == 0o644
    assert stat.S_IMODE((dest / "sub").stat().st_mode) & 0o755 == 0o755
    assert (tmp_path / "run" / "software" / "tool.py").read_text() == "print('tool')\n"
    assert not (tmp_path / "run" / "reference").exists()


def test_stage_input_refuses_symlinks_and_nonempty_dest(tmp_path: Path) -> None:
    v = make_variant(tmp_path / "data")
    os.symlink("/etc/passwd", v / "input" / "sub" / "link")
    src = LocalSource(tmp_path / "data")
    with pytest.raises(DataError, match=r"input/sub/link is a symbolic link"):
        src.stage_input(KEY, tmp_path / "dest1")
    assert not any((tmp_path / "dest1").iterdir())  # checked before anything is copied
    (v / "input" / "sub" / "link").unlink()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(DataError, match="not empty"):
        src.stage_input(KEY, busy)


def test_missing_variant_and_input(tmp_path: Path) -> None:
    v = make_variant(tmp_path / "data")
    src = LocalSource(tmp_path / "data")
    with pytest.raises(DataError, match=r"variant folder for dom/task/v9 not found: neither .*/data/dom/task/v9 \(ALE layout\) nor .*/data/tasks/dom/task/v9 \(tasks layout\) exists \(available: v0\)") as e:
        src.stage_input(VariantKey("dom", "task", "v9"), tmp_path / "d")
    assert e.value.status is RunStatus.INFRASTRUCTURE_ERROR and not e.value.retryable
    with pytest.raises(DataError, match="no task folder") as e:
        src.stage_input(VariantKey("dom", "nope", "v0"), tmp_path / "d")
    assert not e.value.retryable
    with pytest.raises(DataError, match="data root .* not found") as e:
        LocalSource(tmp_path / "nothing").stage_input(KEY, tmp_path / "d")
    assert not e.value.retryable
    import shutil

    shutil.rmtree(v / "input")
    with pytest.raises(DataError, match=rf"input folder {v / 'input'} not found") as e:
        src.stage_input(KEY, tmp_path / "d")
    assert not e.value.retryable


def test_tree_reference_commit_and_stage(tmp_path: Path) -> None:
    v = make_variant(tmp_path / "data")
    src = LocalSource(tmp_path / "data")
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "tree" and c.files == 2
    assert c.sha256 == hash_tree(v / "reference")["digest"]
    dest = tmp_path / "grading" / "reference"
    src.stage_reference(KEY, dest, c)
    assert tree_of(dest) == tree_of(v / "reference")
    assert sorted(os.listdir(tmp_path / "grading")) == ["reference"]  # no staging leftovers


def test_tree_reference_changed_after_commit(tmp_path: Path) -> None:
    v = make_variant(tmp_path / "data")
    src = LocalSource(tmp_path / "data")
    c = src.commit_reference(KEY)
    (v / "reference" / "answer.txt").write_text("changed\n")
    dest = tmp_path / "grading" / "reference"
    with pytest.raises(ReferenceError, match="does not match") as e:
        src.stage_reference(KEY, dest, c)
    assert e.value.status is RunStatus.GRADING_FAILED
    # nothing is exposed: neither dest nor a staging folder
    assert not dest.exists() and os.listdir(tmp_path / "grading") == []


def test_no_reference(tmp_path: Path) -> None:
    make_variant(tmp_path / "data", reference=False)
    src = LocalSource(tmp_path / "data")
    assert src.commit_reference(KEY) is None
    dest = tmp_path / "ref"
    src.stage_reference(KEY, dest, None)
    assert dest.is_dir() and not any(dest.iterdir())
    with pytest.raises(ReferenceError, match="not found, but a tree was committed"):
        src.stage_reference(KEY, tmp_path / "ref2", ReferenceCommitment("tree", "0" * 64, 1))


def test_manifest_mismatch_is_infrastructure_error(tmp_path: Path) -> None:
    v = make_variant(tmp_path / "data")
    write_manifest(v, build_manifest(v))
    src = LocalSource(tmp_path / "data")
    src.stage_input(KEY, tmp_path / "ok")
    (v / "input" / "a.txt").write_text("tampered")
    with pytest.raises(DataError, match=r"input/a.txt has sha256 .* but manifest.json says") as e:
        src.stage_input(KEY, tmp_path / "bad")
    assert e.value.status is RunStatus.INFRASTRUCTURE_ERROR


def test_variant_key_parse() -> None:
    assert VariantKey.parse("tasks/a/b/c") == VariantKey("a", "b", "c")
    assert VariantKey.parse("a/b/c").relpath == "tasks/a/b/c"
    with pytest.raises(DataError):
        VariantKey.parse("a/../c")


@pytest.mark.parametrize(("spec", "anchored"), [
    ("local:data", "local:/base/dir/data"),
    ("data", "local:/base/dir/data"),
    ("local:../d#layout=ale", "local:/base/d#layout=ale"),
    ("file://rel", "local:/base/dir/rel"),
    ("local:/abs/x", "local:/abs/x"),
    ("gs://bucket/x", "gs://bucket/x"),
    ("s3://bucket/x", "s3://bucket/x"),
    ("hf://datasets/org/name", "hf://datasets/org/name"),
    ("image:ale-data:1", "image:ale-data:1"),
])
def test_anchor_spec_makes_only_a_relative_local_path_absolute(spec: str, anchored: str) -> None:
    from ale.data.sources import anchor_spec

    assert anchor_spec(spec, Path("/base/dir")) == anchored
