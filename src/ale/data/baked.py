"""Baked images: task data inside a Docker image, the reference only as reference.7z.

`bake_image` builds FROM the tools image a layer holding, under a data root
(default /opt/ale-data), each variant's input/, software/, manifest.json and
reference.7z. Data files are root-owned and world-readable; every reference.7z is
root-owned mode 0600, so the candidate user cannot even read the ciphertext, and
its password never enters any image or container (it stays in the grader's secret
store). Unsealed variants are refused: a clear reference is never baked.

At run time `ImageSource` reads the image through *fresh helper containers*
(created with no network, never started, labelled ale.managed=1 and
ale.role=data-helper, removed right after) with `get_archive`, never through the
candidate's container. The image is pinned by id when the source opens, so a
retag during a run cannot swap the data.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import Any

from ale.data.base import DataError, ReferenceCommitment, ReferenceError, TreeHash, VariantKey
from ale.data.hashing import CHUNK, make_tree_hash, sha256_file, walk_tree, write_all
from ale.data.sealing import (
    ARCHIVE_NAME,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    MANIFEST_NAME,
    parse_manifest,
)

DEFAULT_DATA_ROOT = "/opt/ale-data"
LABEL_DATA_ROOT = "ale.data.root"
LABEL_DATA_INDEX = "ale.data.variants"
LABEL_MANAGED = "ale.managed"
LABEL_ROLE = "ale.role"

Say = Callable[[str], None]


# ----------------------------------------------------------------------------- baking


def _variants_of(data_root: Path) -> list[VariantKey]:
    from ale.data.sources import LocalSource

    return LocalSource(data_root).variants()


def bake_image(
    client: Any,
    data_root: Path,
    tasks: list[VariantKey] | None,
    tag: str,
    base_image: str = "ale-tools:latest",
    *,
    image_data_root: str = DEFAULT_DATA_ROOT,
    say: Say = print,
) -> str:
    """Build `tag` FROM base_image with the variants' data under image_data_root; returns the image id.

    Refuses any variant whose reference/ is not sealed into reference.7z, and any
    symlink or special file in the data.
    """
    data_root = Path(data_root)
    if not (data_root / "tasks").is_dir():
        raise DataError(f"data root {data_root} has no tasks/ folder")
    if not image_data_root.startswith("/") or ".." in PurePosixPath(image_data_root).parts:
        raise DataError(f"image data root {image_data_root!r} must be an absolute path")
    keys = list(tasks) if tasks else _variants_of(data_root)
    if not keys:
        raise DataError(f"no variants under {data_root / 'tasks'}")
    try:
        client.images.get(base_image)
    except Exception as exc:
        raise DataError(f"base image {base_image} not found locally ({type(exc).__name__}); build it with `ale image build`") from exc
    index: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ale-bake-") as tmp:
        ctx = Path(tmp)
        data = ctx / "data"
        for key in keys:
            vdir = data_root / key.relpath
            if not vdir.is_dir():
                raise DataError(f"variant folder {vdir} not found")
            archive = vdir / ARCHIVE_NAME
            has_clear = (vdir / "reference").exists()
            if has_clear and not archive.is_file():
                raise DataError(
                    f"{vdir}: reference/ is not sealed; run `ale data seal {vdir}` first "
                    "(a baked image never holds a clear reference)"
                )
            if not (vdir / "input").is_dir():
                raise DataError(f"input folder {vdir / 'input'} not found")
            out = data / key.relpath
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
                entry = {"archive": digest, "size": size, "files": info.get("files", 0) if info.get("sha256") == digest else 0}
            index[key.relpath] = entry
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
            "ale.data.baked": "1",
        }
        say(f"baking {len(keys)} variant(s) into {tag} FROM {base_image}")
        try:
            image, _logs = client.images.build(
                path=str(ctx), tag=tag, labels=labels, rm=True, forcerm=True, pull=False
            )
        except Exception as exc:
            raise DataError(f"building the baked image {tag} failed: {exc}") from exc
    return str(image.id)


def _copy_public(src: Path, dst: Path) -> None:
    dst.mkdir()
    for rel, kind in walk_tree(src):  # refuses symlinks and special files
        if kind == "dir":
            (dst / rel).mkdir()
        else:
            shutil.copyfile(src / rel, dst / rel)
            mode = stat.S_IMODE(os.stat(src / rel).st_mode) & 0o777
            os.chmod(dst / rel, mode | 0o644)


# ----------------------------------------------------------------------------- reading an image


class _ChunkReader(io.RawIOBase):
    """A file object over the chunk iterator docker's get_archive returns."""

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
    """Unpack docker's tar of a folder named `top` into the existing dest, hashing as it writes.

    Only folders and regular files; anything else is a DataError naming it.
    """
    import hashlib

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
    """Task data baked into a Docker image (see bake_image)."""

    def __init__(
        self,
        spec: str,
        *,
        client: Any | None = None,
        secret_store: Path | None = None,
        max_reference_bytes: int = DEFAULT_MAX_BYTES,
        max_reference_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        if not spec.startswith("image:") or not spec[len("image:") :]:
            raise DataError(f"{spec!r} is not an image source (image:<ref>)")
        self.spec = spec
        self.ref = spec[len("image:") :]
        self.secret_store = secret_store
        self.max_reference_bytes = max_reference_bytes
        self.max_reference_files = max_reference_files
        if client is None:
            import docker

            try:
                client = docker.from_env(timeout=120)
            except Exception as exc:
                raise DataError(f"cannot reach the Docker engine for {spec}: {exc}") from exc
        self.client = client
        try:
            image = client.images.get(self.ref)
        except Exception as exc:
            raise DataError(f"baked data image {self.ref} not found ({type(exc).__name__}); bake it with `ale image bake`") from exc
        self.image_id: str = image.id
        labels = (image.attrs.get("Config") or {}).get("Labels") or {}
        self.data_root: str = labels.get(LABEL_DATA_ROOT) or DEFAULT_DATA_ROOT
        try:
            self.index: dict[str, Any] | None = json.loads(labels[LABEL_DATA_INDEX]) if LABEL_DATA_INDEX in labels else None
        except ValueError as exc:
            raise DataError(f"image {self.ref}: label {LABEL_DATA_INDEX} is not valid JSON") from exc
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ImageSource({self.ref!r}, id={self.image_id[:19]})"

    @contextmanager
    def helper(self) -> Iterator[Any]:
        """A fresh, never-started, network-less container of the pinned image."""
        container = self.client.containers.create(
            self.image_id,
            command=["sleep", "0"],
            network_mode="none",
            network_disabled=True,
            labels={LABEL_MANAGED: "1", LABEL_ROLE: "data-helper"},
            user="0:0",
        )
        try:
            yield container
        finally:
            with suppress(Exception):
                container.remove(force=True, v=True)

    def _path(self, key: VariantKey, *rest: str) -> str:
        return "/".join([self.data_root.rstrip("/"), key.relpath, *rest])

    def _get(self, container: Any, path: str) -> Iterator[bytes] | None:
        import docker.errors

        try:
            chunks, _stat = container.get_archive(path, chunk_size=CHUNK)
        except docker.errors.NotFound:
            return None
        except Exception as exc:
            raise DataError(f"reading {path} from image {self.ref} failed: {exc}") from exc
        return chunks

    def _missing_variant(self, key: VariantKey) -> DataError:
        if self.index is not None:
            prefix = f"tasks/{key.domain}/{key.task}/"
            names = sorted(r[len(prefix) :] for r in self.index if r.startswith(prefix))
            avail = ", ".join(names) or f"none for {key.domain}/{key.task}; baked: {', '.join(sorted(self.index)) or 'none'}"
        else:
            avail = "unknown"
        return DataError(f"variant folder {self.ref}:{self._path(key)} not found (available: {avail})")

    def _manifest(self, container: Any, key: VariantKey) -> dict[str, Any] | None:
        chunks = self._get(container, self._path(key, MANIFEST_NAME))
        if chunks is None:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            extract_tar_stream_file(chunks, MANIFEST_NAME, Path(tmp) / MANIFEST_NAME, what=self.ref)
            try:
                data = json.loads((Path(tmp) / MANIFEST_NAME).read_text())
            except ValueError as exc:
                raise DataError(f"{self.ref}:{self._path(key, MANIFEST_NAME)} is not valid JSON") from exc
        return parse_manifest(data, f"{self.ref}:{self._path(key, MANIFEST_NAME)}")

    # ------------------------------------------------------------------ input

    def stage_input(self, key: VariantKey, dest: Path) -> TreeHash:
        from ale.data.sources import check_against_manifest, prepare_dest

        if self.index is not None and key.relpath not in self.index:
            raise self._missing_variant(key)
        dest = Path(dest)
        with self.helper() as c:
            chunks = self._get(c, self._path(key, "input"))
            if chunks is None:
                if self._get(c, self._path(key)) is None:
                    raise self._missing_variant(key)
                raise DataError(f"input folder {self.ref}:{self._path(key, 'input')} not found")
            prepare_dest(dest)
            tree = extract_tar_stream(chunks, "input", dest, what=f"{self.ref}:{self._path(key, 'input')}")
            manifest = self._manifest(c, key)
            if manifest is not None:
                check_against_manifest(tree, manifest, "input", f"{self.ref}:{self._path(key)}")
            schunks = self._get(c, self._path(key, "software"))
            if schunks is not None:
                sdest = dest.parent / "software"
                prepare_dest(sdest)
                extract_tar_stream(schunks, "software", sdest, what=f"{self.ref}:{self._path(key, 'software')}")
        return tree

    def prefetch_variant(self, key: VariantKey) -> int:
        """Nothing to fetch: the image is local. Checks the variant is baked."""
        if self.index is not None and key.relpath not in self.index:
            raise self._missing_variant(key)
        return 0

    # ------------------------------------------------------------------ reference

    def _fetch_archive(self, key: VariantKey, target: Path) -> str | None:
        """Copy reference.7z out of a fresh helper container into target; its sha256, or None."""
        with self.helper() as c:
            chunks = self._get(c, self._path(key, ARCHIVE_NAME))
            if chunks is None:
                if self._get(c, self._path(key)) is None:
                    raise self._missing_variant(key)
                return None
            return extract_tar_stream_file(chunks, ARCHIVE_NAME, target, what=self.ref, mode=0o600)

    def commit_reference(self, key: VariantKey) -> ReferenceCommitment | None:
        if self.index is not None:
            if key.relpath not in self.index:
                raise self._missing_variant(key)
            entry = self.index[key.relpath]
            if not entry.get("archive"):
                return None
            return ReferenceCommitment("archive", entry["archive"], int(entry.get("files", 0)))
        with tempfile.TemporaryDirectory(prefix="ale-ref-") as tmp:
            digest = self._fetch_archive(key, Path(tmp) / ARCHIVE_NAME)
        return None if digest is None else ReferenceCommitment("archive", digest, 0)

    def stage_reference(self, key: VariantKey, dest: Path, commitment: ReferenceCommitment | None) -> None:
        from ale.data.sources import prepare_dest, stage_archive_file

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
                    raise ReferenceError(f"{key.relpath}: a reference archive is in {self.ref} but the run committed to none")
                prepare_dest(dest)
                return
            if commitment.kind != "archive":
                raise ReferenceError(f"{key.relpath}: a baked image holds only archives, but a {commitment.kind} was committed")
            if digest is None:
                raise ReferenceError(f"{key.relpath}: {ARCHIVE_NAME} is missing from {self.ref}, but it was committed")
            stage_archive_file(
                key,
                work / ARCHIVE_NAME,
                dest,
                commitment,
                secret_store=self.secret_store,
                max_bytes=self.max_reference_bytes,
                max_files=self.max_reference_files,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)


def extract_tar_stream_file(chunks: Iterator[bytes], name: str, target: Path, *, what: str, mode: int = 0o644) -> str:
    """Unpack docker's tar of a single file `name` to target; returns its sha256."""
    import hashlib

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
