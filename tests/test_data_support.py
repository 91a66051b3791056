"""A tiny local stand-in for the few Hugging Face Hub endpoints HfFileSystem reads.

It serves one folder as dataset repositories at ``/api/datasets/<org>/<name>/...`` and
``/datasets/<org>/<name>/resolve/<rev>/<path>``, on 127.0.0.1 only. Enough for
listing, info and ranged downloads; no uploads, no xet.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FAKE_SHA = "0" * 40


class HfStandIn:
    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos  # "org/name" -> folder
        self.requests: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_HEAD(self) -> None:  # noqa: N802
                stand_in.handle(self, head=True)

            def do_GET(self) -> None:  # noqa: N802
                stand_in.handle(self, head=False)

            def do_POST(self) -> None:  # noqa: N802
                stand_in.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HfStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ helpers

    def _entry(self, root: Path, p: Path) -> dict:
        rel = p.relative_to(root).as_posix()
        if p.is_dir():
            return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "path": rel}
        data = p.read_bytes()
        return {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": rel}

    def _send(self, h: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str, head: bool, extra: dict | None = None) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _json(self, h: BaseHTTPRequestHandler, obj: object, head: bool, code: int = 200) -> None:
        self._send(h, code, json.dumps(obj).encode(), "application/json", head)

    def _not_found(self, h: BaseHTTPRequestHandler, head: bool, what: str) -> None:
        self._send(h, 404, json.dumps({"error": what}).encode(), "application/json", head, {"X-Error-Code": "EntryNotFound"})

    def handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        parsed = urllib.parse.urlparse(h.path)
        path = urllib.parse.unquote(parsed.path)
        self.requests.append(f"{h.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "datasets"] and len(parts) >= 5:
            repo = f"{parts[2]}/{parts[3]}"
            root = self.repos.get(repo)
            if root is None:
                self._send(h, 404, b'{"error":"Repository not found"}', "application/json", head, {"X-Error-Code": "RepoNotFound"})
                return
            op = parts[4]
            if op == "revision":
                self._json(h, {"id": repo, "sha": FAKE_SHA, "private": False, "siblings": []}, head)
                return
            if op == "tree":
                sub = "/".join(parts[6:])
                query = urllib.parse.parse_qs(parsed.query)
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                base = root / sub
                if not base.is_dir():
                    self._not_found(h, head, f"{sub} not found")
                    return
                items = base.rglob("*") if recursive else base.iterdir()
                self._json(h, [self._entry(root, p) for p in sorted(items)], head)
                return
            if op == "paths-info":
                length = int(h.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(h.rfile.read(length).decode())
                out = [self._entry(root, root / p) for p in form.get("paths", []) if (root / p).exists()]
                self._json(h, out, head)
                return
        if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            repo = f"{parts[1]}/{parts[2]}"
            root = self.repos.get(repo)
            target = root / "/".join(parts[5:]) if root else None
            if target is None or not target.is_file():
                self._not_found(h, head, "entry not found")
                return
            data = target.read_bytes()
            extra = {"ETag": f'"{hashlib.sha1(data).hexdigest()}"', "X-Repo-Commit": FAKE_SHA, "Accept-Ranges": "bytes"}
            rng = h.headers.get("Range") or h.headers.get("range")
            if rng and rng.startswith("bytes="):
                start_s, _, end_s = rng[6:].partition("-")
                start = int(start_s or 0)
                end = int(end_s) if end_s else len(data) - 1
                chunk = data[start : end + 1]
                extra["Content-Range"] = f"bytes {start}-{start + len(chunk) - 1}/{len(data)}"
                self._send(h, 206, chunk, "application/octet-stream", head, extra)
            else:
                self._send(h, 200, data, "application/octet-stream", head, extra)
            return
        self._not_found(h, head, f"no route for {path}")


# ----------------------------------------------------------------------------- shared helpers



from ale.data.base import VariantKey  # noqa: E402

KEY = VariantKey("dom", "task", "v0")

def make_variant(
    root: Path,
    key: str = "dom/task/v0",
    *,
    layout: str = "tasks",
    reference: bool = True,
    software: bool = False,
    big: int = 0,
) -> Path:
    """A variant folder with a few input files (and a reference): under root/tasks/
    (layout "tasks") or right under root (layout "ale", ALE's own)."""
    v = root / key if layout == "ale" else root / "tasks" / key
    (v / "input" / "sub").mkdir(parents=True)
    (v / "input" / "a.txt").write_text("hello")
    (v / "input" / "sub" / "b.bin").write_bytes(bytes(range(256)) * 400 + b"x" * big)
    (v / "input" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (v / "input" / "run.sh").chmod(0o700)
    (v / "input" / "empty").mkdir()
    if software:
        (v / "software").mkdir()
        (v / "software" / "tool.py").write_text("print('tool')\n")
    if reference:
        (v / "reference" / "frames").mkdir(parents=True)
        (v / "reference" / "answer.txt").write_text("REFERENCE-MARKER-42\n")
        (v / "reference" / "frames" / "f0.bin").write_bytes(b"\x01" * 5000)
    return v


def tree_of(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# -- scenarios shared by every object-store source (s3 on moto, gs on an emulator) --


def upload_tree(fs, local_root: Path, remote: str) -> None:
    fs.put(str(local_root) + "/", remote + "/", recursive=True)
    fs.invalidate_cache()


def check_sealed_reference_and_cache_reuse(fs, url: str, tmp_path: Path, monkeypatch, **open_kw) -> None:
    """A sealed variant: input staged, archive digest committed, reference decrypted;
    a second staging is served by the verified cache without any download."""
    from ale.data.hashing import hash_tree
    from ale.data.sealing import seal_variant
    from ale.data.sources import open_source

    store = tmp_path / "secrets.json"
    v = make_variant(tmp_path / "data")
    seal_variant(v, store, remove_clear=True)
    upload_tree(fs, tmp_path / "data", url.split("://", 1)[1])
    src = open_source(url, secret_store=store, **open_kw)
    src.stage_input(KEY, tmp_path / "r1")
    c = src.commit_reference(KEY)
    manifest = json.loads((v / "manifest.json").read_text())
    assert c is not None and c.kind == "archive" and c.sha256 == manifest["reference_archive"]["sha256"]
    src.stage_reference(KEY, tmp_path / "g" / "reference", c)
    assert (tmp_path / "g" / "reference" / "answer.txt").read_text() == "REFERENCE-MARKER-42\n"
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["reference"]
    again = open_source(url, secret_store=store, **open_kw)

    def no_download(*a, **k):
        raise AssertionError("downloaded although cached")

    monkeypatch.setattr(again.fs, "open", no_download)
    assert again.stage_input(KEY, tmp_path / "r2") == hash_tree(tmp_path / "r1")


def check_manifest_mismatch_names_the_file(fs, url: str, tmp_path: Path, **open_kw) -> None:
    import pytest

    from ale.data.base import DataError
    from ale.data.sealing import build_manifest, write_manifest
    from ale.data.sources import open_source
    from ale.status import RunStatus

    v = make_variant(tmp_path / "data")
    write_manifest(v, build_manifest(v))
    (v / "input" / "a.txt").write_text("HELLO")  # same size, different content
    upload_tree(fs, tmp_path / "data", url.split("://", 1)[1])
    src = open_source(url, **open_kw)
    with pytest.raises(DataError, match=r"input/a.txt: downloaded sha256 .* does not match manifest.json") as e:
        src.stage_input(KEY, tmp_path / "run")
    assert e.value.status is RunStatus.INFRASTRUCTURE_ERROR
    assert not (tmp_path / "run" / "a.txt").exists()


def check_corrupt_cache_entry_is_refetched(fs, url: str, tmp_path: Path, **open_kw) -> None:
    from ale.data.hashing import hash_tree
    from ale.data.remote import BlobCache
    from ale.data.sources import open_source

    v = make_variant(tmp_path / "data")
    upload_tree(fs, tmp_path / "data", url.split("://", 1)[1])
    first = open_source(url, **open_kw).stage_input(KEY, tmp_path / "r1")
    sha = first["files"]["sub/b.bin"]["sha256"]
    blob = BlobCache().blob_path(sha)
    blob.write_bytes(b"rotten" + blob.read_bytes()[6:])
    second = open_source(url, **open_kw).stage_input(KEY, tmp_path / "r2")
    assert second == first
    assert (tmp_path / "r2" / "sub" / "b.bin").read_bytes() == (v / "input" / "sub" / "b.bin").read_bytes()
    assert hash_tree(blob.parent)["files"][sha]["sha256"] == sha  # the blob was replaced


def check_corrupt_cache_and_bad_remote_is_reported(fs, url: str, tmp_path: Path, **open_kw) -> None:
    import pytest

    from ale.data.base import DataError
    from ale.data.remote import BlobCache
    from ale.data.sealing import build_manifest, write_manifest
    from ale.data.sources import open_source

    v = make_variant(tmp_path / "data")
    write_manifest(v, build_manifest(v))
    remote = url.split("://", 1)[1]
    upload_tree(fs, tmp_path / "data", remote)
    first = open_source(url, **open_kw).stage_input(KEY, tmp_path / "r1")
    sha = first["files"]["a.txt"]["sha256"]
    BlobCache().blob_path(sha).write_bytes(b"HELLO")
    fs.pipe(f"{remote}/{KEY.relpath}/input/a.txt", b"HELLO")  # the remote copy went bad too
    with pytest.raises(DataError, match=r"input/a.txt: downloaded sha256 .* does not match manifest.json"):
        open_source(url, **open_kw).stage_input(KEY, tmp_path / "r2")


ALE_PASSWORD = "ale-evaluator-password"


def make_ale_archive(variant: Path, password: str = ALE_PASSWORD) -> Path:
    """Seal variant/reference/ the way ALE ships it: a reference.7z (LZMA2, AES-256,
    encrypted headers) made by py7zr, no manifest, no secret-store entry; the clear
    reference/ is removed."""
    import shutil

    import py7zr

    archive = variant / "reference.7z"
    filters = [{"id": py7zr.FILTER_LZMA2, "preset": 7}, {"id": py7zr.FILTER_CRYPTO_AES256_SHA256}]
    with py7zr.SevenZipFile(archive, "w", filters=filters, password=password, header_encryption=True) as z:
        for p in sorted((variant / "reference").rglob("*")):
            z.write(p, arcname=p.relative_to(variant / "reference").as_posix())
    shutil.rmtree(variant / "reference")
    return archive


def check_ale_layout(fs, url: str, tmp_path: Path, monkeypatch, **open_kw) -> None:
    """ALE's own layout (<root>/<domain>/<task>/<variant>, no tasks/ level) with a
    reference.7z sealed by ALE: found by auto-detection, listed, staged, its reference
    decrypted with ALE_REFERENCE_ARCHIVE_PASSWORD; the layout is recorded; a second
    variant in the tasks/ layout of the same root is found too; the same variant
    under both layouts is refused until a layout is chosen."""
    import pytest

    from ale.data.base import DataError, ReferenceError, VariantKey
    from ale.data.hashing import hash_tree
    from ale.data.sources import open_source
    from ale.status import RunStatus

    root = tmp_path / "data"
    v = make_variant(root, layout="ale", software=True)
    clear = tree_of(v / "reference")
    make_ale_archive(v)
    make_variant(root, "dom/other/base", layout="tasks", reference=True)
    remote = url.split("://", 1)[1]
    upload_tree(fs, root, remote)
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", ALE_PASSWORD)
    store = tmp_path / "no-entries" / "grader-secrets.json"
    src = open_source(url, secret_store=store, **open_kw)
    assert src.layout == "auto"
    assert src.variants() == [VariantKey("dom", "other", "base"), KEY]
    tree = src.stage_input(KEY, tmp_path / "run" / "input")
    assert tree == hash_tree(v / "input")
    assert tree_of(tmp_path / "run" / "software") == tree_of(v / "software")
    assert src.layout_of(KEY) == "ale"
    assert src.location(KEY).endswith(f"{remote}/dom/task/v0")
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "archive"
    src.stage_reference(KEY, tmp_path / "g" / "reference", c)
    assert tree_of(tmp_path / "g" / "reference") == clear
    other = VariantKey("dom", "other", "base")
    assert src.layout_of(other) == "tasks"
    oc = src.commit_reference(other)
    assert oc is not None and oc.kind == "tree"
    src.stage_reference(other, tmp_path / "g2" / "reference", oc)
    # a wrong ALE password: grading_failed, naming the archive; nothing is left
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", "wrong")
    with pytest.raises(ReferenceError, match=rf"{remote}/dom/task/v0/reference.7z .*ALE_REFERENCE_ARCHIVE_PASSWORD.*wrong password") as e:
        open_source(url, secret_store=store, **open_kw).stage_reference(KEY, tmp_path / "g3" / "reference", c)
    assert e.value.status is RunStatus.GRADING_FAILED
    assert list((tmp_path / "g3").iterdir()) == []
    # the same variant under both layouts: refused, naming both, until one is chosen
    fs.put(str(v / "input") + "/", f"{remote}/tasks/dom/task/v0/input/", recursive=True)
    fs.invalidate_cache()
    with pytest.raises(DataError, match=r"under both layouts: .*/dom/task/v0 \(ALE layout\) and .*/tasks/dom/task/v0 \(tasks layout\).*#layout=ale"):
        open_source(url, **open_kw).stage_input(KEY, tmp_path / "amb")
    chosen = open_source(f"{url}#layout=tasks", **open_kw)
    assert chosen.layout == "tasks" and chosen.spec.endswith("#layout=tasks")
    chosen.stage_input(KEY, tmp_path / "as-tasks")
    assert chosen.layout_of(KEY) == "tasks" and chosen.location(KEY).endswith("/tasks/dom/task/v0")
    ale = open_source(url, layout="ale", **open_kw)
    # an explicit "ale" reads tasks/ as a domain called "tasks" (auto never does)
    assert ale.variants() == [KEY, VariantKey("tasks", "dom", "other"), VariantKey("tasks", "dom", "task")]
    with pytest.raises(DataError, match=r"variant folder .*/dom/other/base not found \(available: no task folder"):
        ale.stage_input(other, tmp_path / "x")
