"""Remote sources: s3:// against moto on 127.0.0.1, hf:// against a local stand-in
endpoint, the gs:// code path on an in-memory file system (against a real emulator:
tests/test_data_gcs.py); the verified cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ale.data.base import DataError, ReferenceError, VariantKey
from ale.data.hashing import hash_tree
from ale.data.remote import BlobCache, RemoteSource, parse_spec, storage_options_for
from ale.data.sealing import seal_variant
from ale.data.sources import open_source, prefetch
from tests.conftest import require_module
from tests.test_data_support import (
    ALE_PASSWORD,
    KEY,
    HfStandIn,
    check_ale_layout,
    check_corrupt_cache_and_bad_remote_is_reported,
    check_corrupt_cache_entry_is_refetched,
    check_manifest_mismatch_names_the_file,
    check_sealed_reference_and_cache_reuse,
    make_ale_archive,
    make_variant,
    tree_of,
    upload_tree,
)

# ----------------------------------------------------------------------------- s3 (moto)


@pytest.fixture(scope="module")
def moto_endpoint():
    require_module("moto")
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")}
    # Static test credentials: botocore never walks on to the instance-metadata service.
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3(moto_endpoint, monkeypatch, tmp_path):
    """A fresh bucket; returns (s3fs file system, bucket name)."""
    s3fs = require_module("s3fs")

    monkeypatch.setenv("ALE_S3_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("ALE_CACHE_DIR", str(tmp_path / "cache"))
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": moto_endpoint}, skip_instance_cache=True)
    bucket = f"b-{tmp_path.name[-20:].lower().replace('_', '-')}".rstrip("-")
    fs.mkdir(bucket)
    return fs, bucket


def test_s3_end_to_end_tree_reference(s3, tmp_path: Path) -> None:
    fs, bucket = s3
    v = make_variant(tmp_path / "data", software=True)
    upload_tree(fs, tmp_path / "data", f"{bucket}/pre")
    src = open_source(f"s3://{bucket}/pre")
    assert isinstance(src, RemoteSource)
    tree = src.stage_input(KEY, tmp_path / "run" / "input")
    assert tree == hash_tree(v / "input") and tree["count"] == 3
    assert tree_of(tmp_path / "run" / "input") == tree_of(v / "input")
    assert (tmp_path / "run" / "software" / "tool.py").is_file()
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "tree" and c.sha256 == hash_tree(v / "reference")["digest"]
    src.stage_reference(KEY, tmp_path / "grade" / "reference", c)
    assert tree_of(tmp_path / "grade" / "reference") == tree_of(v / "reference")
    with pytest.raises(DataError, match=rf"neither s3://{bucket}/pre/dom/task/v9 \(ALE layout\) nor s3://{bucket}/pre/tasks/dom/task/v9 \(tasks layout\) exists \(available: v0\)"):
        src.stage_input(VariantKey("dom", "task", "v9"), tmp_path / "x")


def test_s3_sealed_reference_and_cache_reuse(s3, tmp_path: Path, monkeypatch) -> None:
    fs, bucket = s3
    check_sealed_reference_and_cache_reuse(fs, f"s3://{bucket}/sealed", tmp_path, monkeypatch)


def test_s3_manifest_mismatch_names_the_file(s3, tmp_path: Path) -> None:
    fs, bucket = s3
    check_manifest_mismatch_names_the_file(fs, f"s3://{bucket}/m", tmp_path)


def test_s3_corrupt_cache_entry_is_refetched(s3, tmp_path: Path) -> None:
    fs, bucket = s3
    check_corrupt_cache_entry_is_refetched(fs, f"s3://{bucket}/c", tmp_path)


def test_s3_corrupt_cache_and_bad_remote_is_reported(s3, tmp_path: Path) -> None:
    fs, bucket = s3
    check_corrupt_cache_and_bad_remote_is_reported(fs, f"s3://{bucket}/cb", tmp_path)


def test_s3_ale_layout(s3, tmp_path: Path, monkeypatch) -> None:
    fs, bucket = s3
    check_ale_layout(fs, f"s3://{bucket}/ale", tmp_path, monkeypatch)


def test_s3_reference_role_has_its_own_credentials(s3, tmp_path: Path, monkeypatch) -> None:
    fs, bucket = s3
    make_variant(tmp_path / "data")
    upload_tree(fs, tmp_path / "data", f"{bucket}/r")
    src = open_source(f"s3://{bucket}/r", reference_storage_options={"key": "grader", "secret": "grader-secret"})
    assert src.fs is not src.ref_fs
    assert src.ref_fs.key == "grader" and src.fs.key != "grader"
    monkeypatch.setattr(src.fs, "open", lambda *a, **k: (_ for _ in ()).throw(AssertionError("input fs used for the reference")))
    c = src.commit_reference(KEY)
    src.stage_reference(KEY, tmp_path / "g" / "ref", c)
    assert (tmp_path / "g" / "ref" / "answer.txt").is_file()
    monkeypatch.setenv("ALE_REFERENCE_S3_PROFILE", "graders")
    assert storage_options_for("s3", anon=True, role="reference", extra=None)["profile"] == "graders"
    assert "profile" not in storage_options_for("s3", anon=True, role="input", extra=None)


def test_prefetch_fills_cache(s3, tmp_path: Path) -> None:
    fs, bucket = s3
    make_variant(tmp_path / "data")
    upload_tree(fs, tmp_path / "data", f"{bucket}/p")
    lines: list[str] = []
    n = prefetch(f"s3://{bucket}/p", [KEY], progress=False, say=lines.append)
    assert n == sum(p.stat().st_size for p in (tmp_path / "data" / KEY.relpath / "input").rglob("*") if p.is_file())
    assert lines and "tasks/dom/task/v0" in lines[0]
    assert len(list(BlobCache().blobs.rglob("*"))) >= 3


# ----------------------------------------------------------------------------- hf (local stand-in)


@pytest.fixture
def hf_endpoint(tmp_path: Path, monkeypatch):
    require_module("huggingface_hub")
    repo = tmp_path / "hfrepo"
    make_variant(repo)
    ale_repo = tmp_path / "hf-ale"  # ALE's dataset: no tasks/ level, ALE's own reference.7z
    make_ale_archive(make_variant(ale_repo, layout="ale"))
    (ale_repo / ".gitattributes").write_text("*.7z filter=lfs\n")
    with HfStandIn({"org/name": repo, "org/ale": ale_repo}) as hf:
        import huggingface_hub.constants as hc

        # Every request the client makes goes to the stand-in, including the ones
        # that read the endpoint fixed at import time.
        monkeypatch.setattr(hc, "ENDPOINT", hf.url)
        monkeypatch.setattr(hc, "HUGGINGFACE_CO_URL_TEMPLATE", hf.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setenv("HF_ENDPOINT", hf.url)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        yield hf, repo


def test_hf_end_to_end(hf_endpoint, tmp_path: Path) -> None:
    hf, repo = hf_endpoint
    src = open_source("hf://datasets/org/name@main", anon=True)
    tree = src.stage_input(KEY, tmp_path / "run" / "input")
    assert tree == hash_tree(repo / KEY.relpath / "input")
    c = src.commit_reference(KEY)
    assert c is not None and c.sha256 == hash_tree(repo / KEY.relpath / "reference")["digest"]
    src.stage_reference(KEY, tmp_path / "g" / "ref", c)
    assert tree_of(tmp_path / "g" / "ref") == tree_of(repo / KEY.relpath / "reference")
    assert any("/resolve/main/" in r for r in hf.requests)
    assert all(r.startswith(("GET /", "HEAD /", "POST /")) for r in hf.requests)
    with pytest.raises(DataError, match=r"nor hf://datasets/org/name@main/tasks/dom/task/v3 \(tasks layout\) exists \(available: v0\)"):
        src.stage_input(VariantKey("dom", "task", "v3"), tmp_path / "y")


def test_hf_ale_layout(hf_endpoint, tmp_path: Path, monkeypatch) -> None:
    hf, _ = hf_endpoint
    ale_repo = tmp_path / "hf-ale"
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", ALE_PASSWORD)
    src = open_source("hf://datasets/org/ale@main", anon=True, secret_store=tmp_path / "none.json")
    assert src.variants() == [KEY]
    tree = src.stage_input(KEY, tmp_path / "run" / "input")
    assert tree == hash_tree(ale_repo / "dom/task/v0/input")
    assert src.layout_of(KEY) == "ale"
    assert src.location(KEY) == "hf://datasets/org/ale@main/dom/task/v0"
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "archive" and c.files == 0  # no manifest: the digest alone
    src.stage_reference(KEY, tmp_path / "g" / "ref", c)
    assert (tmp_path / "g" / "ref" / "answer.txt").read_text() == "REFERENCE-MARKER-42\n"
    with pytest.raises(DataError, match=r"variant folder hf://datasets/org/ale@main/tasks/dom/task/v0 not found"):
        open_source("hf://datasets/org/ale@main#layout=tasks", anon=True).stage_input(KEY, tmp_path / "t")


def test_hf_spec_parsing() -> None:
    assert parse_spec("hf://datasets/org/name@v1.0/sub").root == "datasets/org/name@v1.0/sub"
    with pytest.raises(DataError, match="hf://datasets/<org>/<name>"):
        parse_spec("hf://models/org/name")
    with pytest.raises(DataError, match="names no bucket"):
        parse_spec("s3://")


# ----------------------------------------------------------------------------- gs (mocked)


def test_gcs_options() -> None:
    assert storage_options_for("gcs", anon=True, role="input", extra=None) == {"token": "anon"}
    assert storage_options_for("gcs", anon=False, role="reference", extra={"project": "p"}) == {"project": "p"}
    assert parse_spec("gs://bucket/pre/fix").protocol == "gcs"


def test_gcs_code_path_on_a_mocked_file_system(tmp_path: Path, monkeypatch) -> None:
    """The gs:// source's whole code path over an in-memory fsspec file system
    (independent of gcsfs; the emulator test is tests/test_data_gcs.py)."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    import ale.data.remote as remote

    mem = MemoryFileSystem(skip_instance_cache=True)
    mem.store = {}
    mem.pseudo_dirs = [""]
    made: list[tuple[str, dict]] = []

    def fake_fs(protocol: str, options: dict):
        made.append((protocol, options))
        return mem

    monkeypatch.setattr(remote, "make_filesystem", fake_fs)
    monkeypatch.setattr(remote, "probe_store", lambda protocol, options: None)  # no network here
    store = tmp_path / "s.json"
    v = make_variant(tmp_path / "data")
    seal_variant(v, store, remove_clear=True)
    mem.put(str(tmp_path / "data") + "/", "/bucket/pre/", recursive=True)
    src = open_source("gs://bucket/pre", anon=True, secret_store=store)
    assert src.stage_input(KEY, tmp_path / "in") == hash_tree(v / "input")
    c = src.commit_reference(KEY)
    src.stage_reference(KEY, tmp_path / "g" / "ref", c)
    assert (tmp_path / "g" / "ref" / "answer.txt").is_file()
    assert made[0] == ("gcs", {"token": "anon"})
    # a tampered archive in the bucket is caught before decryption
    mem.pipe(f"/bucket/pre/{KEY.relpath}/reference.7z", b"garbage")
    monkeypatch.setenv("ALE_CACHE_DIR", str(tmp_path / "fresh-cache"))  # else the good blob serves
    src2 = open_source("gs://bucket/pre", anon=True, secret_store=store)
    with pytest.raises(ReferenceError, match="does not match manifest.json|does not match the archive"):
        src2.stage_reference(KEY, tmp_path / "g2" / "ref", c)
    assert fsspec  # imported for the memory implementation


def test_an_object_store_keeps_no_modes_so_scripts_and_binaries_are_made_runnable(s3, tmp_path: Path) -> None:
    """S3/GCS/HF keep no file modes: staged files that start with #! or are ELF are
    0755 (input and reference), the rest 0644 (ALE's graders chmod +x what GCS
    stripped, which the grading sandbox's read-only mount refuses)."""
    import stat

    fs, bucket = s3
    v = make_variant(tmp_path / "data", software=True)
    (v / "input" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (v / "reference" / "bin").mkdir()
    (v / "reference" / "bin" / "judge").write_bytes(b"\x7fELF\x02\x01\x01")
    (v / "reference" / "bin" / "notes.txt").write_text("#not a shebang\n")
    upload_tree(fs, tmp_path / "data", f"{bucket}/modes")
    src = open_source(f"s3://{bucket}/modes")
    src.stage_input(KEY, tmp_path / "run" / "input")
    src.stage_reference(KEY, tmp_path / "grade" / "reference", src.commit_reference(KEY))

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(tmp_path / "run" / "input" / "run.sh") == 0o755
    assert mode(tmp_path / "grade" / "reference" / "bin" / "judge") == 0o755
    assert mode(tmp_path / "grade" / "reference" / "bin" / "notes.txt") == 0o644


def test_restore_runnable_keeps_execute_bits_and_sniffs_the_rest(tmp_path: Path) -> None:
    import stat

    from ale.data.hashing import restore_runnable

    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "tool").write_text("plain text, but executable\n")
    os.chmod(tmp_path / "d" / "tool", 0o700)
    (tmp_path / "d" / "script.py").write_text("#!/usr/bin/env python3\n")
    os.chmod(tmp_path / "d" / "script.py", 0o600)
    (tmp_path / "d" / "data.csv").write_text("a,b\n")
    os.chmod(tmp_path / "d" / "data.csv", 0o600)
    restore_runnable(tmp_path / "d")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "d").iterdir()}
    assert modes == {"tool": 0o755, "script.py": 0o755, "data.csv": 0o644}
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755
