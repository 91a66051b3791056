"""VM base disks from anywhere ale reads data: a local qcow2, or a disk published in
parts (each at most 4 GiB, each with its sha256, and the sha256 of the whole) on a local
folder, ``gs://``, ``s3://``, ``hf://datasets/...`` (or ``memory://`` in tests).

The published layout (one folder per disk)::

    <name>.qcow2.part-000        # the disk split in order (``split -b 4G -d -a 3``),
    <name>.qcow2.part-001        #   every part at most 4 GiB (PART_MAX_BYTES)
    ...
    <name>.qcow2.sha256sums      # "<sha256>  <file>" for every part and for <name>.qcow2

or one ``<name>.qcow2`` beside ``<name>.qcow2.sha256`` (a disk that fits one part).
A disk is fetched once: each part is hashed while it streams and checked against its
line, the parts are joined in order, the whole is checked, and the result is kept
read-only in ``<cache>/vm-disks/<sha256>.qcow2`` (content-addressed: the same disk
published twice is stored once). A part missing from the listing, a listed part
absent, a part over 4 GiB, a digest that differs: each is a ``DataError`` naming the
file, never a disk used unchecked.

A local qcow2 without a listing is used where it lies (hashed once per size and
mtime, the digest cached), never copied.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.data.base import DataError
from ale.data.hashing import CHUNK
from ale.data.remote import make_filesystem, parse_spec, storage_options_for
from ale.paths import cache_dir

PART_MAX_BYTES = 4 * 1024**3
SUMS_SUFFIX = ".sha256sums"
_PART = re.compile(r"^(?P<disk>.+\.qcow2)\.part-?(?P<n>\d+)$")
_SUM_LINE = re.compile(r"^(?P<sha>[0-9a-fA-F]{64})\s+\*?(?P<file>\S.*)$")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class VmDisk:
    """A verified base disk on this machine: where it is, its sha256 and size, and
    where it came from (the reference as given)."""

    path: Path
    sha256: str
    size: int
    source: str
    parts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "size": self.size, "source": self.source,
                "parts": self.parts}


def disks_dir() -> Path:
    d = cache_dir() / "vm-disks"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def parse_sums(text: str, where: str) -> dict[str, str]:
    """``sha256sum``'s output: file name → lower-case sha256. Raises ``DataError``
    naming the line that is not one."""
    out: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SUM_LINE.match(line.strip())
        if m is None:
            raise DataError(f"{where}:{i}: not a '<sha256>  <file>' line: {line[:80]!r}")
        out[Path(m.group("file")).name] = m.group("sha").lower()
    return out


class _Location:
    """A folder (local or an fsspec file system) the disk's files are read from."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.fs: Any = None
        if "://" in ref:
            spec = parse_spec(ref)
            self.fs = make_filesystem(spec.protocol,
                                      storage_options_for(spec.protocol, anon=None, role="input", extra=None))
            self.root = spec.root
        else:
            self.root = str(Path(ref.removeprefix("local:")).expanduser().resolve())

    def list(self, folder: str) -> list[tuple[str, int]]:
        if self.fs is None:
            return [(p.name, p.stat().st_size) for p in Path(folder).iterdir() if p.is_file()]
        out = []
        for info in self.fs.ls(folder, detail=True):
            if info.get("type") == "file":
                out.append((str(info["name"]).rstrip("/").rsplit("/", 1)[-1], int(info.get("size") or 0)))
        return out

    def is_dir(self, path: str) -> bool:
        return Path(path).is_dir() if self.fs is None else bool(self.fs.isdir(path))

    def read_text(self, path: str) -> str:
        if self.fs is None:
            return Path(path).read_text()
        with self.fs.open(path, "rb") as f:
            return f.read().decode()

    def open(self, path: str) -> Any:
        return open(path, "rb") if self.fs is None else self.fs.open(path, "rb")  # noqa: SIM115


def fetch_vm_disk(ref: str, *, progress: Progress | None = None) -> VmDisk:
    """The verified local base disk ``ref`` names: a local ``.qcow2`` file, or a folder
    (local, ``local:``, ``gs://``, ``s3://``, ``hf://datasets/...``) in the published
    layout, or the ``.qcow2`` / ``.sha256sums`` file in one. Raises ``DataError``
    naming the file at fault."""
    say = progress or (lambda _m: None)
    if "://" not in ref:
        p = Path(ref.removeprefix("local:")).expanduser()
        if p.is_file() and p.suffix == ".qcow2" and not _listing_beside(p):
            return _local_disk(p, ref)
        if not p.exists():
            raise DataError(f"VM disk {ref!r}: {p} does not exist (give a .qcow2 file or a folder of its parts)")
    loc = _Location(ref)
    folder, disk_name = _folder_and_name(loc)
    sums_path = f"{folder}/{disk_name}{SUMS_SUFFIX}"
    files = dict(loc.list(folder))
    sums: dict[str, str]
    if f"{disk_name}{SUMS_SUFFIX}" in files:
        sums = parse_sums(loc.read_text(sums_path), sums_path)
    elif f"{disk_name}.sha256" in files:
        whole = loc.read_text(f"{folder}/{disk_name}.sha256").split()
        if not whole or not re.fullmatch(r"[0-9a-fA-F]{64}", whole[0]):
            raise DataError(f"{folder}/{disk_name}.sha256: holds no sha256")
        sums = {disk_name: whole[0].lower()}
    else:
        raise DataError(f"VM disk {ref!r}: no {disk_name}{SUMS_SUFFIX} (nor {disk_name}.sha256) in {folder}: "
                        "a published disk lists the sha256 of every part and of the whole")
    want = sums.get(disk_name)
    if want is None:
        raise DataError(f"{sums_path}: no line for the whole disk {disk_name}")
    final = disks_dir() / f"{want}.qcow2"
    if final.is_file():
        say(f"VM disk {disk_name}: cached ({final})")
        return VmDisk(final, want, final.stat().st_size, ref, parts=max(1, len(sums) - 1))
    parts = _parts(files, disk_name, sums, folder)
    tmp_fd, tmp = tempfile.mkstemp(dir=disks_dir(), prefix=".part-")
    whole_hash, total = hashlib.sha256(), 0
    try:
        with os.fdopen(tmp_fd, "wb") as out:
            for i, (name, size) in enumerate(parts, 1):
                say(f"VM disk {disk_name}: part {i}/{len(parts)} ({name}, {size / 1e9:.2f} GB)")
                h, n = hashlib.sha256(), 0
                with loc.open(f"{folder}/{name}") as src:
                    while chunk := src.read(CHUNK):
                        h.update(chunk)
                        whole_hash.update(chunk)
                        out.write(chunk)
                        n += len(chunk)
                        if n > PART_MAX_BYTES:
                            raise DataError(f"{folder}/{name}: larger than a part may be ({PART_MAX_BYTES} bytes)")
                if h.hexdigest() != sums[name]:
                    raise DataError(f"{folder}/{name}: sha256 {h.hexdigest()} differs from the listing's {sums[name]}")
                total += n
        if whole_hash.hexdigest() != want:
            raise DataError(f"VM disk {disk_name} from {ref}: the joined parts' sha256 {whole_hash.hexdigest()} "
                            f"differs from the listing's {want}")
        os.chmod(tmp, 0o444)
        os.replace(tmp, final)
    finally:
        Path(tmp).unlink(missing_ok=True)
    say(f"VM disk {disk_name}: {len(parts)} part(s) checked and joined, sha256 {want[:12]}")
    return VmDisk(final, want, total, ref, parts=len(parts))


def _listing_beside(p: Path) -> bool:
    return (p.parent / f"{p.name}{SUMS_SUFFIX}").is_file()


def _folder_and_name(loc: _Location) -> tuple[str, str]:
    """The folder holding the disk's files and the disk's file name (``X.qcow2``)."""
    root = loc.root
    if loc.is_dir(root):
        names = [n for n, _ in loc.list(root)]
        disks = sorted({n[: -len(SUMS_SUFFIX)] for n in names if n.endswith(f".qcow2{SUMS_SUFFIX}")}
                       | {m.group("disk") for n in names if (m := _PART.match(n))}
                       | {n for n in names if n.endswith(".qcow2")})
        if len(disks) != 1:
            raise DataError(f"{loc.ref}: {'no' if not disks else 'more than one'} VM disk in the folder "
                            f"({', '.join(disks) or 'no *.qcow2, *.qcow2.part-NNN or *.qcow2.sha256sums'}); name one")
        return root, disks[0]
    folder, _, name = root.rpartition("/")
    if name.endswith(SUMS_SUFFIX):
        name = name[: -len(SUMS_SUFFIX)]
    if not name.endswith(".qcow2"):
        raise DataError(f"{loc.ref}: not a .qcow2 disk, its .sha256sums listing, or a folder holding one")
    return folder, name


def _parts(files: dict[str, int], disk_name: str, sums: dict[str, str], folder: str) -> list[tuple[str, int]]:
    """The disk's parts in order, each listed and at most PART_MAX_BYTES; or the
    disk itself when it is one file."""
    parts = sorted((int(m.group("n")), n) for n in files if (m := _PART.match(n)) and m.group("disk") == disk_name)
    if not parts:
        if disk_name not in files:
            raise DataError(f"{folder}: neither {disk_name} nor its parts ({disk_name}.part-000, ...) are there")
        return [(disk_name, files[disk_name])]
    numbers = [i for i, _ in parts]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise DataError(f"{folder}: the parts of {disk_name} are not consecutive: {[n for _, n in parts]}")
    out = []
    for _, name in parts:
        if name not in sums:
            raise DataError(f"{folder}/{disk_name}{SUMS_SUFFIX}: no line for the part {name}")
        if files[name] > PART_MAX_BYTES:
            raise DataError(f"{folder}/{name}: {files[name]} bytes, larger than a part may be ({PART_MAX_BYTES})")
        out.append((name, files[name]))
    listed = {n for n in sums if _PART.match(n)}
    absent = sorted(listed - {name for name, _ in out})
    if absent:
        raise DataError(f"{folder}/{disk_name}{SUMS_SUFFIX} lists parts that are not there: {absent}")
    return out


def _local_disk(p: Path, ref: str) -> VmDisk:
    """A local qcow2 used where it lies; its sha256 cached by path, size and mtime."""
    p = p.resolve()
    st = p.stat()
    key = hashlib.sha256(f"{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:32]
    memo = disks_dir() / f".local-{key}.json"
    try:
        sha = json.loads(memo.read_text())["sha256"]
    except (OSError, ValueError, KeyError):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        sha = h.hexdigest()
        memo.write_text(json.dumps({"path": str(p), "sha256": sha}))
    return VmDisk(p, sha, st.st_size, ref)
