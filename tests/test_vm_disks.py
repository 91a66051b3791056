"""VM base disks from a local qcow2 or ALE's published layout (parts of at most 4 GiB,
each with its sha256, joined and checked whole), locally and over fsspec (memory://,
the same path gs://, s3:// and hf:// take)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ale.data import vm_disks
from ale.data.base import DataError
from ale.data.vm_disks import fetch_vm_disk, parse_sums


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ALE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def publish(folder: Path, disk: bytes, part: int, name: str = "ale-ubuntu.qcow2") -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    lines, names = [], []
    for i in range(0, len(disk), part):
        n = f"{name}.part-{i // part:03d}"
        (folder / n).write_bytes(disk[i:i + part])
        lines.append(f"{sha(disk[i:i + part])}  {n}")
        names.append(n)
    lines.append(f"{sha(disk)}  {name}")
    (folder / f"{name}.sha256sums").write_text("\n".join(lines) + "\n")
    return names


DISK = os.urandom(300_000)


def test_parts_are_joined_checked_and_cached_read_only(tmp_path, cache) -> None:
    publish(tmp_path / "pub", DISK, 100_000)
    said: list[str] = []
    d = fetch_vm_disk(str(tmp_path / "pub"), progress=said.append)
    assert d.path.read_bytes() == DISK and d.sha256 == sha(DISK) and d.parts == 3
    assert d.path.parent == cache / "vm-disks" and d.path.name == f"{sha(DISK)}.qcow2"
    assert oct(d.path.stat().st_mode & 0o777) == "0o444"
    assert any("part 3/3" in m for m in said)
    # Named by its listing too; the second fetch reads no part.
    for p in (tmp_path / "pub").glob("*.part-*"):
        p.unlink()
    again = fetch_vm_disk(f"local:{tmp_path / 'pub' / 'ale-ubuntu.qcow2.sha256sums'}")
    assert again.path == d.path


def test_a_tampered_part_is_named(tmp_path) -> None:
    names = publish(tmp_path / "pub", DISK, 100_000)
    (tmp_path / "pub" / names[1]).write_bytes(b"x" * 100_000)
    with pytest.raises(DataError, match=r"part-001: sha256 .* differs from the listing"):
        fetch_vm_disk(str(tmp_path / "pub"))
    assert not list((tmp_path / "cache" / "vm-disks").glob("*.qcow2"))  # nothing half-made is kept


def test_parts_that_each_check_but_join_to_another_disk_are_refused(tmp_path) -> None:
    publish(tmp_path / "pub", DISK, 100_000)
    sums = tmp_path / "pub" / "ale-ubuntu.qcow2.sha256sums"
    sums.write_text(sums.read_text().replace(sha(DISK), sha(b"another disk")))
    with pytest.raises(DataError, match="the joined parts' sha256"):
        fetch_vm_disk(str(tmp_path / "pub"))


def test_a_missing_or_unlisted_or_oversized_part_is_refused(tmp_path, monkeypatch) -> None:
    names = publish(tmp_path / "a", DISK, 100_000)
    (tmp_path / "a" / names[1]).unlink()
    with pytest.raises(DataError, match="not consecutive"):
        fetch_vm_disk(str(tmp_path / "a"))
    names = publish(tmp_path / "b", DISK, 100_000)
    (tmp_path / "b" / names[2]).unlink()
    with pytest.raises(DataError, match="lists parts that are not there"):
        fetch_vm_disk(str(tmp_path / "b"))
    publish(tmp_path / "c", DISK, 100_000)
    (tmp_path / "c" / "ale-ubuntu.qcow2.part-003").write_bytes(b"extra")
    with pytest.raises(DataError, match="no line for the part ale-ubuntu.qcow2.part-003"):
        fetch_vm_disk(str(tmp_path / "c"))
    publish(tmp_path / "d", DISK, 100_000)
    monkeypatch.setattr(vm_disks, "PART_MAX_BYTES", 50_000)
    with pytest.raises(DataError, match="larger than a part may be"):
        fetch_vm_disk(str(tmp_path / "d"))


def test_no_listing_no_disk(tmp_path) -> None:
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "x.qcow2.part-000").write_bytes(b"x")
    with pytest.raises(DataError, match=r"no x.qcow2.sha256sums .* every part and of the whole"):
        fetch_vm_disk(str(tmp_path / "e"))
    with pytest.raises(DataError, match="does not exist"):
        fetch_vm_disk(str(tmp_path / "nowhere.qcow2"))
    with pytest.raises(DataError, match=r"not a '<sha256>  <file>' line"):
        parse_sums("abc  file\n", "sums")


def test_a_local_qcow2_is_used_where_it_lies(tmp_path, cache) -> None:
    disk = tmp_path / "mine.qcow2"
    disk.write_bytes(DISK)
    d = fetch_vm_disk(str(disk))
    assert d.path == disk.resolve() and d.sha256 == sha(DISK)
    assert not list((cache / "vm-disks").glob("*.qcow2"))  # not copied


def test_a_single_file_disk_with_its_sha256(tmp_path) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "win.qcow2").write_bytes(DISK)
    (tmp_path / "f" / "win.qcow2.sha256").write_text(f"{sha(DISK)}  win.qcow2\n")
    d = fetch_vm_disk(f"local:{tmp_path / 'f'}")
    assert d.sha256 == sha(DISK) and d.path.read_bytes() == DISK


def test_over_fsspec(tmp_path) -> None:
    """memory:// stands for gs://, s3:// and hf://: one fsspec code path."""
    import fsspec

    fs = fsspec.filesystem("memory")
    publish(tmp_path / "pub", DISK, 120_000)
    for p in (tmp_path / "pub").iterdir():
        fs.pipe(f"/bucket/disks/ale/{p.name}", p.read_bytes())
    d = fetch_vm_disk("memory://bucket/disks/ale")
    assert d.path.read_bytes() == DISK and d.parts == 3 and d.source == "memory://bucket/disks/ale"
