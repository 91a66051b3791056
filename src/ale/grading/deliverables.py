"""Copy what the agent left in the workspace out, on the host, never following links.

Regular files only; symlinks, hard links, FIFOs, sockets, devices and
setuid/setgid files are skipped and recorded; total size and file count are
capped; every copied file is hashed while it is copied.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ale.data.hashing import tree_digest


class DeliverableFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    size: int
    sha256: str
    mode: int | None = None  # the permission bits the candidate gave it (kept on the copy)


class SkippedEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    reason: str


class DeliverablesManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: list[DeliverableFile]
    skipped: list[SkippedEntry]
    total_bytes: int
    digest: str  # sha256 over the sorted (path, sha256, size) listing


def listing_digest(files: list[DeliverableFile]) -> str:
    """The tree digest every hashed listing in ale uses (input, reference, deliverables)."""
    return tree_digest({f.path: {"sha256": f.sha256, "size": f.size} for f in files})


def _copy_hashing(src_fd: int, dest: Path, limit: int) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        while True:
            chunk = os.read(src_fd, 1 << 20)
            if not chunk:
                break
            n += len(chunk)
            if n > limit:
                raise OverflowError
            h.update(chunk)
            os.write(fd, chunk)
    finally:
        os.close(fd)
    return h.hexdigest(), n


def _keep_mode(path: Path, mode: int, owner: tuple[int, int] | None) -> None:
    if owner is not None:
        try:
            os.chown(path, *owner, follow_symlinks=False)
        except PermissionError:
            mode |= 0o444  # not ours to give away: keep it readable by the grader instead
    os.chmod(path, mode & 0o777, follow_symlinks=False)


def extract_deliverables(
    workspace: Path, dest: Path, *, max_files: int, max_bytes: int, owner: tuple[int, int] | None = None
) -> DeliverablesManifest:
    """Copy regular files from `workspace` into `dest` (which must not exist).

    Each copy keeps the permission bits the candidate gave the file (setuid and
    setgid files are never copied) and, with ``owner`` (the candidate's uid:gid,
    when the harness may chown), its owner too: a grader running as the candidate
    user sees the files as the candidate left them (ALE graders check outputs
    made read-only, for one)."""
    dest.mkdir(parents=True, exist_ok=False, mode=0o755)
    files: list[DeliverableFile] = []
    skipped: list[SkippedEntry] = []
    total = 0
    root_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)

    def walk(dir_fd: int, rel: str) -> None:
        nonlocal total
        for name in sorted(os.listdir(dir_fd)):
            relpath = f"{rel}/{name}" if rel else name
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except OSError as e:
                    skipped.append(SkippedEntry(path=relpath, reason=f"unreadable directory: {e.strerror}"))
                    continue
                try:
                    (dest / relpath).mkdir(mode=0o755)
                    walk(sub, relpath)
                finally:
                    os.close(sub)
                continue
            reason = None
            if stat.S_ISLNK(mode):
                reason = "symlink"
            elif not stat.S_ISREG(mode):
                reason = "not a regular file (fifo, socket or device)"
            elif st.st_nlink > 1:
                reason = "hard link"
            elif mode & (stat.S_ISUID | stat.S_ISGID):
                reason = "setuid/setgid"
            elif len(files) >= max_files:
                reason = f"file count cap of {max_files} reached"
            elif total + st.st_size > max_bytes:
                reason = f"total size cap of {max_bytes} bytes reached"
            if reason:
                skipped.append(SkippedEntry(path=relpath, reason=reason))
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError as e:
                skipped.append(SkippedEntry(path=relpath, reason=f"unreadable: {e.strerror}"))
                continue
            try:
                # Re-check on the open descriptor: the entry may have been swapped.
                fst = os.fstat(fd)
                if not stat.S_ISREG(fst.st_mode) or fst.st_ino != st.st_ino:
                    skipped.append(SkippedEntry(path=relpath, reason="changed while copying"))
                    continue
                try:
                    digest, size = _copy_hashing(fd, dest / relpath, max_bytes - total)
                except OverflowError:
                    (dest / relpath).unlink(missing_ok=True)
                    skipped.append(SkippedEntry(path=relpath, reason=f"total size cap of {max_bytes} bytes reached"))
                    continue
            finally:
                os.close(fd)
            total += size
            _keep_mode(dest / relpath, stat.S_IMODE(st.st_mode), owner)
            files.append(DeliverableFile(path=relpath, size=size, sha256=digest, mode=stat.S_IMODE(st.st_mode)))

    try:
        walk(root_fd, "")
    finally:
        os.close(root_fd)
    return DeliverablesManifest(files=files, skipped=skipped, total_bytes=total, digest=listing_digest(files))
