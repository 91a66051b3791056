"""Remote task data over fsspec: ``s3://``, ``gs://``, ``hf://datasets/...`` (and ``memory://``).

One code path for layout and fetching. Every file goes through a verified,
content-addressed cache (``ale.paths.cache_dir()/blobs``): a download is hashed
while it streams, checked against the variant's ``manifest.json`` when one exists
(a mismatch is an infrastructure_error naming the file), and stored under its
sha256; staging copies the blob out while hashing it again, so a cache entry that
rotted on disk is caught, dropped and fetched anew.

Credentials come from the standard places of each client (AWS profiles and env,
Google ADC, the HF token) and stay in this process: staging writes only file
contents. The reference role has its own file system object, configured by
``reference_storage_options`` or the environment (``ALE_REFERENCE_S3_PROFILE``,
``ALE_REFERENCE_STORAGE_OPTIONS``), and is used only by commit_reference (when no
manifest records the digest) and stage_reference.

Both layouts of a data root are read (ale.data.roots): ``<root>/<d>/<t>/<v>``
(ALE's buckets and Hugging Face dataset) and ``<root>/tasks/<d>/<t>/<v>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.data.base import (
    DataError,
    DataMissing,
    Layout,
    LayoutChoice,
    ReferenceCommitment,
    ReferenceError,
    TreeHash,
    VariantKey,
)
from ale.data.hashing import CHUNK, copy_hashing, make_tree_hash, runnable_mode
from ale.data.roots import choose_layout, list_variants, resolve_layout, split_spec, with_layout
from ale.data.sealing import (
    ARCHIVE_NAME,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    MANIFEST_NAME,
    parse_manifest,
)
from ale.data.staging import (
    check_against_manifest,
    check_commitment,
    finish_reference_dir,
    prepare_dest,
    stage_archive_file,
)
from ale.paths import cache_dir

ENV_ANON = "ALE_DATA_ANON"
ENV_STORAGE_OPTIONS = "ALE_DATA_STORAGE_OPTIONS"
ENV_REF_STORAGE_OPTIONS = "ALE_REFERENCE_STORAGE_OPTIONS"
ENV_REF_S3_PROFILE = "ALE_REFERENCE_S3_PROFILE"
ENV_S3_ENDPOINT = "ALE_S3_ENDPOINT_URL"
ENV_GCS_ENDPOINT = "ALE_GCS_ENDPOINT_URL"
GCS_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # read by gcsfs itself


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _env_json(name: str) -> dict[str, Any]:
    raw = os.environ.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise DataError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DataError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class ParsedSpec:
    protocol: str  # s3 | gcs | hf | memory
    root: str  # the path fsspec sees, without protocol and trailing slash


def parse_spec(spec: str) -> ParsedSpec:
    scheme, sep, rest = spec.partition("://")
    if not sep:
        raise DataError(f"{spec!r} is not a remote data source (scheme://path)")
    rest = rest.strip("/")
    protocol = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "hf": "hf", "memory": "memory"}.get(scheme)
    if protocol is None:
        raise DataError(f"unknown data source scheme {scheme!r} in {spec!r}")
    if protocol in ("s3", "gcs") and not rest:
        raise DataError(f"{spec!r} names no bucket: use {scheme}://bucket/prefix")
    if protocol == "hf":
        parts = rest.split("/")
        if len(parts) < 3 or parts[0] != "datasets" or not parts[1] or not parts[2]:
            raise DataError(f"{spec!r}: a Hugging Face source is hf://datasets/<org>/<name>[@revision][/prefix]")
    if protocol == "memory":
        rest = "/" + rest
    return ParsedSpec(protocol, rest)


def storage_options_for(protocol: str, *, anon: bool | None, role: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The fsspec options for one role ("input" or "reference") of one protocol."""
    opts: dict[str, Any] = {}
    if anon is None:
        anon = _truthy(os.environ.get(ENV_ANON))
    if protocol == "s3":
        endpoint = os.environ.get(ENV_S3_ENDPOINT)
        if endpoint:
            opts["client_kwargs"] = {"endpoint_url": endpoint}
        if anon:
            opts["anon"] = True
        if role == "reference" and os.environ.get(ENV_REF_S3_PROFILE):
            opts["profile"] = os.environ[ENV_REF_S3_PROFILE]
            opts.pop("anon", None)
    elif protocol == "gcs":
        endpoint = os.environ.get(ENV_GCS_ENDPOINT)
        if endpoint:
            opts["endpoint_url"] = endpoint.rstrip("/")
        if anon:
            opts["token"] = "anon"
    elif protocol == "hf":
        # Read at call time: huggingface_hub reads HF_ENDPOINT only once, at import.
        if os.environ.get("HF_ENDPOINT"):
            opts["endpoint"] = os.environ["HF_ENDPOINT"].rstrip("/")
        if anon:
            opts["token"] = False
    opts.update(_env_json(ENV_REF_STORAGE_OPTIONS if role == "reference" else ENV_STORAGE_OPTIONS))
    if extra:
        opts.update(extra)
    return opts


def _gcs_endpoint_overridden(options: dict[str, Any]) -> bool:
    if options.get("endpoint_url"):
        return True
    return os.environ.get(GCS_EMULATOR_ENV, "") not in ("", "default")


def make_filesystem(protocol: str, options: dict[str, Any]) -> Any:
    import fsspec

    # A fresh instance per role: the reference role's credentials never serve input.
    try:
        if protocol == "gcs" and _gcs_endpoint_overridden(options):
            # The class gcsfs registers by default (ExtendedGcsFileSystem) asks the
            # Storage Control API over gRPC for each bucket's layout, at the endpoint's
            # host:port; an emulator serves only the JSON API, so every call would
            # wait out a 60 s retry. The JSON-API class talks to the endpoint alone.
            from gcsfs.core import GCSFileSystem

            return GCSFileSystem(skip_instance_cache=True, **options)
        return fsspec.filesystem(protocol, skip_instance_cache=protocol != "memory", **options)
    except ImportError as exc:
        pkg = {"s3": "s3fs", "gcs": "gcsfs", "hf": "huggingface_hub"}.get(protocol, protocol)
        raise DataError(f"the {protocol}:// data source needs the {pkg} package: pip install {pkg}") from exc


ENV_CONNECT_TIMEOUT = "ALE_DATA_CONNECT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
_DEFAULT_HOSTS = {"gcs": "storage.googleapis.com", "s3": "s3.amazonaws.com", "hf": "huggingface.co"}


class DataUnreachable(DataError):
    """The data store did not answer (no network, no such host, refused): not
    missing data. Retryable: another attempt may reach it."""

    retryable = True


def store_endpoint(protocol: str, options: dict[str, Any]) -> tuple[str, int] | None:
    """(host, port) of the service a protocol's client talks to, or None (memory://)."""
    url: str | None = None
    if protocol == "gcs":
        url = options.get("endpoint_url") or (
            os.environ.get(GCS_EMULATOR_ENV) if _gcs_endpoint_overridden(options) else None)
    elif protocol == "s3":
        url = (options.get("client_kwargs") or {}).get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3") \
            or os.environ.get("AWS_ENDPOINT_URL")
    elif protocol == "hf":
        url = options.get("endpoint") or os.environ.get("HF_ENDPOINT")
    else:
        return None
    if not url:
        return _DEFAULT_HOSTS[protocol], 443
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _resolve(host: str, port: int, timeout: float) -> tuple[str, int]:
    """``host``'s first address, within ``timeout`` (a resolver that does not answer
    would otherwise hold the probe for as long as it likes)."""
    import socket

    found: list[Any] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][:2])
        except OSError as e:
            found.append(e)

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(timeout)
    if not found:
        raise TimeoutError(f"resolving {host} timed out")
    if isinstance(found[0], OSError):
        raise found[0]
    return found[0][0], found[0][1]


def probe_store(protocol: str, options: dict[str, Any], timeout: float | None = None) -> None:
    """A short TCP connect to the store's service: DataUnreachable, in one line and
    within ``timeout`` (ALE_DATA_CONNECT_TIMEOUT_S, default 5 s), when it does not
    answer, instead of the storage client's minutes of retries ending in "not found"."""
    import socket

    endpoint = store_endpoint(protocol, options)
    if endpoint is None:
        return
    if timeout is None:
        try:
            timeout = float(os.environ.get(ENV_CONNECT_TIMEOUT) or DEFAULT_CONNECT_TIMEOUT_S)
        except ValueError:
            timeout = DEFAULT_CONNECT_TIMEOUT_S
    host, port = endpoint
    try:
        addr = _resolve(host, port, timeout)
        socket.create_connection(addr, timeout=timeout).close()
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc) or type(exc).__name__)
        raise DataUnreachable(
            f"the data store is unreachable (cannot connect to {host}:{port}: {why}); "
            "this is not missing data: check the network (or the endpoint) and run again"
        ) from None


def _identity(info: dict[str, Any]) -> str:
    """What identifies one version of a remote file, for the cache index."""
    for k in ("ETag", "etag", "md5Hash", "generation", "blob_id", "VersionId", "version_id"):
        if info.get(k):
            return f"{k}={info[k]}"
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and lfs.get("sha256"):
        return f"lfs={lfs['sha256']}"
    for k in ("LastModified", "mtime", "updated", "last_modified", "created"):
        if info.get(k):
            return f"{k}={info[k]}"
    return ""


class BlobCache:
    """Content-addressed blobs (sha256) plus an index from remote identity to sha256."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir()
        self.blobs = self.root / "blobs"
        self.index = self.root / "index"
        self.tmp = self.root / "tmp"
        for d in (self.root, self.blobs, self.index, self.tmp):
            # The cache may hold clear references: other accounts on the host
            # (uid 1000 may be one) have no business reading it.
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)

    def blob_path(self, sha256: str) -> Path:
        return self.blobs / sha256[:2] / sha256

    def _index_path(self, url: str, size: int, identity: str) -> Path:
        h = hashlib.sha256(f"{url}\0{size}\0{identity}".encode()).hexdigest()
        return self.index / h[:2] / h

    def lookup(self, url: str, size: int, identity: str) -> str | None:
        if not identity:
            return None  # without a version marker a remote change would go unseen
        p = self._index_path(url, size, identity)
        try:
            sha = p.read_text().strip()
        except OSError:
            return None
        return sha if self.blob_path(sha).is_file() else None

    def remember(self, url: str, size: int, identity: str, sha256: str) -> None:
        if not identity:
            return
        p = self._index_path(url, size, identity)
        p.parent.mkdir(exist_ok=True, mode=0o700)
        tmp = p.with_name(p.name + f".{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(sha256)
        os.replace(tmp, p)

    def forget(self, sha256: str) -> None:
        self.blob_path(sha256).unlink(missing_ok=True)

    def store_stream(
        self, read: Callable[[int], bytes], *, expect_sha256: str | None, expect_size: int | None, what: str
    ) -> str:
        h = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=self.tmp)
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            digest = h.hexdigest()
            if expect_sha256 is not None and digest != expect_sha256:
                raise DataError(
                    f"{what}: downloaded sha256 {digest} ({size} bytes) does not match manifest.json "
                    f"sha256 {expect_sha256}"
                )
            if expect_size is not None and size != expect_size:
                raise DataError(f"{what}: downloaded {size} bytes, but the listing says {expect_size}")
            final = self.blob_path(digest)
            final.parent.mkdir(exist_ok=True, mode=0o700)
            os.chmod(tmp, 0o600)
            os.replace(tmp, final)
            return digest
        finally:
            Path(tmp).unlink(missing_ok=True)


@dataclass
class RemoteFile:
    rel: str  # relative to the variant folder, e.g. "input/a.txt"
    path: str  # the fsspec path
    size: int
    identity: str
    expect: str | None  # sha256 from manifest.json


class _Progress:
    """A rich progress bar on a terminal, silence elsewhere."""

    def __init__(self, total: int, label: str, enabled: bool | None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar: Any = None
        self.lock = threading.Lock()
        if self.enabled and total > 0:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True
            )
            self.task = self.bar.add_task(label, total=total)
            self.bar.start()

    def advance(self, n: int) -> None:
        if self.bar is not None:
            with self.lock:
                self.bar.advance(self.task, n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class RemoteSource:
    """Task data under an fsspec URL, fetched through the verified cache.

    `layout` (or the spec option ``#layout=...``) is "auto" (default: each variant
    is found under either layout, never both), "ale" or "tasks"; a variant's layout
    is resolved on first use and pinned for the life of the source.
    """

    def __init__(
        self,
        spec: str,
        *,
        layout: str | None = None,
        anon: bool | None = None,
        storage_options: dict[str, Any] | None = None,
        reference_storage_options: dict[str, Any] | None = None,
        secret_store: Path | None = None,
        cache: BlobCache | None = None,
        workers: int = 8,
        progress: bool | None = None,
        max_reference_bytes: int = DEFAULT_MAX_BYTES,
        max_reference_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        base, options = split_spec(spec)
        self.layout: LayoutChoice = choose_layout(spec, options.get("layout"), layout)
        self.spec = with_layout(base, self.layout)
        self.parsed = parse_spec(base)
        self.anon = anon
        self._input_opts = storage_options_for(self.parsed.protocol, anon=anon, role="input", extra=storage_options)
        self._ref_opts = storage_options_for(
            self.parsed.protocol, anon=anon, role="reference", extra=reference_storage_options
        )
        self._fs: Any = None
        self._ref_fs: Any = None
        self._cache = cache
        self.secret_store = secret_store
        self.workers = workers
        self.progress = progress
        self.max_reference_bytes = max_reference_bytes
        self.max_reference_files = max_reference_files
        self._manifests: dict[VariantKey, dict[str, Any] | None] = {}
        self._layouts: dict[VariantKey, Layout] = {}

    def __repr__(self) -> str:
        return f"RemoteSource({self.spec!r})"

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = self._open_fs(self._input_opts)
        return self._fs

    @property
    def ref_fs(self) -> Any:
        if self._ref_fs is None:
            self._ref_fs = self._open_fs(self._ref_opts)
        return self._ref_fs

    def _open_fs(self, options: dict[str, Any]) -> Any:
        try:
            probe_store(self.parsed.protocol, options)  # an unreachable store: one line, in seconds
        except DataUnreachable as e:
            raise DataUnreachable(f"{self.spec}: {e}") from None
        return make_filesystem(self.parsed.protocol, options)

    @property
    def cache(self) -> BlobCache:
        if self._cache is None:
            self._cache = BlobCache()
        return self._cache

    def url(self, path: str) -> str:
        return f"{self.parsed.protocol}://{path}"

    def vroot(self, key: VariantKey) -> str:
        """The variant folder's fsspec path; DataError when it is in no layout tried."""
        return self._path_in(key, self.layout_of(key))

    def _path_in(self, key: VariantKey, layout: Layout) -> str:
        return f"{self.parsed.root}/{key.relpath_in(layout)}"

    def location(self, key: VariantKey) -> str:
        return self.url(self.vroot(key))

    # ------------------------------------------------------------------ layout

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except DataError:
            raise
        except FileNotFoundError:
            raise
        except Exception as exc:  # network, auth, throttling: retryable infrastructure errors
            raise DataError(f"{self.spec}: {what} failed: {type(exc).__name__}: {exc}") from exc

    def _isdir(self, fs: Any, path: str) -> bool:
        return bool(self._call(f"checking {self.url(path)}", lambda: fs.isdir(path)))

    def _isfile(self, fs: Any, path: str) -> bool:
        return bool(self._call(f"checking {self.url(path)}", lambda: fs.isfile(path)))

    def layout_of(self, key: VariantKey) -> Layout:
        if key not in self._layouts:
            self._layouts[key] = resolve_layout(
                key,
                self.layout,
                exists=lambda layout: self._isdir(self.fs, self._path_in(key, layout)),
                location=lambda layout: self.url(self._path_in(key, layout)),
                available=lambda layout: self._available(self._path_in(key, layout)),
            )
        return self._layouts[key]

    def variant_exists(self, key: VariantKey) -> None:
        """DataError naming the paths tried unless the variant folder exists."""
        self.layout_of(key)

    def _names(self, path: str) -> list[str]:
        """The folder names in path; FileNotFoundError when it is not there."""
        entries = self._call(f"listing {self.url(path)}", lambda: self.fs.ls(path, detail=True))
        if not entries and not self._isdir(self.fs, path):
            raise FileNotFoundError(path)  # some file systems list a missing prefix as empty
        own = path.strip("/")
        names = set()
        for e in entries:
            name = str(e.get("name", "")).strip("/")
            if e.get("type") == "directory" and name and name != own:
                names.add(name.rsplit("/", 1)[-1])
        return sorted(names)

    def _available(self, variant_path: str) -> tuple[int, str]:
        task_path = variant_path.rsplit("/", 1)[0]
        domain_path = task_path.rsplit("/", 1)[0]
        try:
            return 2, ", ".join(self._names(task_path)) or "none"
        except (FileNotFoundError, DataError):
            pass
        try:
            tasks = self._names(domain_path)
        except (FileNotFoundError, DataError):
            return 0, f"no folder {self.url(domain_path)}"
        return 1, f"no task folder {self.url(task_path)}; tasks there: {', '.join(tasks) or 'none'}"

    def variants(self) -> list[VariantKey]:
        def subdirs(rel: str) -> list[str]:
            path = f"{self.parsed.root}/{rel}" if rel else self.parsed.root
            try:
                return self._names(path)
            except FileNotFoundError:
                return []

        return list_variants(self.layout, subdirs)

    def manifest(self, key: VariantKey) -> dict[str, Any] | None:
        if key not in self._manifests:
            path = f"{self.vroot(key)}/{MANIFEST_NAME}"
            if self._isfile(self.fs, path):
                raw = self._call(f"reading {self.url(path)}", lambda: self.fs.cat_file(path))
                try:
                    data = json.loads(raw)
                except ValueError as exc:
                    raise DataError(f"{self.url(path)} is not valid JSON: {exc}") from exc
                self._manifests[key] = parse_manifest(data, self.url(path))
            else:
                self._manifests[key] = None
        return self._manifests[key]

    def list_part(self, key: VariantKey, part: str, *, fs: Any | None = None) -> list[RemoteFile]:
        fs = fs or self.fs
        base = f"{self.vroot(key)}/{part}"
        try:
            found = self._call(f"listing {self.url(base)}", lambda: fs.find(base, detail=True))
        except FileNotFoundError:
            return []
        manifest = self.manifest(key) or {"files": {}}
        out = []
        for path, info in sorted(found.items()):
            if info.get("type", "file") != "file":
                continue
            sub = _relative(path, base)
            if sub is None:
                raise DataError(f"{self.spec}: listing {base} returned the unexpected path {path}")
            rel = f"{part}/{sub}"
            entry = manifest["files"].get(rel)
            out.append(
                RemoteFile(rel, path, int(info.get("size") or 0), _identity(info), entry["sha256"] if entry else None)
            )
        return out

    # ------------------------------------------------------------------ fetching

    def _fetch(self, fs: Any, f: RemoteFile, *, refresh: bool = False) -> str:
        """The sha256 of f's blob in the cache, downloading it when needed."""
        url = self.url(f.path)
        if not refresh:
            if f.expect is not None and self.cache.blob_path(f.expect).is_file():
                return f.expect
            known = self.cache.lookup(url, f.size, f.identity)
            if known is not None and (f.expect is None or known == f.expect):
                return known

        def download() -> str:
            with fs.open(f.path, "rb") as stream:
                return self.cache.store_stream(stream.read, expect_sha256=f.expect, expect_size=f.size, what=url)

        sha = self._call(f"downloading {url}", download)
        self.cache.remember(url, f.size, f.identity, sha)
        return sha

    def _place(self, fs: Any, f: RemoteFile, target: Path, *, mode: int | None = None) -> tuple[str, int]:
        """Copy f from the cache to target, verifying the blob; a rotten blob is fetched again."""
        sha = self._fetch(fs, f)
        digest, size = copy_hashing(self.cache.blob_path(sha), target, mode=mode)
        if digest == sha:
            return digest, size
        # The cache entry no longer holds what its name says: drop it and fetch anew.
        target.unlink()
        self.cache.forget(sha)
        sha = self._fetch(fs, f, refresh=True)
        digest, size = copy_hashing(self.cache.blob_path(sha), target, mode=mode)
        if digest != sha:
            raise DataError(f"{self.url(f.path)}: cache entry {self.cache.blob_path(sha)} is corrupt even after "
                            "a fresh download")
        return digest, size

    def _materialize(
        self, fs: Any, files: list[RemoteFile], strip: str, dest: Path, label: str, *, mode: int | None = None
    ) -> TreeHash:
        progress = _Progress(sum(f.size for f in files), label, self.progress)
        try:
            for f in files:
                (dest / f.rel[len(strip) :]).parent.mkdir(parents=True, exist_ok=True, mode=0o755)

            def one(f: RemoteFile) -> tuple[str, str, int]:
                target = dest / f.rel[len(strip) :]
                digest, size = self._place(fs, f, target, mode=mode)
                os.chmod(target, runnable_mode(target))  # an object store keeps no modes: scripts and binaries run
                progress.advance(size)
                return f.rel[len(strip) :], digest, size

            results: Iterable[tuple[str, str, int]]
            if self.workers > 1 and len(files) > 1:
                with ThreadPoolExecutor(max_workers=self.workers) as pool:
                    results = list(pool.map(one, files))
            else:
                results = [one(f) for f in files]
        finally:
            progress.close()
        return make_tree_hash({rel: {"sha256": d, "size": s} for rel, d, s in results})

    def prefetch_variant(self, key: VariantKey, *, reference: bool = False) -> int:
        """Fill the cache with the variant's input and software (and reference); returns bytes."""
        self.variant_exists(key)
        files = self.list_part(key, "input") + self.list_part(key, "software")
        ref_files: list[RemoteFile] = []
        if reference:
            ref_files = self._reference_files(key)
        total = 0
        progress = _Progress(sum(f.size for f in files + ref_files), key.relpath, self.progress)
        try:
            def fetch(pair: tuple[Any, RemoteFile]) -> int:
                fs, f = pair
                self._fetch(fs, f)
                progress.advance(f.size)
                return f.size

            pairs = [(self.fs, f) for f in files] + [(self.ref_fs, f) for f in ref_files]
            with ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool:
                total = sum(pool.map(fetch, pairs))
        finally:
            progress.close()
        return total

    # ------------------------------------------------------------------ input

    def stage_input(self, key: VariantKey, dest: Path) -> TreeHash:
        self.variant_exists(key)
        inputs = self.list_part(key, "input")
        if not inputs and not self._isdir(self.fs, f"{self.vroot(key)}/input"):
            raise DataMissing(f"input folder {self.url(self.vroot(key))}/input not found")
        dest = Path(dest)
        prepare_dest(dest)
        manifest = self.manifest(key)
        if manifest is not None:
            _check_listing(inputs, manifest, "input", self.url(self.vroot(key)))
        tree = self._materialize(self.fs, inputs, "input/", dest, f"{key.relpath} input")
        if manifest is not None:
            check_against_manifest(tree, manifest, "input", self.url(self.vroot(key)))
        software = self.list_part(key, "software")
        if software:
            sdest = dest.parent / "software"
            prepare_dest(sdest)
            self._materialize(self.fs, software, "software/", sdest, f"{key.relpath} software")
        return tree

    def fetch_input_files(self, key: VariantKey, rels: list[str], dest: Path) -> list[str]:
        """Copy these files of the variant's input (``runtime_env/uv.lock``, ...), where
        present, below dest (same relative paths), each checked against manifest.json
        when it lists it; the rest of the input is not fetched. Returns the ones copied."""
        self.variant_exists(key)
        wanted = {f"input/{r}" for r in rels}
        found = []
        for f in self.list_part(key, "input"):
            if f.rel in wanted:
                target = Path(dest) / f.rel.removeprefix("input/")
                target.parent.mkdir(parents=True, exist_ok=True)
                self._place(self.fs, f, target)
                found.append(f.rel.removeprefix("input/"))
        return found

    # ------------------------------------------------------------------ reference

    def _archive_file(self, key: VariantKey) -> RemoteFile | None:
        path = f"{self.vroot(key)}/{ARCHIVE_NAME}"
        if not self._isfile(self.ref_fs, path):
            return None
        info = self._call(f"reading {self.url(path)}", lambda: self.ref_fs.info(path))
        archive = (self.manifest(key) or {}).get("reference_archive") or {}
        return RemoteFile(ARCHIVE_NAME, path, int(info.get("size") or 0), _identity(info), archive.get("sha256"))

    def _reference_files(self, key: VariantKey) -> list[RemoteFile]:
        archive = self._archive_file(key)
        if archive is not None:
            return [archive]
        return self.list_part(key, "reference", fs=self.ref_fs)

    def commit_reference(self, key: VariantKey) -> ReferenceCommitment | None:
        self.variant_exists(key)
        manifest = self.manifest(key) or {"files": {}}
        archive = self._archive_file(key)
        if archive is not None:
            info = manifest.get("reference_archive") or {}
            if archive.expect is not None:
                # The digest the manifest records is committed now and checked at grading:
                # the archive itself is fetched only then.
                return ReferenceCommitment("archive", archive.expect, int(info.get("files", 0)))
            sha = self._fetch(self.ref_fs, archive)
            return ReferenceCommitment("archive", sha, 0)
        files = self.list_part(key, "reference", fs=self.ref_fs)
        if not files:
            return None
        entries: dict[str, dict[str, Any]] = {}
        for f in files:
            sha = f.expect if f.expect is not None else self._fetch(self.ref_fs, f)
            entries[f.rel[len("reference/") :]] = {"sha256": sha, "size": f.size}
        tree = make_tree_hash(entries)
        return ReferenceCommitment("tree", tree["digest"], tree["count"])

    def stage_reference(self, key: VariantKey, dest: Path, commitment: ReferenceCommitment | None) -> None:
        dest = Path(dest)
        try:
            self.variant_exists(key)
        except DataError as exc:
            raise ReferenceError(str(exc)) from exc
        if commitment is None:
            if self._reference_files(key):
                raise ReferenceError(f"{key.relpath}: a reference appeared after the run committed to none")
            prepare_dest(dest)
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        if commitment.kind == "archive":
            archive = self._archive_file(key)
            if archive is None:
                raise ReferenceError(f"{key.relpath}: {self.url(self.vroot(key))}/{ARCHIVE_NAME} not found, but an "
                                     "archive was committed")
            archive.expect = commitment.sha256
            try:
                sha = self._fetch(self.ref_fs, archive)
            except DataError as exc:
                raise ReferenceError(f"{key.relpath}: {exc}") from exc
            stage_archive_file(
                key,
                self.cache.blob_path(sha),
                dest,
                commitment,
                secret_store=self.secret_store,
                origin=self.url(archive.path),
                max_bytes=self.max_reference_bytes,
                max_files=self.max_reference_files,
            )
            return
        files = self.list_part(key, "reference", fs=self.ref_fs)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.stage-", dir=dest.parent))
        try:
            os.chmod(staging, 0o700)  # nothing sees the tree before its digest is checked
            try:
                tree = self._materialize(self.ref_fs, files, "reference/", staging,
                                         f"{key.relpath} reference", mode=0o644)
            except DataError as exc:
                raise ReferenceError(f"{key.relpath}: {exc}") from exc
            check_commitment(key,
                             ReferenceCommitment("tree", tree["digest"], tree["count"]) if files else None, commitment)
            finish_reference_dir(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _relative(path: str, base: str) -> str | None:
    path = path.strip("/")
    base = base.strip("/")
    if path.startswith(base + "/"):
        return path[len(base) + 1 :]
    # Some file systems drop a revision marker ("@main") from the paths they return.
    if "@" in base:
        head, _, tail = base.partition("@")
        tail = tail.partition("/")[2]
        plain = f"{head}/{tail}" if tail else head
        if path.startswith(plain + "/"):
            return path[len(plain) + 1 :]
    return None


def _check_listing(files: list[RemoteFile], manifest: dict[str, Any], part: str, where: str) -> None:
    for f in files:
        if f.expect is None and any(r.startswith(part + "/") for r in manifest["files"]):
            raise DataError(f"{where}: {f.rel} is not in manifest.json")
        entry = manifest["files"].get(f.rel)
        if entry is not None and int(entry["size"]) != f.size:
            raise DataError(
                f"{where}: {f.rel} is {f.size} bytes remotely but manifest.json says {entry['size']}"
            )

