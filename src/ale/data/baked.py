"""Baked images: task data inside a container image, the reference only as reference.7z.

`bake_image` builds FROM the tools image a layer holding, under a data root
(default /opt/ale-data), each variant's input/, software/, manifest.json and
reference.7z, in the layout the variant has in the data root it came from
(``<d>/<t>/<v>`` for ALE's layout, ``tasks/<d>/<t>/<v>`` otherwise). Data files
are root-owned and world-readable; every reference.7z is root-owned mode 0600, so
the candidate user cannot even read the ciphertext, and its password never enters
any image or container (it stays in the grader's secret store). Unsealed variants
are refused: a clear reference is never baked.

At run time `ImageSource` reads the image through *fresh helper containers*
(``ImageStore.reader``: created with no network, never started, labelled as
ale's, removed right after), never through the candidate's container. The image
is pinned by id when the source opens, so a retag during a run cannot swap the
data. This module never talks to an engine itself: it is handed an ImageStore
(ale.sandbox.docker_images.DockerImageStore for Docker).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from ale.data.base import (
    DataError,
    DataMissing,
    ImageNotFound,
    ImageReader,
    ImageStore,
    Layout,
    LayoutChoice,
    ReferenceCommitment,
    ReferenceError,
    TreeHash,
    VariantKey,
)
from ale.data.hashing import CHUNK, make_tree_hash, sha256_file, walk_tree, write_all
from ale.data.local import LocalSource
from ale.data.roots import choose_layout, list_variants, resolve_layout, split_spec, with_layout
from ale.data.sealing import (
    ARCHIVE_NAME,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    MANIFEST_NAME,
    parse_manifest,
)
from ale.data.staging import check_against_manifest, prepare_dest, stage_archive_file

DEFAULT_DATA_ROOT = "/opt/ale-data"
LABEL_DATA_ROOT = "ale.data.root"
# JSON: the variant folder below the data root ("tasks/d/t/v" or "d/t/v") ->
# {"archive": sha256 | None, "size": int, "files": int}
LABEL_DATA_INDEX = "ale.data.variants"
LABEL_BAKED = "ale.data.baked"

Say = Callable[[str], None]


# ----------------------------------------------------------------------------- baking


def bake_image(
    store: ImageStore,
    data_root: Path,
    tasks: list[VariantKey] | None,
    tag: str,
    base_image: str = "ale-tools:latest",
    *,
    image_data_root: str = DEFAULT_DATA_ROOT,
    layout: LayoutChoice = "auto",
    say: Say = print,
) -> str:
    """Build `tag` FROM base_image with the variants' data under image_data_root; returns the image id.

    `data_root` is in either layout (`layout` "auto" finds each variant under
    exactly one; "ale" or "tasks" reads only that one); `tasks` None bakes every
    variant found. Each variant keeps its layout inside the image. Raises
    DataError for: a data root with no variants, a variant folder missing or under
    both layouts, a missing input/, a reference/ not sealed into reference.7z, a
    symlink or special file in the data, a base image the store does not have, a
    failed build.
    """
    data_root = Path(data_root)
    if not image_data_root.startswith("/") or ".." in PurePosixPath(image_data_root).parts:
        raise DataError(f"image data root {image_data_root!r} must be an absolute path")
    source = LocalSource(data_root, layout=layout)
    keys = list(tasks) if tasks else source.variants()
    if not keys:
        looked = " and ".join(
            f"{data_root}/{'tasks/' if lay == 'tasks' else ''}<domain>/<task>/<variant>"
            for lay in (("ale", "tasks") if layout == "auto" else (layout,))
        )
        raise DataMissing(f"no variants under {data_root} (looked for {looked})")
    try:
        store.lookup(base_image)
    except ImageNotFound as exc:
        raise DataError(f"base image {base_image} not found locally ({exc}); build it with `ale image build`") from exc
    index: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ale-bake-") as tmp:
        ctx = Path(tmp)
        data = ctx / "data"
        for key in keys:
            vdir = source.variant_dir(key)
            rel = key.relpath_in(source.layout_of(key))
            archive = vdir / ARCHIVE_NAME
            has_clear = (vdir / "reference").exists()
            if has_clear and not archive.is_file():
                raise DataError(
                    f"{vdir}: reference/ is not sealed; run `ale data seal {vdir}` first "
                    "(a baked image never holds a clear reference)"
                )
            if not (vdir / "input").is_dir():
                raise DataMissing(f"input folder {vdir / 'input'} not found")
            out = data / rel
            out.mkdir(parents=True)
            for part in ("input", "software"):
                if (vdir / part).is_dir():
                    _copy_public(vdir / part, out / part)
            entry: dict[str, Any] = {"archive": None, "files": 0}
            if (vdir / MANIFEST_NAME).is_file():
                shutil.copyfile(vdir / MANIFEST_NAME, out / MANIFEST_NAME)
                os.chmod(out / MANIFEST_NAME, 0o644)
            if archive.is_file():
                if archive.is_symlink():
                    raise DataError(f"{archive} is a symbolic link")
                shutil.copyfile(archive, out / ARCHIVE_NAME)
                os.chmod(out / ARCHIVE_NAME, 0o600)
                digest, size = sha256_file(out / ARCHIVE_NAME)
                manifest = json.loads((vdir / MANIFEST_NAME).read_text()) if (vdir / MANIFEST_NAME).is_file() else {}
                info = manifest.get("reference_archive") or {}
                entry = {"archive": digest, "size": size,
                         "files": info.get("files", 0) if info.get("sha256") == digest else 0}
            index[rel] = entry
        for d in [data, *(p for p in data.rglob("*") if p.is_dir())]:
            os.chmod(d, 0o755)
        (ctx / "Dockerfile").write_text(
            f"FROM {base_image}\n"
            # Data and archives belong to root: the candidate user can read input
            # and software, not a reference.7z (mode 0600).
            f"COPY --chown=0:0 data/ {image_data_root}/\n"
        )
        labels = {
            LABEL_DATA_ROOT: image_data_root,
            LABEL_DATA_INDEX: json.dumps(index, sort_keys=True, separators=(",", ":")),
            LABEL_BAKED: "1",
        }
        say(f"baking {len(keys)} variant(s) into {tag} FROM {base_image}")
        return store.build(ctx, tag=tag, labels=labels)


def _copy_public(src: Path, dst: Path) -> None:
    dst.mkdir()
    for rel, kind in walk_tree(src):  # refuses symlinks and special files
        if kind == "dir":
            (dst / rel).mkdir()
        else:
            shutil.copyfile(src / rel, dst / rel)
            mode = stat.S_IMODE(os.stat(src / rel).st_mode) & 0o777
            os.chmod(dst / rel, mode | 0o644)


# ----------------------------------------------------------------------------- reading an image tar


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (ImageReader.get_tar)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self.buf:
            try:
                self.buf = next(self.chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self.buf))
        b[:n] = self.buf[:n]
        self.buf = self.buf[n:]
        return n


def _safe_rel(name: str, top: str) -> str | None:
    """The member's path below `top` (the archived folder's own name), '' for top itself."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise DataError(f"unsafe path {name!r} in the image archive")
    if not parts or parts[0] != top:
        raise DataError(f"unexpected path {name!r} in the image archive of {top}")
    return "/".join(parts[1:])


def extract_tar_stream(
    chunks: Iterator[bytes], top: str, dest: Path, *, what: str, file_mode: int | None = None
) -> TreeHash:
    """Unpack an image's tar of a folder named `top` into the existing dest, hashing as it writes.

    Only folders and regular files; anything else is a DataError naming it.
    """
    files: dict[str, dict[str, Any]] = {}
    with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), CHUNK), mode="r|") as tar:
        for m in tar:
            rel = _safe_rel(m.name, top)
            if m.isdir():
                if rel:
                    (dest / rel).mkdir(parents=True, exist_ok=True)
                    os.chmod(dest / rel, (m.mode & 0o777) | 0o755)
                continue
            if not m.isreg() or m.islnk():
                raise DataError(f"{what}/{rel or top} in the image is not a regular file or folder")
            if not rel:
                raise DataError(f"{what}: expected a folder, the image holds a file")
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            mode = file_mode if file_mode is not None else (m.mode & 0o777) | 0o644
            src = tar.extractfile(m)
            assert src is not None
            h = hashlib.sha256()
            size = 0
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            try:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    write_all(fd, chunk)
                    size += len(chunk)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            files[rel] = {"sha256": h.hexdigest(), "size": size}
    return make_tree_hash(files)


class ImageSource:
    """Task data baked into an image (see bake_image), read through an ImageStore.

    `layout` (or the spec option ``image:<ref>#layout=...``) is "auto" (default),
    "ale" or "tasks", resolved per variant against the image's variant index
    (label ale.data.variants) or, for an image without one, against its files.
    """

    def __init__(
        self,
        spec: str,
        *,
        store: ImageStore | None,
        layout: str | None = None,
        secret_store: Path | None = None,
        max_reference_bytes: int = DEFAULT_MAX_BYTES,
        max_reference_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        base, options = split_spec(spec)
        if not base.startswith("image:") or not base[len("image:") :]:
            raise DataError(f"{spec!r} is not an image source (image:<ref>)")
        self.layout: LayoutChoice = choose_layout(spec, options.get("layout"), layout)
        self.spec = with_layout(base, self.layout)
        self.ref = base[len("image:") :]
        self.secret_store = secret_store
        self.max_reference_bytes = max_reference_bytes
        self.max_reference_files = max_reference_files
        if store is None:
            raise DataError(
                f"data source {spec}: an image: source needs an image store, e.g. "
                "open_source(spec, image_store=ale.sandbox.docker_images.DockerImageStore(client))"
            )
        self.store = store
        try:
            image = store.lookup(self.ref)
        except ImageNotFound as exc:
            raise DataError(f"baked data image {self.ref} not found ({exc}); bake it with `ale image bake`") from exc
        self.image_id: str = image.id
        labels = image.labels
        self.data_root: str = labels.get(LABEL_DATA_ROOT) or DEFAULT_DATA_ROOT
        try:
            index = json.loads(labels[LABEL_DATA_INDEX]) if LABEL_DATA_INDEX in labels else None
        except ValueError as exc:
            raise DataError(f"image {self.ref}: label {LABEL_DATA_INDEX} is not valid JSON") from exc
        if index is not None and not isinstance(index, dict):
            raise DataError(f"image {self.ref}: label {LABEL_DATA_INDEX} is not a JSON object")
        self.index: dict[str, Any] | None = index
        self._layouts: dict[VariantKey, Layout] = {}

    def __repr__(self) -> str:
        return f"ImageSource({self.ref!r}, id={self.image_id[:19]}, layout={self.layout!r})"

    # ------------------------------------------------------------------ layout

    def _image_path(self, rel: str, *rest: str) -> str:
        return "/".join([self.data_root.rstrip("/"), rel, *rest])

    def layout_of(self, key: VariantKey) -> Layout:
        if key not in self._layouts:
            index = self.index
            if index is not None:
                self._layouts[key] = resolve_layout(
                    key,
                    self.layout,
                    exists=lambda layout: key.relpath_in(layout) in index,
                    location=lambda layout: f"{self.ref}:{self._image_path(key.relpath_in(layout))}",
                    available=lambda layout: self._available(key, layout, index),
                )
            else:
                with self.store.reader(self.image_id) as reader:
                    self._layouts[key] = resolve_layout(
                        key,
                        self.layout,
                        exists=lambda layout: reader.exists(self._image_path(key.relpath_in(layout))),
                        location=lambda layout: f"{self.ref}:{self._image_path(key.relpath_in(layout))}",
                        available=lambda layout: (0, f"unknown (image {self.ref} has no {LABEL_DATA_INDEX} label)"),
                    )
        return self._layouts[key]

    def _available(self, key: VariantKey, layout: Layout, index: dict[str, Any]) -> tuple[int, str]:
        task_prefix = key.relpath_in(layout).rsplit("/", 1)[0] + "/"
        domain_prefix = task_prefix.rstrip("/").rsplit("/", 1)[0] + "/"
        variants = sorted(r[len(task_prefix) :] for r in index if r.startswith(task_prefix))
        if variants:
            return 2, ", ".join(variants)
        level = 1 if any(r.startswith(domain_prefix) for r in index) else 0
        return level, f"none for {key.domain}/{key.task}; baked: {', '.join(sorted(index)) or 'none'}"

    def _path(self, key: VariantKey, *rest: str) -> str:
        return self._image_path(key.relpath_in(self.layout_of(key)), *rest)

    def location(self, key: VariantKey) -> str:
        return f"{self.ref}:{self._path(key)}"

    def variants(self) -> list[VariantKey]:
        """The variants the image's index lists; DataError for an image without one."""
        if self.index is None:
            raise DataError(f"image {self.ref} has no {LABEL_DATA_INDEX} label: its variants cannot be listed")
        tree: dict[str, set[str]] = {}
        for rel in self.index:
            parts = rel.split("/")
            for i in range(len(parts)):
                tree.setdefault("/".join(parts[:i]), set()).add(parts[i])
        return list_variants(self.layout, lambda rel: sorted(tree.get(rel, ())))

    def prefetch_variant(self, key: VariantKey, *, reference: bool = False) -> int:
        """Nothing to fetch: the image is local. Checks the variant is baked."""
        self.layout_of(key)
        return 0

    def _manifest(self, reader: ImageReader, key: VariantKey) -> dict[str, Any] | None:
        where = f"{self.ref}:{self._path(key, MANIFEST_NAME)}"
        chunks = reader.get_tar(self._path(key, MANIFEST_NAME))
        if chunks is None:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            extract_tar_stream_file(chunks, MANIFEST_NAME, Path(tmp) / MANIFEST_NAME, what=self.ref)
            try:
                data = json.loads((Path(tmp) / MANIFEST_NAME).read_text())
            except ValueError as exc:
                raise DataError(f"{where} is not valid JSON") from exc
        return parse_manifest(data, where)

    # ------------------------------------------------------------------ input

    def stage_input(self, key: VariantKey, dest: Path) -> TreeHash:
        dest = Path(dest)
        where = self.location(key)
        with self.store.reader(self.image_id) as reader:
            chunks = reader.get_tar(self._path(key, "input"))
            if chunks is None:
                if not reader.exists(self._path(key)):
                    raise DataMissing(f"variant folder {where} not found in the image")
                raise DataMissing(f"input folder {self.ref}:{self._path(key, 'input')} not found")
            prepare_dest(dest)
            tree = extract_tar_stream(chunks, "input", dest, what=f"{self.ref}:{self._path(key, 'input')}")
            manifest = self._manifest(reader, key)
            if manifest is not None:
                check_against_manifest(tree, manifest, "input", where)
            schunks = reader.get_tar(self._path(key, "software"))
            if schunks is not None:
                sdest = dest.parent / "software"
                prepare_dest(sdest)
                extract_tar_stream(schunks, "software", sdest, what=f"{self.ref}:{self._path(key, 'software')}")
        return tree

    # ------------------------------------------------------------------ reference

    def _fetch_archive(self, key: VariantKey, target: Path) -> str | None:
        """Copy reference.7z out of a fresh helper into target; its sha256, or None."""
        with self.store.reader(self.image_id) as reader:
            chunks = reader.get_tar(self._path(key, ARCHIVE_NAME))
            if chunks is None:
                if not reader.exists(self._path(key)):
                    raise DataMissing(f"variant folder {self.location(key)} not found in the image")
                return None
            return extract_tar_stream_file(chunks, ARCHIVE_NAME, target, what=self.ref, mode=0o600)

    def commit_reference(self, key: VariantKey) -> ReferenceCommitment | None:
        layout = self.layout_of(key)
        if self.index is not None:
            entry = self.index[key.relpath_in(layout)]
            if not isinstance(entry, dict) or not entry.get("archive"):
                return None
            return ReferenceCommitment("archive", entry["archive"], int(entry.get("files", 0)))
        with tempfile.TemporaryDirectory(prefix="ale-ref-") as tmp:
            digest = self._fetch_archive(key, Path(tmp) / ARCHIVE_NAME)
        return None if digest is None else ReferenceCommitment("archive", digest, 0)

    def stage_reference(self, key: VariantKey, dest: Path, commitment: ReferenceCommitment | None) -> None:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".ref-image-", dir=dest.parent))
        try:
            os.chmod(work, 0o700)
            try:
                digest = self._fetch_archive(key, work / ARCHIVE_NAME)
            except DataError as exc:
                raise ReferenceError(f"{key.relpath}: {exc}") from exc
            if commitment is None:
                if digest is not None:
                    raise ReferenceError(f"{key.relpath}: a reference archive is in {self.ref} but the run "
                                         "committed to none")
                prepare_dest(dest)
                return
            if commitment.kind != "archive":
                raise ReferenceError(f"{key.relpath}: a baked image holds only archives, but a "
                                     f"{commitment.kind} was committed")
            if digest is None:
                raise ReferenceError(f"{key.relpath}: {ARCHIVE_NAME} is missing from {self.ref}, but it was committed")
            stage_archive_file(
                key,
                work / ARCHIVE_NAME,
                dest,
                commitment,
                secret_store=self.secret_store,
                origin=f"{self.ref}:{self._path(key, ARCHIVE_NAME)}",
                max_bytes=self.max_reference_bytes,
                max_files=self.max_reference_files,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)


def extract_tar_stream_file(chunks: Iterator[bytes], name: str, target: Path, *, what: str, mode: int = 0o644) -> str:
    """Unpack an image's tar of a single file `name` to target; returns its sha256.

    DataError naming `what` when the tar holds anything but that one regular file."""
    h = hashlib.sha256()
    seen = False
    with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), CHUNK), mode="r|") as tar:
        for m in tar:
            if m.name != name or seen:
                raise DataError(f"{what}: unexpected entry {m.name!r} while reading {name}")
            if not m.isreg():
                raise DataError(f"{what}: {name} in the image is not a regular file")
            seen = True
            src = tar.extractfile(m)
            assert src is not None
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            try:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    write_all(fd, chunk)
            finally:
                os.close(fd)
    if not seen:
        raise DataError(f"{what}: the archive of {name} was empty")
    return h.hexdigest()
