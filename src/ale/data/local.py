"""The `local:` source: task data in a folder on this machine, in either layout
(ale.data.roots)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ale.data.base import (
    DataError,
    DataMissing,
    Layout,
    LayoutChoice,
    ReferenceCommitment,
    ReferenceError,
    TreeHash,
    VariantKey,
    check_layout,
)
from ale.data.hashing import copy_tree_hashing, hash_tree, sha256_file, stat_fingerprint
from ale.data.roots import list_variants, resolve_layout, with_layout
from ale.data.sealing import (
    ARCHIVE_NAME,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    MANIFEST_NAME,
    read_manifest,
)
from ale.data.staging import (
    check_against_manifest,
    check_commitment,
    finish_reference_dir,
    prepare_dest,
    stage_archive_file,
)


class LocalSource:
    """Task data in a folder on this machine.

    `layout` is "auto" (each variant is found under `<root>/<d>/<t>/<v>` or
    `<root>/tasks/<d>/<t>/<v>`, never both), "ale" or "tasks". A variant's layout is
    resolved on first use and pinned for the life of the source.
    """

    def __init__(
        self,
        root: Path,
        *,
        layout: LayoutChoice = "auto",
        secret_store: Path | None = None,
        max_reference_bytes: int = DEFAULT_MAX_BYTES,
        max_reference_files: int = DEFAULT_MAX_FILES,
        workers: int = 4,
    ) -> None:
        self.root = Path(root)
        self.layout: LayoutChoice = check_layout(layout, f"local:{self.root}")
        self.spec = with_layout(f"local:{self.root}", self.layout)
        self.secret_store = secret_store
        self.max_reference_bytes = max_reference_bytes
        self.max_reference_files = max_reference_files
        self.workers = workers
        self._layouts: dict[VariantKey, Layout] = {}

    def __repr__(self) -> str:
        return f"LocalSource({str(self.root)!r}, layout={self.layout!r})"

    # ------------------------------------------------------------------ layout

    def layout_of(self, key: VariantKey) -> Layout:
        if key not in self._layouts:
            if not self.root.is_dir():
                raise DataMissing(f"data root {self.root} not found")
            self._layouts[key] = resolve_layout(
                key,
                self.layout,
                exists=lambda layout: (self.root / key.relpath_in(layout)).is_dir(),
                location=lambda layout: str(self.root / key.relpath_in(layout)),
                available=lambda layout: self._available(self.root / key.relpath_in(layout)),
            )
        return self._layouts[key]

    def variant_dir(self, key: VariantKey) -> Path:
        """The variant's folder; DataError naming the paths tried when it is missing."""
        return self.root / key.relpath_in(self.layout_of(key))

    def location(self, key: VariantKey) -> str:
        return str(self.variant_dir(key))

    def _available(self, variant_dir: Path) -> tuple[int, str]:
        task_dir = variant_dir.parent
        if task_dir.is_dir():
            names = sorted(p.name for p in task_dir.iterdir() if p.is_dir())
            return 2, ", ".join(names) if names else "none"
        parent = task_dir.parent
        if parent.is_dir():
            tasks = sorted(p.name for p in parent.iterdir() if p.is_dir())
            return 1, f"no task folder {task_dir}; tasks there: {', '.join(tasks) or 'none'}"
        return 0, f"no folder {parent}"

    def variants(self) -> list[VariantKey]:
        if not self.root.is_dir():
            raise DataMissing(f"data root {self.root} not found")

        def subdirs(rel: str) -> list[str]:
            here = self.root / rel if rel else self.root
            if here.is_symlink() or not here.is_dir():
                return []
            try:
                return sorted(e.name for e in os.scandir(here) if e.is_dir(follow_symlinks=False))
            except OSError as exc:
                raise DataError(f"cannot list {here}: {exc.strerror or exc}") from exc

        return list_variants(self.layout, subdirs)

    def prefetch_variant(self, key: VariantKey, *, reference: bool = False) -> int:
        """Nothing to fetch: checks the variant and its input/ exist."""
        vdir = self.variant_dir(key)
        if not (vdir / "input").is_dir():
            raise DataMissing(f"input folder {vdir / 'input'} not found")
        return 0

    # ------------------------------------------------------------------ input

    def fingerprint(self, key: VariantKey) -> str:
        """A cheap identity of what ``stage_input`` would copy (a stat walk of the
        variant's input/ and software/, and its manifest): runs whose fingerprint
        matches share one staged package (``ale.runs.packages``)."""
        vdir = self.variant_dir(key)
        return stat_fingerprint(vdir / "input", vdir / "software", vdir / MANIFEST_NAME)

    def stage_input(self, key: VariantKey, dest: Path) -> TreeHash:
        vdir = self.variant_dir(key)
        src = vdir / "input"
        if src.is_symlink() or not src.is_dir():
            raise DataMissing(f"input folder {src} not found")
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
        try:
            vdir = self.variant_dir(key)
        except DataError as exc:
            raise ReferenceError(str(exc)) from exc
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
                origin=str(archive),
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
