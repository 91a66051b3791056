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


def make_variant(
    root: Path,
    key: str = "dom/task/v0",
    *,
    reference: bool = True,
    software: bool = False,
    big: int = 0,
) -> Path:
    """A variant folder under root/tasks/ with a few input files (and a reference)."""
    v = root / "tasks" / key
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
