"""Sealing a reference into reference.7z, and decrypting it safely on the trusted side."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import py7zr
import pytest

from ale.data.base import DataError, ReferenceCommitment, ReferenceError, VariantKey
from ale.data.hashing import sha256_file
from ale.data.local import LocalSource
from ale.data.sealing import FILTERS, SecretStore, extract_archive, seal_variant, unseal_variant
from ale.status import RunStatus
from tests.test_data_support import make_variant, tree_of

KEY = VariantKey("dom", "task", "v0")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "secrets" / "grader-secrets.json"


def _archive(path: Path, entries: dict[str, bytes], password: str = "pw", monkeypatch=None) -> Path:
    if monkeypatch is not None:  # py7zr refuses to write unsafe names; an attacker's tool would not
        monkeypatch.setattr(py7zr.py7zr, "check_archive_path", lambda name: True)
    with py7zr.SevenZipFile(path, "w", filters=FILTERS, password=password, header_encryption=True) as z:
        for name, data in entries.items():
            z.writestr(data, name)
    return path


def test_seal_then_stage_then_unseal(tmp_path: Path, store: Path) -> None:
    v = make_variant(tmp_path / "data")
    clear = tree_of(v / "reference")
    r = seal_variant(v, store)
    assert r.archive == v / "reference.7z" and r.files == 2 and (v / "reference").is_dir()
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    secrets = json.loads(store.read_text())["archives"]
    password = secrets[r.sha256]["password"]
    assert len(password) >= 22  # >= 128 bits of token_urlsafe
    manifest = json.loads((v / "manifest.json").read_text())
    assert manifest["reference_archive"] == {"sha256": r.sha256, "size": r.size, "files": 2}
    assert not any(k.startswith("reference/") for k in manifest["files"])
    # the archive gives away neither names nor contents without the password
    raw = (v / "reference.7z").read_bytes()
    assert b"REFERENCE-MARKER" not in raw and b"answer" not in raw and password.encode() not in raw
    with pytest.raises(Exception):  # noqa: B017 - any py7zr error: headers are encrypted
        py7zr.SevenZipFile(v / "reference.7z", password="wrong").list()

    src = LocalSource(tmp_path / "data", secret_store=store)
    c = src.commit_reference(KEY)
    assert c == ReferenceCommitment("archive", r.sha256, 2)
    dest = tmp_path / "grading" / "reference"
    src.stage_reference(KEY, dest, c)
    assert tree_of(dest) == clear
    assert sorted(os.listdir(tmp_path / "grading")) == ["reference"]

    import shutil

    shutil.rmtree(v / "reference")
    unseal_variant(v, store)
    assert tree_of(v / "reference") == clear


def test_seal_refuses_store_inside_data_root_and_reseal(tmp_path: Path) -> None:
    v = make_variant(tmp_path / "data")
    with pytest.raises(DataError, match="inside the data root"):
        seal_variant(v, tmp_path / "data" / "secrets.json")
    seal_variant(v, tmp_path / "s.json", remove_clear=False)
    with pytest.raises(DataError, match="already exists"):
        seal_variant(v, tmp_path / "s.json")
    seal_variant(v, tmp_path / "s.json", force=True, remove_clear=True)
    assert not (v / "reference").exists()
    with pytest.raises(DataError, match="nothing to seal"):
        seal_variant(v, tmp_path / "s.json", force=True)


def test_secret_store_must_be_private(tmp_path: Path, store: Path) -> None:
    v = make_variant(tmp_path / "data")
    r = seal_variant(v, store)
    store.chmod(0o644)
    with pytest.raises(ReferenceError, match="chmod 600"):
        SecretStore(store).get(r.sha256)


def test_digest_mismatch_before_decrypting(tmp_path: Path, store: Path) -> None:
    v = make_variant(tmp_path / "data")
    seal_variant(v, store, remove_clear=True)
    src = LocalSource(tmp_path / "data", secret_store=store)
    c = src.commit_reference(KEY)
    data = bytearray((v / "reference.7z").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (v / "reference.7z").write_bytes(bytes(data))
    with pytest.raises(ReferenceError, match="does not match the archive sha256") as e:
        src.stage_reference(KEY, tmp_path / "g" / "reference", c)
    assert e.value.status is RunStatus.GRADING_FAILED
    assert os.listdir(tmp_path / "g") == []


def test_corrupt_archive_is_reported(tmp_path: Path) -> None:
    arch = _archive(tmp_path / "a.7z", {"x.txt": os.urandom(20000)})
    data = bytearray(arch.read_bytes())
    data[100] ^= 0xFF
    arch.write_bytes(bytes(data))
    with pytest.raises(ReferenceError, match="wrong password or corrupt archive"):
        extract_archive(arch, "pw", tmp_path / "out", expected_sha256=None)
    assert sorted(os.listdir(tmp_path)) == ["a.7z"]


def test_wrong_password(tmp_path: Path, store: Path) -> None:
    v = make_variant(tmp_path / "data")
    r = seal_variant(v, store, remove_clear=True)
    SecretStore(store).put(r.sha256, "not-the-password", variant="x")
    src = LocalSource(tmp_path / "data", secret_store=store)
    with pytest.raises(ReferenceError, match="wrong password or corrupt archive"):
        src.stage_reference(KEY, tmp_path / "g" / "reference", src.commit_reference(KEY))
    assert os.listdir(tmp_path / "g") == []
    SecretStore(store).remove(r.sha256)
    with pytest.raises(ReferenceError, match="no password for reference archive"):
        src.stage_reference(KEY, tmp_path / "g" / "reference", src.commit_reference(KEY))


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "/abs/escape"])
def test_path_traversal_entries_are_refused(tmp_path: Path, monkeypatch, name: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    arch = _archive(tmp_path / "evil.7z", {"ok.txt": b"fine", name: b"pwned"}, monkeypatch=monkeypatch)
    with pytest.raises(ReferenceError, match="points outside its folder|absolute path"):
        extract_archive(arch, "pw", work / "reference", expected_sha256=None)
    assert os.listdir(work) == []
    assert not (tmp_path / "escape").exists() and not Path("/abs/escape").exists()


def test_symlink_entry_is_refused(tmp_path: Path) -> None:
    os.symlink("/etc/shadow", tmp_path / "lnk")
    with py7zr.SevenZipFile(tmp_path / "l.7z", "w", filters=FILTERS, password="pw", header_encryption=True) as z:
        z.write(tmp_path / "lnk", "lnk")
    with pytest.raises(ReferenceError, match="link or special file"):
        extract_archive(tmp_path / "l.7z", "pw", tmp_path / "out", expected_sha256=None)
    assert not (tmp_path / "out").exists()


def test_archive_bomb_is_refused(tmp_path: Path) -> None:
    arch = _archive(tmp_path / "bomb.7z", {"zeros": b"\0" * (8 << 20)})
    assert arch.stat().st_size < 64 << 10
    with pytest.raises(ReferenceError, match="archive bomb"):
        extract_archive(arch, "pw", tmp_path / "out", expected_sha256=None, max_bytes=1 << 20)
    assert not (tmp_path / "out").exists()
    assert sorted(os.listdir(tmp_path)) == ["bomb.7z"]
    many = _archive(tmp_path / "many.7z", {f"f{i}": b"x" for i in range(20)})
    with pytest.raises(ReferenceError, match="more than the limit of 10"):
        extract_archive(many, "pw", tmp_path / "out", expected_sha256=None, max_files=10)


def test_lying_sizes_stop_at_the_byte_budget(tmp_path: Path, monkeypatch) -> None:
    """Even when the declared sizes pass, the bytes really written are counted."""
    import ale.data.sealing as sealing

    arch = _archive(tmp_path / "b.7z", {"a": b"\1" * (3 << 20)})
    real = sealing._Budget.__init__

    def lenient(self, max_bytes: int) -> None:
        real(self, 1 << 20)

    monkeypatch.setattr(sealing._Budget, "__init__", lenient)
    with pytest.raises(ReferenceError, match="archive bomb"):
        extract_archive(arch, "pw", tmp_path / "out", expected_sha256=None, max_bytes=10 << 20)
    assert sorted(os.listdir(tmp_path)) == ["b.7z"]


def test_expected_digest_checked_first(tmp_path: Path) -> None:
    arch = _archive(tmp_path / "a.7z", {"x": b"x"})
    with pytest.raises(ReferenceError, match="was committed before the run"):
        extract_archive(arch, "pw", tmp_path / "out", expected_sha256="0" * 64)
    digest, _ = sha256_file(arch)
    tree = extract_archive(arch, "pw", tmp_path / "out", expected_sha256=digest)
    assert tree["count"] == 1 and (tmp_path / "out" / "x").read_bytes() == b"x"


@pytest.mark.parametrize("compression", ["deflate", "lzma2", "copy"])
def test_other_compressions_round_trip(tmp_path: Path, store: Path, compression: str) -> None:
    v = make_variant(tmp_path / "data")
    clear = tree_of(v / "reference")
    seal_variant(v, store, remove_clear=True, compression=compression)
    src = LocalSource(tmp_path / "data", secret_store=store)
    src.stage_reference(KEY, tmp_path / "g", src.commit_reference(KEY))
    assert tree_of(tmp_path / "g") == clear
    with pytest.raises(DataError, match="unknown compression"):
        seal_variant(v, store, force=True, compression="rar")
