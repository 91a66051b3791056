"""A native harness's own transcript, copied out of the sandbox after its turn.

The harness runs as the candidate, so whatever it writes in its HOME is written by
the candidate: kept for the reader (it holds what the harness showed and decided,
in the harness's own format), never evidence of a step. The trusted trajectory is
derived from the gateway's record (``ale.agents.gateway.steps``).

What each pinned harness writes, under its HOME (``harness.NATIVE_HOME/<name>``):

- Claude Code: ``.claude/projects/<cwd>/<session>.jsonl`` (and sub-agents' under
  the session);
- Gemini CLI: ``.gemini/tmp/<project>/chats/session-*.json`` and ``logs.json``;
- Codex: ``.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`` (native mode runs it
  without ``--ephemeral`` so that it writes one).

A small Python program runs inside the sandbox as the candidate user, walks those
folders without following links and prints one JSON line per regular file (its path
under HOME and its bytes in base64, up to the limits). The trusted side believes
none of it: each line is parsed on its own, a path must be relative, stay under one
of the harness's folders and use only plain characters, the limits are applied
again, and each file is created new (``O_EXCL | O_NOFOLLOW``) under
``agent/harness-transcript/`` in folders this module made itself. Nothing is
extracted, no link is ever created. ``agent/harness-transcript.json`` lists each
file (path, size, sha256, ``written_by: candidate``) and what was left out and why.
The run's signed manifest covers these files like every other file of the run.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from ale import layout

TRANSCRIPT_DIRS: dict[str, tuple[str, ...]] = {
    "claude-code": (".claude/projects",),
    "codex": (".codex/sessions",),
    "gemini-cli": (".gemini/tmp",),
}
MAX_FILES = 200
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_TOTAL_BYTES = 8 * 1024 * 1024
TIMEOUT_S = 60.0
_SAFE_PART = re.compile(r"^[A-Za-z0-9._@+=,-]{1,200}$")
WRITTEN_BY = "candidate"

# Runs inside the sandbox, as the candidate user: stdlib only, links never followed.
_LISTER = r"""
import base64, json, os, stat, sys
home, max_files, max_file, max_total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
files = total = 0
def out(d):
    sys.stdout.write(json.dumps(d) + "\n")
for root in sys.argv[5:]:
    top = os.path.join(home, root)
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, home)
            try:
                st = os.lstat(p)
                if not stat.S_ISREG(st.st_mode):
                    out({"path": rel, "skipped": "not a regular file"}); continue
                if files >= max_files or total >= max_total:
                    out({"path": rel, "size": st.st_size, "skipped": "past the count or size limit"}); continue
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    data = f.read(min(max_file, max_total - total) + 1)
            except OSError as e:
                out({"path": rel, "skipped": "unreadable: " + type(e).__name__}); continue
            keep = data[:min(max_file, max_total - total)]
            files += 1
            total += len(keep)
            out({"path": rel, "size": st.st_size, "truncated": len(keep) < len(data) or st.st_size > len(data), "data": base64.b64encode(keep).decode()})
"""  # noqa: E501


def _safe_rel(path: Any, roots: tuple[str, ...]) -> str | None:
    """The path when it is relative, under one of ``roots``, of plain parts; else None."""
    if not isinstance(path, str) or not path or path.startswith("/"):
        return None
    parts = PurePosixPath(path).parts
    if any(p in (".", "..") or not _SAFE_PART.match(p) for p in parts):
        return None
    if not any(parts[: len(PurePosixPath(r).parts)] == PurePosixPath(r).parts
               and len(parts) > len(PurePosixPath(r).parts)
               for r in roots):
        return None
    return "/".join(parts)


def _write_new(root: Path, rel: str, data: bytes) -> None:
    target = root / rel
    target.parent.mkdir(parents=True, exist_ok=True)  # folders made here, under a folder made here: no link among them
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def ingest(run_dir: Path, harness: str, home: str, stdout: bytes, *, truncated: bool = False,
           error: str | None = None) -> dict[str, Any]:
    """Write the files the lister printed, and the manifest; return the manifest."""
    roots = TRANSCRIPT_DIRS.get(harness, ())
    dest = Path(run_dir) / layout.agent_path(layout.Agent.HARNESS_TRANSCRIPT)
    files: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    total = 0
    if stdout:
        dest.mkdir(parents=True, exist_ok=False)
    for n, line in enumerate(stdout.splitlines(), 1):
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            skipped.append({"line": n, "reason": "not a JSON line"})
            continue
        if not isinstance(item, dict):
            skipped.append({"line": n, "reason": "not an object"})
            continue
        rel = _safe_rel(item.get("path"), roots)
        shown = item.get("path") if isinstance(item.get("path"), str) else None
        shown = shown[:300].encode("utf-8", "backslashreplace").decode() if shown else None
        if rel is None:
            skipped.append({"path": shown, "reason": "not a plain path under " + " or ".join(roots)})
            continue
        if "skipped" in item:
            skipped.append({"path": rel, "reason": str(item["skipped"])[:200]})
            continue
        try:
            data = base64.b64decode(str(item.get("data", "")), validate=True)
        except (binascii.Error, ValueError):
            skipped.append({"path": rel, "reason": "its bytes are not base64"})
            continue
        if len(files) >= MAX_FILES or len(data) > MAX_FILE_BYTES or total + len(data) > MAX_TOTAL_BYTES:
            skipped.append({"path": rel, "reason": "past the count or size limit"})
            continue
        try:
            _write_new(dest, rel, data)
        except OSError as e:  # a second line with the same path, or a file where a folder is wanted
            skipped.append({"path": rel, "reason": f"cannot be written: {type(e).__name__}"})
            continue
        total += len(data)
        size = item.get("size")
        files.append({
            "path": layout.agent_path(f"{layout.Agent.HARNESS_TRANSCRIPT}/{rel}"), "source": f"$HOME/{rel}",
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "size_in_sandbox": size if isinstance(size, int) and not isinstance(size, bool) else None,
            "truncated": item.get("truncated") is True, "written_by": WRITTEN_BY,
        })
    manifest = {
        "written_by": WRITTEN_BY,
        "note": "the harness's own transcript, written inside the sandbox by the candidate's harness; "
                "the trusted steps are trajectory.json's, derived from the gateway's record",
        "harness": harness, "home": home, "roots": [f"$HOME/{r}" for r in roots],
        "limits": {"max_files": MAX_FILES, "max_file_bytes": MAX_FILE_BYTES, "max_total_bytes": MAX_TOTAL_BYTES},
        "files": files, "skipped": skipped[:200], "skipped_count": len(skipped),
        "output_truncated": truncated, "error": error,
    }
    path = Path(run_dir) / layout.agent_path(layout.Agent.HARNESS_TRANSCRIPT_MANIFEST)
    path.write_text(json.dumps(manifest, indent=2))
    return manifest


async def copy_out(sandbox: Any, run_dir: Path, harness: str, home: str) -> dict[str, Any]:
    """Copy the harness's transcript out of the live sandbox (see the module doc);
    never raises: a failure is the manifest's ``error``."""
    roots = TRANSCRIPT_DIRS.get(harness, ())
    limit = MAX_TOTAL_BYTES * 4 // 3 + 1024 * 1024  # the base64 of the bytes kept, and the lines around them
    try:
        res = await sandbox.exec(["python3", "-c", _LISTER, home, str(MAX_FILES), str(MAX_FILE_BYTES),
                                  str(MAX_TOTAL_BYTES), *roots], timeout=TIMEOUT_S, output_limit=limit)
    except Exception as e:  # the sandbox gone or the engine failing: the run goes on without the transcript
        return ingest(run_dir, harness, home, b"", error=f"the transcript could not be read: {type(e).__name__}: {e}")
    error = None
    if res.timed_out:
        error = f"reading the transcript took more than {TIMEOUT_S:.0f}s"
    elif res.exit_code != 0:
        error = f"the lister exited with code {res.exit_code}: {res.stderr[-500:].decode(errors='replace')}"
    return ingest(run_dir, harness, home, res.stdout,
                  truncated=bool(getattr(res, "stdout_truncated", False)), error=error)
