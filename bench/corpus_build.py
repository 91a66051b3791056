"""The build time and disk of a whole task tree's environments, cold and cached.

    .venv/bin/python bench/corpus_build.py PATH/TO/tasks [--keep]

Runs ``ale env build TREE --json`` twice in one process tree:

1. **cold**: ale's cache folder is a new, empty one (no wheel downloads, no sdist
   builds, no Ubuntu keyring), and every image ale builds for environments is removed
   first (``ale-env*``, the interpreter tools images ``ale-tools:python*`` and their
   bootstrapped Debian/Ubuntu bases); the default tools image is kept (every run needs
   it; its build is measured in ``docs/benchmarks.md`` on its own);
2. **cached**: the same command again, with that cache.

Reports each pass's wall time, the tasks built, skipped (unsupported under Docker) and
failed, the distinct images, the slowest builds, the disk the environment images take
(the engine's own accounting of their unique layers: ``docker system df -v``) and the
cache folder's size; writes ``bench/results/corpus_build.{json,md}`` (and each task's row,
as it is built, to ``--rows``). Needs the
registries an image build uses (PyPI, the Debian and Ubuntu mirrors); run it on a quiet
machine: it is the machine's whole time for the cold pass.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from publish import publish  # noqa: E402

ENV_REPOS = ("ale-env", "ale-env-system", "ale-env-builder")


def _images() -> list[dict[str, Any]]:
    out = subprocess.run(["docker", "image", "ls", "--format", "{{json .}}"], capture_output=True, text=True,
                         check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _layers(ref: str) -> list[str]:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref],
                         capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []


def interpreter_bases() -> set[str]:
    """The bootstrapped bases (``ale-base:*``) the interpreter tools images were built on:
    those whose one layer is such an image's first."""
    firsts = {ls[0] for i in _images() if i["Repository"] == "ale-tools" and i["Tag"].startswith("python")
              for ls in [_layers(f"ale-tools:{i['Tag']}")] if ls}
    return {f"ale-base:{i['Tag']}" for i in _images() if i["Repository"] == "ale-base"
            and (ls := _layers(f"ale-base:{i['Tag']}")) and ls[0] in firsts}


def _ours(img: dict[str, Any], bases: set[str] | frozenset[str] = frozenset()) -> bool:
    repo, tag = img.get("Repository", ""), img.get("Tag", "")
    if repo in ENV_REPOS:
        return True
    if repo == "ale-tools" and tag.startswith("python"):
        return True
    return f"{repo}:{tag}" in bases


def remove_environment_images() -> int:
    """Remove every environment image and interpreter tools image (and their bases)."""
    bases = interpreter_bases()
    mine = [i for i in _images() if _ours(i, bases)]
    ids = {i["ID"] for i in mine}
    refs = [f"{i['Repository']}:{i['Tag']}" for i in mine]
    # and the content tags (ale-tools:<key>) of those interpreter tools images
    refs += [f"{i['Repository']}:{i['Tag']}" for i in _images() if i["Repository"] == "ale-tools" and i["ID"] in ids
             and f"{i['Repository']}:{i['Tag']}" not in refs]
    if refs:
        subprocess.run(["docker", "image", "rm", "-f", *refs], capture_output=True, text=True)
    subprocess.run(["docker", "image", "prune", "-f"], capture_output=True)
    return len(refs)


def env_disk() -> dict[str, Any]:
    """The environment images' disk, from the engine's own accounting of unique layers."""
    out = subprocess.run(["docker", "system", "df", "-v", "--format", "{{json .}}"], capture_output=True, text=True)
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        return {"error": out.stderr.strip()[-300:]}
    bases = interpreter_bases()
    mine = [i for i in doc.get("Images") or [] if _ours(i, bases)]
    unique = sum(_bytes(i.get("UniqueSize", "0B")) for i in mine)
    shared = {i.get("SharedSize") for i in mine}
    return {"images": len(mine), "unique_bytes": unique, "shared_sizes_seen": len(shared)}


def _bytes(text: str) -> int:
    units = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    for u in sorted(units, key=len, reverse=True):
        if text.endswith(u):
            return int(float(text[: -len(u)]) * units[u])
    return 0


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def build_pass(tasks: Path, cache: Path, rows_file: Path) -> dict[str, Any]:
    """One ``ale env build TREE --json``; each task's row is appended to ``rows_file`` as it
    comes (a pass stopped part-way keeps what it built)."""
    src = str(HERE.parent / "src")
    env = {**os.environ, "ALE_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    ale = [sys.executable, "-c", "from ale.cli import app; app()"]  # this checkout's ale
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    with open(rows_file, "a") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*ale, "env", "build", str(tasks), "--json"], stdout=subprocess.PIPE, stderr=err,
                                text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                row = json.loads(line)
                row["at_s"] = round(time.monotonic() - t0, 1)
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
        proc.wait()
        err.seek(0)
        stderr = err.read()
    wall = time.monotonic() - t0
    built = [r for r in rows if "image" in r]
    return {
        "wall_s": round(wall, 1), "exit": proc.returncode, "tasks": len(rows), "built": len(built),
        "skipped": sum(1 for r in rows if "skipped" in r), "failed": [r["task"] for r in rows if "error" in r],
        "complete": sum(1 for r in built if not r["missing"]),
        "images": len({r["image"] for r in built}),
        "cached_rows": sum(1 for r in built if r.get("cached")),
        "slowest": sorted(({"task": Path(r["task"]).name, "build_s": round(r["build_s"] or 0, 1), "image": r["image"],
                            "size": r.get("size")} for r in built if r.get("build_s")),
                          key=lambda x: -x["build_s"])[:8],
        "stderr_tail": stderr.strip().splitlines()[-6:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the cache folder (printed)")
    ap.add_argument("--rows", type=Path, default=Path(tempfile.gettempdir()) / "corpus_build.rows.jsonl",
                    help="each task's row, appended as it is built (default: %(default)s)")
    args = ap.parse_args(argv)
    cache = Path(tempfile.mkdtemp(prefix="ale-corpus-cache-"))
    removed = remove_environment_images()
    print(f"removed {removed} environment image tag(s); cache {cache}", file=sys.stderr)
    rows_file = args.rows
    rows_file.unlink(missing_ok=True)
    cold = build_pass(args.tasks, cache, rows_file)
    print(f"cold: {cold['wall_s']} s", file=sys.stderr)
    disk = env_disk()
    cache_bytes = du(cache)
    cached = build_pass(args.tasks, cache, rows_file)
    print(f"cached: {cached['wall_s']} s", file=sys.stderr)
    doc = {"tasks_dir": str(args.tasks), "cold": cold, "cached": cached, "disk": disk, "cache_bytes": cache_bytes,
           "cores": os.cpu_count()}
    if not args.keep:
        shutil.rmtree(cache, ignore_errors=True)
    gb = 1e9
    md = "\n".join([
        f"Whole tree `{args.tasks.name}`: {cold['tasks']} task folders, {cold['built']} built under Docker, "
        f"{cold['skipped']} skipped (not Linux), {len(cold['failed'])} failed; {cold['complete']} fully provisioned; "
        f"{cold['images']} distinct environment images.",
        "",
        "| pass | wall | rows served from cache |",
        "| --- | --- | --- |",
        f"| cold (empty cache, no environment image) | {cold['wall_s']:.0f} s | {cold['cached_rows']} |",
        f"| cached (the same command again) | {cached['wall_s']:.0f} s | {cached['cached_rows']} |",
        "",
        f"Disk: {disk.get('images', '?')} environment images (with their interpreter tools images and bases), "
        f"{disk.get('unique_bytes', 0) / gb:.1f} GB of layers they do not share with the tools image; "
        f"ale's cache (wheel store downloads, sdist builds): {cache_bytes / gb:.1f} GB.",
    ])
    publish("corpus_build", doc, md)
    print(md)
    return 0 if not cold["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
