"""gs:// end to end: gcsfs against gcp-storage-emulator, a pure-Python GCS JSON-API
emulator, serving on 127.0.0.1 for the module and stopped at its end.

Every source here authenticates explicitly (``token="anon"`` or a fixed bearer
token): left to itself, gcsfs would look for Google default credentials, and that
search asks the GCE metadata server, an address off this machine.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from ale.data.base import DataError, ReferenceError, VariantKey
from ale.data.hashing import hash_tree
from ale.data.remote import BlobCache, RemoteSource, make_filesystem, storage_options_for
from ale.data.sealing import seal_variant
from ale.data.sources import open_source, prefetch
from ale.status import RunStatus
from tests.conftest import require_module
from tests.test_data_support import (
    KEY,
    check_ale_layout,
    check_corrupt_cache_and_bad_remote_is_reported,
    check_corrupt_cache_entry_is_refetched,
    check_manifest_mismatch_names_the_file,
    check_sealed_reference_and_cache_reuse,
    make_variant,
    tree_of,
    upload_tree,
)

GCS_ENV = ("ALE_GCS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", "ALE_DATA_ANON", "ALE_DATA_STORAGE_OPTIONS", "ALE_REFERENCE_STORAGE_OPTIONS")


class Emulator:
    """The running emulator, with a log of (method, path, Authorization header)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()

    def mark(self) -> int:
        with self.lock:
            return len(self.requests)

    def since(self, mark: int) -> list[tuple[str, str, str | None]]:
        with self.lock:
            return list(self.requests[mark:])


def _listening_on_loopback_only(port: int) -> bool:
    """Reads /proc/net/tcp{,6}: the port listens, and only on 127.0.0.1."""
    addrs = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            ip, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                addrs.append(ip)
    return addrs == ["0100007F"]


@pytest.fixture(scope="module")
def emulator():
    require_module("gcsfs")
    require_module("gcp_storage_emulator")
    import gcp_storage_emulator.server as ges

    em_box: list[Emulator] = []

    class RecordingHandler(ges.RequestHandler):
        def parse_request(self) -> bool:
            ok = super().parse_request()
            if ok and em_box:
                with em_box[0].lock:
                    em_box[0].requests.append((self.command, self.path, self.headers.get("Authorization")))
            return ok

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    original = ges.RequestHandler
    ges.RequestHandler = RecordingHandler  # the API thread builds its server with this name
    server = ges.create_server("127.0.0.1", port, in_memory=True)
    try:
        server.start()
    finally:
        ges.RequestHandler = original
    try:
        assert _listening_on_loopback_only(port), f"the emulator on port {port} is not bound to 127.0.0.1 alone"
        em_box.append(Emulator(f"http://127.0.0.1:{port}"))
        yield em_box[0]
    finally:
        server.stop()


@pytest.fixture
def gcs(emulator: Emulator, monkeypatch, tmp_path: Path):
    """A fresh bucket; returns (gcsfs file system on the emulator, bucket name)."""
    from gcsfs.core import GCSFileSystem

    for name in GCS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALE_GCS_ENDPOINT_URL", emulator.url)
    monkeypatch.setenv("ALE_CACHE_DIR", str(tmp_path / "cache"))
    fs = GCSFileSystem(endpoint_url=emulator.url, token="anon", project="ale-test", skip_instance_cache=True)
    bucket = f"b-{tmp_path.name[-20:].lower().replace('_', '-')}".strip("-")
    fs.mkdir(bucket)
    return fs, bucket


def _bearer(token: str):
    """google-auth credentials holding a fixed access token (never refreshed)."""
    from google.oauth2.credentials import Credentials

    return Credentials(token=token)


def test_gcs_end_to_end_tree_reference(gcs, emulator: Emulator, tmp_path: Path) -> None:
    fs, bucket = gcs
    v = make_variant(tmp_path / "data", software=True)
    upload_tree(fs, tmp_path / "data", f"{bucket}/pre")
    mark = emulator.mark()
    src = open_source(f"gs://{bucket}/pre", anon=True)
    assert isinstance(src, RemoteSource)
    assert src.fs._location == emulator.url
    tree = src.stage_input(KEY, tmp_path / "run" / "input")
    assert tree == hash_tree(v / "input") and tree["count"] == 3
    assert tree_of(tmp_path / "run" / "input") == tree_of(v / "input")
    assert (tmp_path / "run" / "software" / "tool.py").read_text() == "print('tool')\n"
    # GCS keeps no modes: a file starting with #! is made runnable (its 0700 is not carried over).
    assert (tmp_path / "run" / "input" / "run.sh").stat().st_mode & 0o777 == 0o755
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "tree" and c.sha256 == hash_tree(v / "reference")["digest"]
    src.stage_reference(KEY, tmp_path / "grade" / "reference", c)
    assert tree_of(tmp_path / "grade" / "reference") == tree_of(v / "reference")
    with pytest.raises(DataError, match=rf"neither gcs://{bucket}/pre/dom/task/v9 \(ALE layout\) nor gcs://{bucket}/pre/tasks/dom/task/v9 \(tasks layout\) exists \(available: v0\)"):
        src.stage_input(VariantKey("dom", "task", "v9"), tmp_path / "x")
    seen = emulator.since(mark)
    # Everything went through the emulator's JSON API, and anonymously.
    assert any(p.startswith(f"/download/storage/v1/b/{bucket}/o/") or "alt=media" in p for _, p, _ in seen), seen
    assert all(auth is None for _, _, auth in seen)


def test_gcs_sealed_reference_and_cache_reuse(gcs, emulator: Emulator, tmp_path: Path, monkeypatch) -> None:
    fs, bucket = gcs
    # This time through gcsfs's own emulator variable and ALE_DATA_ANON.
    monkeypatch.delenv("ALE_GCS_ENDPOINT_URL")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url.removeprefix("http://"))
    monkeypatch.setenv("ALE_DATA_ANON", "1")
    from ale.data.sources import open_source

    assert open_source(f"gs://{bucket}/sealed").fs._location == emulator.url
    check_sealed_reference_and_cache_reuse(fs, f"gs://{bucket}/sealed", tmp_path, monkeypatch)


def test_gcs_tampered_archive_is_caught_before_decryption(gcs, tmp_path: Path, monkeypatch) -> None:
    fs, bucket = gcs
    store = tmp_path / "secrets.json"
    v = make_variant(tmp_path / "data")
    seal_variant(v, store, remove_clear=True)
    upload_tree(fs, tmp_path / "data", f"{bucket}/t")
    c = open_source(f"gs://{bucket}/t", anon=True, secret_store=store).commit_reference(KEY)
    assert c is not None and c.kind == "archive"
    fs.pipe(f"{bucket}/t/{KEY.relpath}/reference.7z", b"garbage")
    monkeypatch.setenv("ALE_CACHE_DIR", str(tmp_path / "fresh-cache"))  # else the good blob serves
    src = open_source(f"gs://{bucket}/t", anon=True, secret_store=store)
    with pytest.raises(ReferenceError, match=r"reference.7z: downloaded sha256 .* does not match manifest.json") as e:
        src.stage_reference(KEY, tmp_path / "g" / "ref", c)
    assert e.value.status is RunStatus.GRADING_FAILED
    assert not (tmp_path / "g" / "ref").exists()
    assert [p.name for p in (tmp_path / "g").iterdir()] == []


def test_gcs_manifest_mismatch_names_the_file(gcs, tmp_path: Path) -> None:
    fs, bucket = gcs
    check_manifest_mismatch_names_the_file(fs, f"gs://{bucket}/m", tmp_path, anon=True)


def test_gcs_corrupt_cache_entry_is_refetched(gcs, tmp_path: Path) -> None:
    fs, bucket = gcs
    check_corrupt_cache_entry_is_refetched(fs, f"gs://{bucket}/c", tmp_path, anon=True)


def test_gcs_corrupt_cache_and_bad_remote_is_reported(gcs, tmp_path: Path) -> None:
    fs, bucket = gcs
    check_corrupt_cache_and_bad_remote_is_reported(fs, f"gs://{bucket}/cb", tmp_path, anon=True)


def test_gcs_ale_layout(gcs, tmp_path: Path, monkeypatch) -> None:
    fs, bucket = gcs
    check_ale_layout(fs, f"gs://{bucket}/ale", tmp_path, monkeypatch, anon=True)


def test_gcs_reference_role_has_its_own_credentials(gcs, emulator: Emulator, tmp_path: Path, monkeypatch) -> None:
    fs, bucket = gcs
    make_variant(tmp_path / "data")
    upload_tree(fs, tmp_path / "data", f"{bucket}/r")
    src = open_source(
        f"gs://{bucket}/r",
        storage_options={"token": _bearer("candidate-token"), "project": "inputs"},
        reference_storage_options={"token": _bearer("grader-token"), "project": "graders"},
    )
    assert src.fs is not src.ref_fs
    assert src.ref_fs.project == "graders" and src.fs.project == "inputs"
    mark = emulator.mark()
    src.stage_input(KEY, tmp_path / "in")
    input_auth = {auth for _, _, auth in emulator.since(mark)}
    assert input_auth == {"Bearer candidate-token"}
    monkeypatch.setattr(src.fs, "open", lambda *a, **k: (_ for _ in ()).throw(AssertionError("input fs used for the reference")))
    mark = emulator.mark()
    c = src.commit_reference(KEY)
    src.stage_reference(KEY, tmp_path / "g" / "ref", c)
    assert (tmp_path / "g" / "ref" / "answer.txt").read_text() == "REFERENCE-MARKER-42\n"
    # Every reference download carried the grader's token, none the candidate's.
    downloads = [auth for _, p, auth in emulator.since(mark) if "alt=media" in p and "/reference/" in p.replace("%2F", "/")]
    assert downloads and set(downloads) == {"Bearer grader-token"}


def test_gcs_prefetch_fills_cache(gcs, tmp_path: Path, monkeypatch) -> None:
    fs, bucket = gcs
    monkeypatch.setenv("ALE_DATA_ANON", "1")
    make_variant(tmp_path / "data")
    upload_tree(fs, tmp_path / "data", f"{bucket}/p")
    lines: list[str] = []
    n = prefetch(f"gs://{bucket}/p", [KEY], progress=False, say=lines.append)
    assert n == sum(p.stat().st_size for p in (tmp_path / "data" / KEY.relpath / "input").rglob("*") if p.is_file())
    assert lines and "tasks/dom/task/v0" in lines[0]
    assert len([p for p in BlobCache().blobs.rglob("*") if p.is_file()]) == 3


def test_gcs_endpoint_options(monkeypatch) -> None:
    require_module("gcsfs")
    from gcsfs.core import GCSFileSystem

    for name in GCS_ENV:
        monkeypatch.delenv(name, raising=False)
    assert storage_options_for("gcs", anon=True, role="input", extra=None) == {"token": "anon"}
    monkeypatch.setenv("ALE_GCS_ENDPOINT_URL", "http://127.0.0.1:9/")
    for role in ("input", "reference"):
        assert storage_options_for("gcs", anon=True, role=role, extra=None) == {
            "endpoint_url": "http://127.0.0.1:9",
            "token": "anon",
        }
    # With an endpoint, the JSON-API class serves (no gRPC bucket-layout probe).
    fs = make_filesystem("gcs", storage_options_for("gcs", anon=True, role="input", extra=None))
    assert type(fs) is GCSFileSystem and fs._location == "http://127.0.0.1:9"
    monkeypatch.delenv("ALE_GCS_ENDPOINT_URL")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9")
    fs = make_filesystem("gcs", {"token": "anon"})
    assert type(fs) is GCSFileSystem and fs._location == "http://127.0.0.1:9"
