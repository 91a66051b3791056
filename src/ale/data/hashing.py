"""Tree hashes and the copy-while-hashing primitive every source stages with.

A tree hash is ``{"files": {relpath: {"sha256", "size"}}, "digest", "count"}``:
relpaths use ``/``, and ``digest`` is the sha256 over the lines
``f"{relpath}\\0{sha256}\\0{size}\\n"`` in sorted relpath order (the same format as
``ale.isolation.evidence.hash_tree``). Empty folders do not appear in it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ale.data.base import DataError, TreeHash

CHUNK = 1 << 20
# Files at most this large are read in one call: most inputs are many small files.
SMALL = 1 << 16


def tree_digest(files: Mapping[str, Mapping[str, Any]]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        entry = files[rel]
        h.update(f"{rel}\0{entry['sha256']}\0{entry['size']}\n".encode())
    return h.hexdigest()


def make_tree_hash(files: Mapping[str, Mapping[str, Any]]) -> TreeHash:
    ordered = {rel: {"sha256": files[rel]["sha256"], "size": int(files[rel]["size"])} for rel in sorted(files)}
    return {"files": ordered, "digest": tree_digest(ordered), "count": len(ordered)}


def sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def hash_tree(root: Path) -> TreeHash:
    """Hash every regular file under root without following links (links are errors)."""
    files: dict[str, dict[str, Any]] = {}
    for rel, kind in walk_tree(root):
        if kind == "file":
            digest, size = sha256_file(root / rel)
            files[rel] = {"sha256": digest, "size": size}
    return make_tree_hash(files)


def walk_tree(root: Path) -> list[tuple[str, str]]:
    """(relpath, "dir"|"file") for everything under root, parents first, no links followed.

    Anything but a regular file or a folder (a symlink, FIFO, socket, device) is a
    DataError naming it: a data tree never needs one, and following one could read
    outside the tree.
    """
    out: list[tuple[str, str]] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        here = root / rel_dir if rel_dir else root
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError as exc:
            raise DataError(f"cannot list {here}: {exc.strerror or exc}") from exc
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                out.append((rel, "dir"))
                subdirs.append(rel)
            elif stat.S_ISREG(st.st_mode):
                out.append((rel, "file"))
            elif stat.S_ISLNK(st.st_mode):
                raise DataError(f"{root / rel} is a symbolic link; data trees may hold only regular files and folders")
            else:
                raise DataError(f"{root / rel} is not a regular file or folder (mode {oct(st.st_mode)})")
        stack.extend(reversed(subdirs))
    return out


def copy_hashing(src: Path, dst: Path, *, mode: int | None = None) -> tuple[str, int]:
    """Copy one regular file (never following a link) and hash it in the same read pass."""
    h = hashlib.sha256()
    size = 0
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fin = os.open(src, flags)
    except OSError as exc:
        raise DataError(f"cannot read {src}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fin)
        if not stat.S_ISREG(st.st_mode):
            raise DataError(f"{src} is not a regular file")
        perm = _readable(st.st_mode) if mode is None else mode
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), perm)
        try:
            if st.st_size <= SMALL:
                data = os.read(fin, SMALL + 1)
                while data:
                    h.update(data)
                    size += len(data)
                    write_all(fout, data)
                    data = os.read(fin, CHUNK)
            else:
                buf = bytearray(CHUNK)
                view = memoryview(buf)
                while n := os.readv(fin, [buf]):
                    h.update(view[:n])
                    write_all(fout, view[:n])
                    size += n
            os.fchmod(fout, perm)  # the umask must not narrow what uid 1000 can read
        finally:
            os.close(fout)
    except OSError as exc:
        raise DataError(f"copying {src} to {dst} failed: {exc.strerror or exc}") from exc
    finally:
        os.close(fin)
    return h.hexdigest(), size


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def runnable_mode(path: Path | str, mode: int = 0o644) -> int:
    """0o755 for a file that is meant to run: one whose ``mode`` has an execute bit,
    or that starts with ``#!`` or is an ELF binary (object stores and archives keep
    no file modes: ALE's graders ``chmod +x`` what GCS stripped, which a read-only
    mount refuses); else 0o644. Readable by everyone either way."""
    if mode & 0o111:
        return 0o755
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return 0o644
    return 0o755 if head[:2] == b"#!" or head == b"\x7fELF" else 0o644


def restore_runnable(root: Path) -> None:
    """Folders 0o755, files ``runnable_mode`` (their execute bits kept or sniffed)."""
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.chmod(p, runnable_mode(p, stat.S_IMODE(st.st_mode)))


def _readable(mode: int) -> int:
    """Keep the permission bits but make the file readable by everyone (uid 1000 included);
    setuid/setgid/sticky bits are dropped."""
    return (stat.S_IMODE(mode) & 0o777) | 0o644


def copy_tree_hashing(
    src: Path,
    dst: Path,
    *,
    workers: int = 4,
    on_file: Callable[[int], None] | None = None,
) -> TreeHash:
    """Copy src's files and folders into the existing folder dst, hashing while copying.

    Folders get mode 0755 at least, files 0644 at least (exec bits are kept). A
    symlink or special file anywhere in src is a DataError naming it, raised before
    anything is copied.
    """
    listing = walk_tree(src)
    for rel, kind in listing:
        if kind == "dir":
            st = os.lstat(src / rel)
            os.mkdir(dst / rel, 0o755)
            os.chmod(dst / rel, (stat.S_IMODE(st.st_mode) & 0o777) | 0o755)
    rels = [rel for rel, kind in listing if kind == "file"]

    def one(rel: str) -> tuple[str, str, int]:
        digest, size = copy_hashing(src / rel, dst / rel)
        if on_file is not None:
            on_file(size)
        return rel, digest, size

    files: dict[str, dict[str, Any]] = {}
    results: Iterable[tuple[str, str, int]]
    if workers > 1 and len(rels) > 8:
        # Threads overlap the per-file syscalls; sha256 and I/O release the GIL.
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(one, rels))
    else:
        results = [one(rel) for rel in rels]
    for rel, digest, size in results:
        files[rel] = {"sha256": digest, "size": size}
    return make_tree_hash(files)


def stat_fingerprint(*roots: Path) -> str:
    """A cheap identity of folders' contents: every entry's path, type, mode, size,
    modification time and inode (no file is read)."""
    h = hashlib.sha256()
    for root in roots:
        h.update(b"\0root\0" + os.fsencode(root.name))
        if not os.path.lexists(root):
            h.update(b"absent")
            continue
        stack = [""]
        while stack:
            rel = stack.pop()
            with os.scandir(root / rel if rel else root) as it:
                entries = sorted(it, key=lambda e: e.name)
            for e in entries:
                sub = f"{rel}/{e.name}" if rel else e.name
                st = e.stat(follow_symlinks=False)
                h.update(f"{sub}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode(errors="surrogateescape"))
                if stat.S_ISDIR(st.st_mode):
                    stack.append(sub)
    return h.hexdigest()
