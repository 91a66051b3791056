"""Shared public packages: runs of the same variant stage and hash its input once.

Without sharing, every run copies and hashes its whole public package (about 6 s a
GiB here), so an experiment's staging grows with its number of runs. With it, the
first run of a variant stages the package into a content-keyed cache entry, hashes
it, and makes it read-only; every run of the same content (concurrent or later)
mounts an overlay whose lower layer is that entry and whose upper layer is in the
run's own scratch. What a task's ``start()`` writes into the input lands in the
run's upper layer only; the shared entry never changes.

Keys and checks:

- an entry's key is the data source, the variant, the package's shape (where input,
  software and the workspace's mount point sit) and the source's **fingerprint** of
  the variant's files (a stat walk of a local folder: paths, sizes, modification
  times, inodes); a source that cannot fingerprint cheaply is staged per run;
- an entry records the tree hash of the whole package and a stat fingerprint of its
  own files; a run that finds the entry re-takes that fingerprint and rebuilds the
  entry when anything changed on disk: a changed package is never reused;
- a run's input digest is the entry's when the run's upper layer is empty (nothing
  written by ``start()``), else the merged view is hashed: the evidence names the
  exact input each run's candidate saw, as before.

Overlay mounts need root; elsewhere runs stage their own copy, as before. The cache
lives under ``ALE_PACKAGE_CACHE`` (default: ale's cache folder ``packages/``), is
bounded by ``ALE_PACKAGE_CACHE_MAX_BYTES`` (default 20 GiB; least recently used
entries not in use are evicted) and emptied of unused entries by ``ale cleanup``.
``ALE_SHARED_PACKAGES=off`` turns sharing off.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.data.hashing import stat_fingerprint
from ale.paths import cache_dir
from ale.record import evidence as ev
from ale.sandbox.scratch import remove_tree

DEFAULT_MAX_BYTES = 20 * 1024**3
META = "meta.json"
PUBLIC = "public"
IN_USE = "in-use.lock"


class PackageError(RuntimeError):
    """The shared package could not be made or mounted (the run stages its own)."""


def cache_root() -> Path:
    return Path(os.environ.get("ALE_PACKAGE_CACHE") or cache_dir() / "packages")


def max_bytes() -> int:
    try:
        return int(os.environ.get("ALE_PACKAGE_CACHE_MAX_BYTES") or DEFAULT_MAX_BYTES)
    except ValueError:
        return DEFAULT_MAX_BYTES


def sharing_enabled() -> bool:
    """Root (overlay mounts) and not switched off."""
    return os.geteuid() == 0 and os.environ.get("ALE_SHARED_PACKAGES", "on").lower() not in ("0", "off", "false", "no")


@dataclass
class SharedPackage:
    """A cache entry in use by one run (its shared lock held until ``release``)."""

    key: str
    entry: Path
    meta: dict[str, Any]
    _fd: int | None

    @property
    def public(self) -> Path:
        return self.entry / PUBLIC

    def unchanged(self) -> bool:
        """The entry's files are as they were hashed (a stat walk)."""
        return stat_fingerprint(self.public) == self.meta.get("public_fingerprint")

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def entry_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _make_read_only(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o222)
        os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) & ~0o222)


def _lock(path: Path, kind: int) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, kind)
    return fd


def acquire(key: str, build: Callable[[Path], dict[str, Any]], *, root: Path | None = None) -> SharedPackage:
    """The cache entry ``key``, built with ``build(public_dir)`` (which stages the
    package there and returns what to keep of it: its ``tree``) unless a valid one is
    there. Holds the entry's shared lock until ``release``; a built entry is hashed,
    made read-only and fingerprinted before any run uses it."""
    root = root or cache_root()
    entry = root / key
    build_fd = _lock(root / ".locks" / f"{key}.lock", fcntl.LOCK_EX)
    try:
        meta = _valid_meta(entry)
        if meta is None:
            remove_tree(entry)
            tmp = root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
            try:
                (tmp / PUBLIC).mkdir(parents=True, mode=0o755)
                kept = build(tmp / PUBLIC)
                # One read of the package: the digests the copy took are reused.
                public_tree = ev.hash_tree(tmp / PUBLIC, known=kept.pop("hashed", {}))
                _make_read_only(tmp / PUBLIC)
                meta = {**kept, "key": key, "public_tree": public_tree,
                        "bytes": sum(f["size"] for f in public_tree["files"].values()),
                        "public_fingerprint": stat_fingerprint(tmp / PUBLIC), "created_at": ev.utc_now_iso()}
                (tmp / META).write_text(json.dumps(meta))
                os.replace(tmp, entry)
            except BaseException:
                remove_tree(tmp)
                raise
        use_fd = _lock(entry / IN_USE, fcntl.LOCK_SH)
        os.utime(entry / META)  # least recently used goes first
    finally:
        os.close(build_fd)
    pkg = SharedPackage(key, entry, meta, use_fd)
    evict(root, keep=key)
    return pkg


def _valid_meta(entry: Path) -> dict[str, Any] | None:
    """The entry's record when its files are still what was hashed, else None."""
    try:
        meta = json.loads((entry / META).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or stat_fingerprint(entry / PUBLIC) != meta.get("public_fingerprint"):
        return None
    return meta


def evict(root: Path | None = None, *, keep: str | None = None, limit: int | None = None) -> list[str]:
    """Remove least recently used entries not in use until the cache fits ``limit``
    (default ``max_bytes()``; 0 removes every unused entry). Returns the keys removed."""
    root = root or cache_root()
    limit = max_bytes() if limit is None else limit
    if not root.is_dir():
        return []
    entries = []
    for p in root.iterdir():
        if p.name.startswith(".") or not p.is_dir():
            continue
        try:
            meta = json.loads((p / META).read_text())
            entries.append((os.stat(p / META).st_mtime, p, int(meta.get("bytes", 0))))
        except (OSError, ValueError):
            entries.append((0.0, p, 0))
    total = sum(b for _, _, b in entries)
    removed = []
    for _, p, size in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if p.name == keep:
            continue
        try:
            fd = _lock(p / IN_USE, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # in use by a run
        try:
            build_fd = _lock(root / ".locks" / f"{p.name}.lock", fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            remove_tree(p)
        finally:
            os.close(fd)
            os.close(build_fd)
        total -= size
        removed.append(p.name)
    return removed


def mount_overlay(lower: Path, scratch: Path, target: Path) -> None:
    """``target`` shows ``lower`` (read-only, shared) with the run's own upper layer
    in ``scratch``: what is written there stays in this run."""
    upper, work = scratch / "package-upper", scratch / "package-work"
    upper.mkdir(mode=0o755)
    work.mkdir(mode=0o700)
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    proc = subprocess.run(["mount", "-t", "overlay", "ale-package", "-o", opts, str(target)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise PackageError(f"cannot mount the shared package {lower} on {target}: {proc.stderr.strip()}")


def upper_untouched(scratch: Path) -> bool:
    """Nothing was written over the shared package in this run."""
    upper = scratch / "package-upper"
    try:
        with os.scandir(upper) as it:
            return next(it, None) is None
    except OSError:
        return False


def clear_unused() -> tuple[list[str], int]:
    """``ale cleanup``: every entry no run uses; (keys removed, entries left)."""
    root = cache_root()
    removed = evict(root, limit=0)
    left = sum(1 for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else 0
    with contextlib.suppress(OSError):
        for tmp in root.glob(".tmp-*"):
            if time.time() - tmp.stat().st_mtime > 3600:
                remove_tree(tmp)
    return removed, left
