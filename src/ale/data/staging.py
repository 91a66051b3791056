"""What every source does the same way when it stages: an empty destination, the
check of a reference against its commitment, the atomic move into place, the
decryption of a reference.7z on the trusted side, the check against manifest.json.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ale.data.base import DataError, ReferenceCommitment, ReferenceError, TreeHash, VariantKey
from ale.data.hashing import copy_hashing
from ale.data.sealing import (
    ARCHIVE_NAME,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    archive_password,
    extract_archive,
)


def prepare_dest(dest: Path) -> None:
    """dest must be an empty folder (created when missing); DataError naming it otherwise."""
    if dest.is_symlink():
        raise DataError(f"staging folder {dest} is a symbolic link")
    if dest.exists():
        if not dest.is_dir():
            raise DataError(f"staging folder {dest} exists and is not a folder")
        if any(dest.iterdir()):
            raise DataError(f"staging folder {dest} is not empty")
    else:
        dest.mkdir(parents=True)
    os.chmod(dest, 0o755)


def check_commitment(
    key: VariantKey, got: ReferenceCommitment | None, committed: ReferenceCommitment | None
) -> None:
    """ReferenceError unless the reference found (`got`) is the one committed."""
    if committed is None and got is None:
        return
    if committed is None:
        raise ReferenceError(f"{key.relpath}: a reference appeared after the run committed to none")
    if got is None:
        raise ReferenceError(f"{key.relpath}: the committed reference ({committed.kind} "
                             f"sha256:{committed.sha256}) is gone")
    if got.kind != committed.kind or got.sha256 != committed.sha256:
        raise ReferenceError(
            f"{key.relpath}: reference {got.kind} sha256:{got.sha256} does not match the "
            f"{committed.kind} sha256:{committed.sha256} committed before the run"
        )


def finish_reference_dir(staging: Path, dest: Path) -> None:
    """Move a fully checked staging folder into place at dest (an empty or missing folder).

    ReferenceError when dest exists and is anything but an empty folder."""
    if dest.exists():
        if dest.is_symlink() or not dest.is_dir() or any(dest.iterdir()):
            raise ReferenceError(f"cannot stage the reference into {dest}: it exists and is not an empty folder")
        dest.rmdir()
    os.chmod(staging, 0o755)
    os.rename(staging, dest)


def stage_archive_file(
    key: VariantKey,
    archive: Path,
    dest: Path,
    commitment: ReferenceCommitment,
    *,
    secret_store: Path | None,
    origin: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> None:
    """Check a reference.7z against its commitment and decrypt it into dest (trusted side).

    `origin` names where the archive came from (a path or URL) in messages; the
    password comes from `secret_store`, else ALE_REFERENCE_ARCHIVE_PASSWORD (see
    ale.data.sealing.archive_password). Every failure is a ReferenceError naming
    the variant and the archive: a digest other than the committed one, no
    password, a wrong password or corrupt archive, an unsafe entry, the limits.
    """
    where = origin or str(archive)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".ref-archive-", dir=dest.parent))
    try:
        os.chmod(work, 0o700)
        copy = work / ARCHIVE_NAME
        # The private copy is what gets checked and decrypted: no later change to the
        # source file can slip in between the check and the unpacking.
        try:
            digest, _ = copy_hashing(archive, copy, mode=0o600)
        except DataError as exc:
            raise ReferenceError(f"{key.relpath}: {exc}") from exc
        if digest != commitment.sha256:
            raise ReferenceError(
                f"{key.relpath}: reference archive {where} sha256:{digest} does not match the "
                f"archive sha256:{commitment.sha256} committed before the run"
            )
        try:
            secret = archive_password(digest, secret_store, archive=where)
        except ReferenceError as exc:
            raise ReferenceError(f"{key.relpath}: {exc}") from exc
        try:
            extract_archive(copy, secret.password, dest, expected_sha256=None, max_bytes=max_bytes, max_files=max_files)
        except ReferenceError as exc:
            raise ReferenceError(
                f"{key.relpath}: reference archive {where} (sha256:{digest}), password from "
                f"{secret.origin}: {exc}"
            ) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_against_manifest(tree: TreeHash, manifest: dict[str, Any], part: str, where: Any) -> None:
    """Every staged file of `part` must match the manifest, and every listed one must exist.

    DataError (infrastructure_error) naming `where` and the file otherwise."""
    listed = {
        rel[len(part) + 1 :]: entry
        for rel, entry in manifest.get("files", {}).items()
        if rel.startswith(part + "/")
    }
    if not listed:
        return
    for rel, entry in tree["files"].items():
        want = listed.get(rel)
        if want is None:
            raise DataError(f"{where}: {part}/{rel} is not in manifest.json")
        if want["sha256"] != entry["sha256"] or int(want["size"]) != entry["size"]:
            raise DataError(
                f"{where}: {part}/{rel} has sha256 {entry['sha256']} ({entry['size']} bytes) but "
                f"manifest.json says sha256 {want['sha256']} ({want['size']} bytes)"
            )
    missing = sorted(set(listed) - set(tree["files"]))
    if missing:
        raise DataError(f"{where}: {part}/{missing[0]} is in manifest.json but missing ({len(missing)} missing)")
