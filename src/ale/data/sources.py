"""Open a data source from its spec, and the `local:` source.

Specs: ``local:<dir>`` (or a plain path), ``s3://bucket/prefix``,
``gs://bucket/prefix``, ``hf://datasets/<org>/<name>[@revision]`` and
``image:<ref>`` (a baked image). Every source stages the same layout:
``<root>/tasks/<domain>/<task>/<variant>/{input,software,reference|reference.7z}``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ale.data.base import (
    DataError,
    DataSource,
    ReferenceCommitment,
    ReferenceError,
    TreeHash,
    VariantKey,
)
from ale.data.hashing import copy_hashing, copy_tree_hashing, hash_tree
from ale.data.sealing import (
    ARCHIVE_NAME,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    SecretStore,
    extract_archive,
    read_manifest,
)

REMOTE_SCHEMES = ("s3://", "gs://", "gcs://", "hf://", "memory://")


def open_source(
    spec: str,
    *,
    base_dir: Path | None = None,
    anon: bool | None = None,
    storage_options: dict[str, Any] | None = None,
    reference_storage_options: dict[str, Any] | None = None,
    secret_store: Path | None = None,
    docker_client: Any | None = None,
) -> DataSource:
    """The data source a spec names.

    `base_dir` resolves a relative local path (default: the current folder).
    `anon`, `storage_options` and `reference_storage_options` configure remote
    sources (see ale.data.remote); `secret_store` is the grader's password file for
    sealed references; `docker_client` serves `image:` sources.
    """
    spec = spec.strip()
    if not spec:
        raise DataError("empty data source spec")
    if spec.startswith("image:"):
        from ale.data.baked import ImageSource

        return ImageSource(spec, client=docker_client, secret_store=secret_store)
    if spec.startswith(REMOTE_SCHEMES):
        from ale.data.remote import RemoteSource

        return RemoteSource(
            spec,
            anon=anon,
            storage_options=storage_options,
            reference_storage_options=reference_storage_options,
            secret_store=secret_store,
        )
    if spec.startswith("file://"):
        spec = "local:" + spec[len("file://") :]
    if "://" in spec:
        raise DataError(
            f"unknown data source {spec!r}: use local:<dir>, s3://, gs://, hf://datasets/<org>/<name> or image:<ref>"
        )
    raw = spec[len("local:") :] if spec.startswith("local:") else spec
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    return LocalSource(path, secret_store=secret_store)


def prepare_dest(dest: Path) -> None:
    """dest must be an empty folder (created when missing)."""
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
    if committed is None and got is None:
        return
    if committed is None:
        raise ReferenceError(f"{key.relpath}: a reference appeared after the run committed to none")
    if got is None:
        raise ReferenceError(f"{key.relpath}: the committed reference ({committed.kind} sha256:{committed.sha256}) is gone")
    if got.kind != committed.kind or got.sha256 != committed.sha256:
        raise ReferenceError(
            f"{key.relpath}: reference {got.kind} sha256:{got.sha256} does not match the "
            f"{committed.kind} sha256:{committed.sha256} committed before the run"
        )


def finish_reference_dir(staging: Path, dest: Path) -> None:
    """Move a fully checked staging folder into place at dest (an empty or missing folder)."""
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
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> None:
    """Check a reference.7z against its commitment and decrypt it into dest (trusted side)."""
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
                f"{key.relpath}: reference archive sha256:{digest} does not match the "
                f"archive sha256:{commitment.sha256} committed before the run"
            )
        password = SecretStore(secret_store).get(digest)
        extract_archive(copy, password, dest, expected_sha256=None, max_bytes=max_bytes, max_files=max_files)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class LocalSource:
    """Task data in a folder on this machine."""

    def __init__(
        self,
        root: Path,
        *,
        secret_store: Path | None = None,
        max_reference_bytes: int = DEFAULT_MAX_BYTES,
        max_reference_files: int = DEFAULT_MAX_FILES,
        workers: int = 4,
    ) -> None:
        self.root = Path(root)
        self.spec = f"local:{self.root}"
        self.secret_store = secret_store
        self.max_reference_bytes = max_reference_bytes
        self.max_reference_files = max_reference_files
        self.workers = workers

    def __repr__(self) -> str:
        return f"LocalSource({str(self.root)!r})"

    # ------------------------------------------------------------------ layout

    def variant_dir(self, key: VariantKey) -> Path:
        if not self.root.is_dir():
            raise DataError(f"data root {self.root} not found")
        path = self.root / key.relpath
        if not path.is_dir():
            raise DataError(f"variant folder {path} not found (available: {self._available(path.parent)})")
        return path

    def _available(self, task_dir: Path) -> str:
        if task_dir.is_dir():
            names = sorted(p.name for p in task_dir.iterdir() if p.is_dir())
            return ", ".join(names) if names else "none"
        parent = task_dir.parent
        if parent.is_dir():
            tasks = sorted(p.name for p in parent.iterdir() if p.is_dir())
            return f"no task folder {task_dir}; tasks there: {', '.join(tasks) or 'none'}"
        return f"no folder {parent}"

    def variants(self) -> list[VariantKey]:
        tasks = self.root / "tasks"
        out = []
        if tasks.is_dir():
            for d in sorted(tasks.iterdir()):
                for t in sorted(d.iterdir()) if d.is_dir() else []:
                    for v in sorted(t.iterdir()) if t.is_dir() else []:
                        if v.is_dir():
                            out.append(VariantKey(d.name, t.name, v.name))
        return out

    # ------------------------------------------------------------------ input

    def stage_input(self, key: VariantKey, dest: Path) -> TreeHash:
        vdir = self.variant_dir(key)
        src = vdir / "input"
        if src.is_symlink() or not src.is_dir():
            raise DataError(f"input folder {src} not found")
        dest = Path(dest)
        prepare_dest(dest)
        tree = copy_tree_hashing(src, dest, workers=self.workers)
        manifest = read_manifest(vdir)
        if manifest is not None:
            check_against_manifest(tree, manifest, "input", vdir)
        software = vdir / "software"
        if software.is_dir() and not software.is_symlink():
            sdest = dest.parent / "software"
            prepare_dest(sdest)
            stree = copy_tree_hashing(software, sdest, workers=self.workers)
            if manifest is not None:
                check_against_manifest(stree, manifest, "software", vdir)
        return tree

    # ------------------------------------------------------------------ reference

    def commit_reference(self, key: VariantKey) -> ReferenceCommitment | None:
        vdir = self.variant_dir(key)
        archive = vdir / ARCHIVE_NAME
        ref = vdir / "reference"
        if archive.is_file() and not archive.is_symlink():
            from ale.data.hashing import sha256_file

            digest, _ = sha256_file(archive)
            manifest = read_manifest(vdir) or {}
            info = manifest.get("reference_archive") or {}
            files = int(info.get("files", 0)) if info.get("sha256") == digest else 0
            return ReferenceCommitment("archive", digest, files)
        if ref.is_dir() and not ref.is_symlink():
            tree = hash_tree(ref)
            return ReferenceCommitment("tree", tree["digest"], tree["count"])
        return None

    def stage_reference(
        self, key: VariantKey, dest: Path, commitment: ReferenceCommitment | None
    ) -> None:
        vdir = self.variant_dir(key)
        dest = Path(dest)
        archive = vdir / ARCHIVE_NAME
        ref = vdir / "reference"
        if commitment is None:
            if (archive.is_file() or ref.is_dir()) and self.commit_reference(key) is not None:
                raise ReferenceError(f"{key.relpath}: a reference appeared after the run committed to none")
            prepare_dest(dest)
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        if commitment.kind == "archive":
            if not archive.is_file() or archive.is_symlink():
                raise ReferenceError(f"{key.relpath}: {archive} not found, but an archive was committed")
            stage_archive_file(
                key,
                archive,
                dest,
                commitment,
                secret_store=self.secret_store,
                max_bytes=self.max_reference_bytes,
                max_files=self.max_reference_files,
            )
            return
        if commitment.kind != "tree":
            raise ReferenceError(f"{key.relpath}: unknown commitment kind {commitment.kind!r}")
        if not ref.is_dir() or ref.is_symlink():
            raise ReferenceError(f"{key.relpath}: reference folder {ref} not found, but a tree was committed")
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.stage-", dir=dest.parent))
        try:
            os.chmod(staging, 0o700)  # nothing sees the tree before its digest is checked
            try:
                tree = copy_tree_hashing(ref, staging, workers=self.workers)
            except DataError as exc:
                raise ReferenceError(f"{key.relpath}: {exc}") from exc
            check_commitment(key, ReferenceCommitment("tree", tree["digest"], tree["count"]), commitment)
            finish_reference_dir(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def check_against_manifest(tree: TreeHash, manifest: dict[str, Any], part: str, where: Any) -> None:
    """Every staged file of `part` must match the manifest, and every listed one must exist."""
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
