"""Sealed references: `reference/` packed into an AES-256 `reference.7z`.

The password is random (>= 128 bits), held only in the grader's secret store (a
JSON file outside any data root, mode 0600) and keyed by the archive's sha256, so
the archive itself can travel anywhere (a bucket, an image layer) and stays useless
without the store. Archives sealed by ALE itself come with one password for the
evaluator, ``ALE_REFERENCE_ARCHIVE_PASSWORD``: it serves an archive the store has
no entry for (see `archive_password`). Decryption happens on the trusted side
only, after the archive's digest matched its commitment, with limits on total size
and file count and no entry that could land outside its folder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import py7zr
import py7zr.exceptions
import py7zr.io

from ale.data.base import DataError, ReferenceError
from ale.data.hashing import hash_tree, runnable_mode, sha256_file, walk_tree
from ale.paths import config_dir

ARCHIVE_NAME = "reference.7z"
MANIFEST_NAME = "manifest.json"
# The password ALE gives its evaluator for its own sealed references.
ENV_ARCHIVE_PASSWORD = "ALE_REFERENCE_ARCHIVE_PASSWORD"
DEFAULT_MAX_BYTES = 8 * 1024**3
DEFAULT_MAX_FILES = 100_000
# Compression presets, fastest first. zstd (level 3) packs and unpacks at several
# hundred MB/s here, where py7zr's LZMA2 even at preset 1 manages a few MB/s on
# incompressible data; stock 7-Zip cannot open zstd 7z files (7-Zip-zstd can), so
# "deflate" and "lzma2" stay available for archives other tools must open.
COMPRESSION: dict[str, list[dict[str, int]]] = {
    "zstd": [{"id": py7zr.FILTER_ZSTD, "level": 3}],
    "deflate": [{"id": py7zr.FILTER_DEFLATE}],
    "lzma2": [{"id": py7zr.FILTER_LZMA2, "preset": 1}],
    "copy": [{"id": py7zr.FILTER_COPY}],
}
DEFAULT_COMPRESSION = "zstd"


def filters_for(compression: str) -> list[dict[str, int]]:
    if compression not in COMPRESSION:
        raise DataError(f"unknown compression {compression!r}: use one of {', '.join(COMPRESSION)}")
    return [*COMPRESSION[compression], {"id": py7zr.FILTER_CRYPTO_AES256_SHA256}]


FILTERS = filters_for(DEFAULT_COMPRESSION)


def default_secret_store() -> Path:
    env = os.environ.get("ALE_GRADER_SECRETS")
    return Path(env) if env else config_dir() / "grader-secrets.json"


# ----------------------------------------------------------------------------- secret store


class SecretStore:
    """The grader's passwords, one per sealed archive, keyed by the archive's sha256."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_secret_store()

    def _load(self) -> dict[str, Any]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {"version": 1, "archives": {}}
        if st.st_mode & 0o077:
            raise ReferenceError(
                f"grader secret store {self.path} has mode {oct(stat.S_IMODE(st.st_mode))}; "
                "it must be readable by its owner only (chmod 600)"
            )
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ReferenceError(f"grader secret store {self.path} is unreadable: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("archives"), dict):
            raise ReferenceError(f"grader secret store {self.path} has no 'archives' object")
        return data

    def find(self, archive_sha256: str) -> str | None:
        """The archive's password, or None when the store (or its file) has none.

        Raises ReferenceError when the store is readable by others or unreadable."""
        entry = self._load()["archives"].get(archive_sha256)
        if not entry or not isinstance(entry.get("password"), str):
            return None
        return entry["password"]

    def get(self, archive_sha256: str) -> str:
        password = self.find(archive_sha256)
        if password is None:
            raise ReferenceError(
                f"no password for reference archive sha256:{archive_sha256} in the grader "
                f"secret store {self.path} (sealed elsewhere? set ALE_GRADER_SECRETS)"
            )
        return password

    def put(self, archive_sha256: str, password: str, *, variant: str) -> None:
        data = self._load()
        data["archives"][archive_sha256] = {
            "password": password,
            "variant": variant,
            "sealed_at": datetime.now(UTC).isoformat(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".grader-secrets.", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def remove(self, archive_sha256: str) -> None:
        data = self._load()
        if data["archives"].pop(archive_sha256, None) is not None:
            fd, tmp = tempfile.mkstemp(prefix=".grader-secrets.", dir=self.path.parent)
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, sort_keys=True)
            os.replace(tmp, self.path)


@dataclass(frozen=True)
class ArchivePassword:
    password: str = field(repr=False)
    origin: str  # where it came from, for messages and evidence: never the password


def archive_password(archive_sha256: str, secret_store: Path | None, *, archive: str) -> ArchivePassword:
    """The password for one archive, in this order of precedence:

    1. the grader's secret store entry for the archive's sha256;
    2. the environment variable ALE_REFERENCE_ARCHIVE_PASSWORD (ALE's own sealed
       references), when set and not empty.

    A store that exists but is readable by others or unreadable is an error, never
    skipped. Raises ReferenceError naming `archive` (where it comes from), its digest,
    the store and the variable when neither has a password. Whether the password is
    right shows only when decrypting (extract_archive).
    """
    store = SecretStore(secret_store)
    found = store.find(archive_sha256)
    if found is not None:
        return ArchivePassword(found, f"the grader secret store {store.path}")
    env = os.environ.get(ENV_ARCHIVE_PASSWORD)
    if env:
        return ArchivePassword(env, f"the environment variable {ENV_ARCHIVE_PASSWORD}")
    raise ReferenceError(
        f"no password for reference archive {archive} (sha256:{archive_sha256}): the grader "
        f"secret store {store.path} has no entry for it (sealed elsewhere? set ALE_GRADER_SECRETS) "
        f"and {ENV_ARCHIVE_PASSWORD} is not set"
    )


# ----------------------------------------------------------------------------- manifest


def read_manifest(variant_dir: Path) -> dict[str, Any] | None:
    path = variant_dir / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"manifest {path} is not valid JSON: {exc}") from exc
    return parse_manifest(data, str(path))


def parse_manifest(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("files", {}), dict):
        raise DataError(f"manifest {where} must be an object with a 'files' object")
    for rel, entry in data.get("files", {}).items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not isinstance(entry.get("size"), int)
        ):
            raise DataError(f"manifest {where}: entry {rel!r} needs 'sha256' (str) and 'size' (int)")
    archive = data.get("reference_archive")
    if archive is not None and not (isinstance(archive, dict) and isinstance(archive.get("sha256"), str)):
        raise DataError(f"manifest {where}: 'reference_archive' needs a 'sha256'")
    data.setdefault("files", {})
    return data


def build_manifest(variant_dir: Path, *, include_reference: bool = True) -> dict[str, Any]:
    """relpath -> {sha256, size} for input/, software/ and (unsealed) reference/."""
    files: dict[str, Any] = {}
    parts = ["input", "software"] + (["reference"] if include_reference else [])
    for part in parts:
        root = variant_dir / part
        if root.is_dir() and not root.is_symlink():
            for rel, entry in hash_tree(root)["files"].items():
                files[f"{part}/{rel}"] = entry
    manifest: dict[str, Any] = {"version": 1, "files": dict(sorted(files.items()))}
    archive = variant_dir / ARCHIVE_NAME
    if archive.is_file():
        old = read_manifest(variant_dir) or {}
        digest, size = sha256_file(archive)
        prev = old.get("reference_archive") or {}
        manifest["reference_archive"] = {
            "sha256": digest,
            "size": size,
            "files": prev.get("files", 0) if prev.get("sha256") == digest else 0,
        }
    return manifest


def write_manifest(variant_dir: Path, manifest: dict[str, Any]) -> Path:
    path = variant_dir / MANIFEST_NAME
    tmp = path.with_name(f".{MANIFEST_NAME}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- seal / unseal


@dataclass(frozen=True)
class SealResult:
    archive: Path
    sha256: str
    size: int
    files: int
    secret_store: Path
    removed_clear: bool


def _data_root_of(variant_dir: Path) -> Path:
    """<root> of <root>/tasks/<domain>/<task>/<variant>, else the variant folder itself."""
    p = variant_dir.resolve()
    if len(p.parents) >= 4 and p.parents[2].name == "tasks":
        return p.parents[3]
    return p


def seal_variant(
    variant_dir: Path,
    secret_store: Path | None = None,
    *,
    remove_clear: bool = False,
    force: bool = False,
    compression: str = DEFAULT_COMPRESSION,
) -> SealResult:
    """Pack variant_dir/reference/ into variant_dir/reference.7z under a fresh password.

    The password goes only to the secret store; the archive's digest goes to the
    variant's manifest.json. The clear reference/ is removed only with remove_clear.
    """
    variant_dir = Path(variant_dir)
    filters = filters_for(compression)
    ref = variant_dir / "reference"
    archive = variant_dir / ARCHIVE_NAME
    store = SecretStore(secret_store)
    if not ref.is_dir() or ref.is_symlink():
        raise DataError(f"nothing to seal: {ref} is not a folder")
    if archive.exists() and not force:
        raise DataError(f"{archive} already exists; pass force to re-seal (a new password is drawn)")
    store_abs = store.path.resolve()
    root = _data_root_of(variant_dir)
    if store_abs.is_relative_to(root):
        raise DataError(
            f"the grader secret store {store.path} lies inside the data root {root}; "
            "keep it outside any data or repository folder"
        )
    listing = walk_tree(ref)  # refuses symlinks and special files before packing
    nfiles = sum(1 for _, kind in listing if kind == "file")
    password = secrets.token_urlsafe(32)  # 256 bits
    tmp = variant_dir / f".{ARCHIVE_NAME}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        with py7zr.SevenZipFile(
            tmp, "w", filters=filters, password=password, header_encryption=True
        ) as z:
            for rel, _kind in listing:
                z.write(ref / rel, arcname=rel)
        digest, size = sha256_file(tmp)
        # The password is stored before the archive appears: an archive without its
        # password in the store would be unrecoverable.
        store.put(digest, password, variant=str(variant_dir.resolve()))
        os.replace(tmp, archive)
    finally:
        tmp.unlink(missing_ok=True)
    manifest = build_manifest(variant_dir, include_reference=False)
    manifest["reference_archive"] = {"sha256": digest, "size": size, "files": nfiles}
    write_manifest(variant_dir, manifest)
    if remove_clear:
        shutil.rmtree(ref)
    return SealResult(archive, digest, size, nfiles, store.path, remove_clear)


def unseal_variant(
    variant_dir: Path,
    secret_store: Path | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> Path:
    """For authors: decrypt reference.7z back into variant_dir/reference/.

    The password comes from the secret store, else ALE_REFERENCE_ARCHIVE_PASSWORD
    (archive_password); a wrong one is a ReferenceError naming the archive."""
    variant_dir = Path(variant_dir)
    archive = variant_dir / ARCHIVE_NAME
    if not archive.is_file():
        raise DataError(f"{archive} not found: the variant is not sealed")
    ref = variant_dir / "reference"
    if ref.exists() and any(ref.iterdir()):
        raise DataError(f"{ref} already exists and is not empty; remove it to unseal")
    digest, _ = sha256_file(archive)
    secret = archive_password(digest, secret_store, archive=str(archive))
    try:
        extract_archive(archive, secret.password, ref, expected_sha256=digest, max_bytes=max_bytes, max_files=max_files)
    except ReferenceError as exc:
        raise ReferenceError(f"{exc} (password from {secret.origin})") from exc
    return ref


# ----------------------------------------------------------------------------- safe extraction


class _LimitedWriter(py7zr.io.Py7zIO):
    def __init__(self, path: Path, budget: _Budget) -> None:
        self.path = path
        self.budget = budget
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        self.length = 0

    def write(self, s: bytes | bytearray) -> int:
        self.budget.spend(len(s), self.path)
        view = memoryview(s)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.length += len(s)
        return len(s)

    def read(self, size: int | None = None) -> bytes:
        return b""

    def seek(self, offset: int, whence: int = 0) -> int:
        return os.lseek(self.fd, offset, whence)

    def flush(self) -> None:
        return None

    def size(self) -> int:
        return self.length

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Budget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0

    def spend(self, n: int, path: Path) -> None:
        self.used += n
        if self.used > self.max_bytes:
            raise ReferenceError(
                f"reference archive expands past the limit of {self.max_bytes} bytes "
                f"(at {path.name}); refusing it as an archive bomb"
            )


class _Factory(py7zr.io.WriterFactory):
    def __init__(self, root: Path, allowed: set[str], budget: _Budget) -> None:
        self.root = root
        self.allowed = allowed
        self.budget = budget
        self.writers: list[_LimitedWriter] = []

    def create(self, filename: str) -> py7zr.io.Py7zIO:
        rel = os.path.relpath(os.path.join(self.root, filename), self.root)
        rel = PurePosixPath(rel).as_posix()
        if rel not in self.allowed:
            raise ReferenceError(f"reference archive wrote an unexpected entry {filename!r}")
        writer = _LimitedWriter(self.root / rel, self.budget)
        self.writers.append(writer)
        return writer


def safe_member_name(name: str) -> str:
    """The entry's relative POSIX path, or ReferenceError when it could escape its folder."""
    if not name or "\x00" in name:
        raise ReferenceError(f"reference archive has an entry with an empty or NUL name: {name!r}")
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise ReferenceError(f"reference archive entry {name!r} is an absolute path")
    parts = [p for p in norm.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ReferenceError(f"reference archive entry {name!r} points outside its folder ('..')")
    if not parts:
        raise ReferenceError(f"reference archive entry {name!r} names no file")
    return "/".join(parts)


def extract_archive(
    archive: Path,
    password: str,
    dest: Path,
    *,
    expected_sha256: str | None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> dict[str, Any]:
    """Decrypt archive into dest (created; must not exist or be empty), all or nothing.

    Checks, in order: the archive's sha256 against expected_sha256; the password and
    the header; every entry (no absolute path, no `..`, no link or special file, no
    duplicate); the declared file count and size; then the real bytes written, so a
    header that lies about sizes still stops at max_bytes. Everything is unpacked
    into a private folder next to dest and renamed into place only when complete.
    Any failure is a ReferenceError with the reason; nothing is left behind.
    """
    archive = Path(archive)
    dest = Path(dest)
    if expected_sha256 is not None:
        digest, _ = sha256_file(archive)
        if digest != expected_sha256:
            raise ReferenceError(
                f"reference archive {archive} has sha256 {digest}, but sha256 {expected_sha256} "
                "was committed before the run"
            )
    if dest.exists() and (dest.is_symlink() or not dest.is_dir() or any(dest.iterdir())):
        raise ReferenceError(f"cannot unpack the reference into {dest}: it exists and is not an empty folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.unpack-", dir=dest.parent))
    try:
        budget = _Budget(max_bytes)
        try:
            with py7zr.SevenZipFile(archive, "r", password=password, max_extract_size=max_bytes) as z:
                members = z.files
                names: set[str] = set()
                dirs: set[str] = set()
                declared = 0
                for f in members:
                    rel = safe_member_name(f.filename)
                    if f.is_symlink or getattr(f, "is_junction", False) or getattr(f, "is_socket", False):
                        raise ReferenceError(f"reference archive entry {f.filename!r} is a link or special file")
                    if rel in names or rel in dirs:
                        raise ReferenceError(f"reference archive has the entry {rel!r} twice")
                    if f.is_directory:
                        dirs.add(rel)
                        continue
                    names.add(rel)
                    declared += int(f.uncompressed or 0)
                if len(names) > max_files:
                    raise ReferenceError(
                        f"reference archive holds {len(names)} files, more than the limit of {max_files}"
                    )
                if declared > max_bytes:
                    raise ReferenceError(
                        f"reference archive declares {declared} bytes unpacked, more than the limit "
                        f"of {max_bytes}; refusing it as an archive bomb"
                    )
                for rel in names:
                    for parent in PurePosixPath(rel).parents:
                        if str(parent) in names:
                            raise ReferenceError(f"reference archive entry {rel!r} lies under the file {parent}")
                for rel in sorted(dirs):
                    (staging / rel).mkdir(parents=True, exist_ok=True)
                factory = _Factory(staging, names, budget)
                try:
                    z.extractall(path=staging, factory=factory)
                finally:
                    for w in factory.writers:
                        w.close()
        except ReferenceError:
            raise
        except py7zr.exceptions.DecompressionBombError as exc:
            raise ReferenceError(
                f"reference archive {archive} expands past the limit of {max_bytes} bytes: {exc}"
            ) from exc
        except py7zr.exceptions.PasswordRequired as exc:
            raise ReferenceError(f"reference archive {archive} needs a password and none was given") from exc
        except Exception as exc:  # py7zr raises many types for a bad key or bad bytes
            raise ReferenceError(
                f"cannot decrypt reference archive {archive}: wrong password or corrupt archive "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        for rel in names:  # empty files produce no writer
            target = staging / rel
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        result = hash_tree(staging)
        for rel, _kind in walk_tree(staging):
            os.chmod(staging / rel, 0o755 if (staging / rel).is_dir() else runnable_mode(staging / rel))
        os.chmod(staging, 0o755)
        if dest.exists():
            dest.rmdir()
        os.rename(staging, dest)
        return result
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
