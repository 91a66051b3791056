"""What the task's ``start()`` wrote, kept in the run folder and signed with it.

``start()`` may add files to the public package (``echo_secret`` writes a per-run
secret into its input) and to the reference (the expected value). Run again, a
``start()`` that draws anything at random writes something else, so a regrade could
not stage what the run graded. The run therefore keeps what ``start()`` changed:

- ``start/public/<rel>``: each file of the public package ``start()`` added or changed
  (found by comparing the package's listing before ``start()`` with the one after,
  and each kept copy checked against ``evidence/input-after-start.json``); the
  record ``evidence/start-writes.json`` lists them, what ``start()`` removed and the
  links it made;
- ``start/reference/<rel>``: what ``start()`` wrote into the reference, copied once
  the candidate's sandbox is gone (``stage_reference``), listed in
  ``evidence/reference-check.json`` under ``kept``.

Both are files of the run folder, so the signed manifest covers them. ``ale regrade``
stages the input from the data source, lays these over it, and compares the result
with the run's commitments (``input-after-start.json``, ``reference-commit.json``)
before grading: what it grades is what the run graded, from the record alone.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

from ale import layout
from ale.record import evidence as ev
from ale.record.regrades import read_json

START_DIR, PUBLIC, REFERENCE = layout.START_DIR, layout.START_PUBLIC, layout.START_REFERENCE

Listing = dict[str, tuple[int, int, int, int, str | None]]


def listing(root: Path) -> Listing:
    """Every entry under ``root`` but folders, by relpath: (mode, size, mtime_ns,
    inode, link target). A stat walk: nothing is read."""
    out: Listing = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        rel_base = base.relative_to(root)
        names = list(filenames) + [d for d in dirnames if os.path.islink(base / d)]
        for name in names:
            p = base / name
            st = os.lstat(p)
            rel = (rel_base / name).as_posix()
            target = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
            out[rel] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, target)
    return out


def _copy(src: Path, dest: Path, mode: int = 0o644) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest, follow_symlinks=False)
    os.chmod(dest, mode)


def keep_public(run_dir: Path, public: Path, before: Listing, after_tree: dict[str, Any]) -> dict[str, Any]:
    """Copy into ``start/public/`` every regular file of ``public`` that start()
    added or changed (its listing differs from ``before``), each copy hashed and
    compared with ``after_tree`` (the package's hash once start() ran); return the
    record for ``evidence/start-writes.json``."""
    now = listing(public)
    files: dict[str, Any] = {}
    links: dict[str, str] = {}
    for rel, entry in now.items():
        if before.get(rel) == entry:
            continue
        mode, _size, _mtime, _ino, target = entry
        if target is not None:
            links[rel] = target
        elif stat.S_ISREG(mode):
            dest = run_dir / PUBLIC / rel
            _copy(public / rel, dest)
            files[rel] = {"sha256": ev.sha256_file(dest), "size": dest.stat().st_size}
    removed = sorted(set(before) - set(now))
    want = after_tree.get("files") or {}
    differ = sorted(rel for rel, f in files.items() if (want.get(rel) or {}).get("sha256") != f["sha256"])
    return {"dir": PUBLIC, "files": files, "links": links, "removed": removed,
            "input_after_start_digest": after_tree.get("digest"),
            # a file changed again between the hash and the copy: the kept copy is no proof
            "differ_from_input_after_start": differ}


def keep_reference(run_dir: Path, setup_reference: Path, setup_tree: dict[str, Any]) -> dict[str, Any]:
    """Copy what start() wrote into the reference (``setup_tree``, already checked
    against its commitment) into ``start/reference/`` (folders 0700: the trusted
    side's); return its record."""
    for rel in setup_tree.get("files") or {}:
        dest = run_dir / REFERENCE / rel
        _copy(setup_reference / rel, dest, 0o600)
    if (run_dir / REFERENCE).is_dir():
        for dirpath, _dirs, _files in os.walk(run_dir / START_DIR / "reference"):
            os.chmod(dirpath, 0o700)
    return {"dir": REFERENCE, "files": dict(setup_tree.get("files") or {}), "digest": setup_tree.get("digest")}


def kept(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The run's kept start() writes (public, reference), or None when the run did
    not keep them (a folder written before they were kept, or a run whose grading
    never staged the reference): then start() must run again."""
    public = read_json(run_dir / layout.evidence_path(layout.Evidence.START_WRITES))
    check = read_json(run_dir / layout.evidence_path(layout.Evidence.REFERENCE_CHECK))
    commit = read_json(run_dir / layout.evidence_path(layout.Evidence.REFERENCE_COMMIT))
    if not isinstance(public, dict) or not isinstance(commit, dict):
        return None
    reference = check.get("kept") if isinstance(check, dict) else None
    if not isinstance(reference, dict):
        written = (commit.get("setup_written") or {}).get("files")
        if written:  # start() wrote a reference the run did not keep
            return None
        reference = {"dir": REFERENCE, "files": {}}
    return public, reference


class KeptWritesError(ValueError):
    """The kept start() writes cannot be laid over the staged input."""


def _inside(root: Path, rel: str) -> Path:
    p = root / rel
    if rel.startswith("/") or ".." in Path(rel).parts or not rel:
        raise KeptWritesError(f"{rel!r} is no path inside the package")
    return p


def apply(run_dir: Path, public_rec: dict[str, Any], reference_rec: dict[str, Any], public: Path,
          setup_reference: Path) -> None:
    """Lay the kept writes over a freshly staged ``public`` package and into an empty
    ``setup_reference`` folder, as start() left them in the run."""
    for rel in public_rec.get("removed") or []:
        p = _inside(public, rel)
        if p.is_symlink() or p.is_file():
            p.unlink()
    for rel in public_rec.get("files") or {}:
        src = _inside(run_dir / PUBLIC, rel)
        if not src.is_file() or src.is_symlink():
            raise KeptWritesError(f"{PUBLIC}/{rel} is missing from the run folder")
        dest = _inside(public, rel)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        _copy(src, dest)
    for rel, target in (public_rec.get("links") or {}).items():
        dest = _inside(public, rel)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, dest)
    for rel in reference_rec.get("files") or {}:
        src = _inside(run_dir / REFERENCE, rel)
        if not src.is_file() or src.is_symlink():
            raise KeptWritesError(f"{REFERENCE}/{rel} is missing from the run folder")
        _copy(src, _inside(setup_reference, rel), 0o600)
