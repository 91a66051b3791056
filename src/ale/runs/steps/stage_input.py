"""The ``stage_input`` phase: the run's public package (input, software, the
workspace's mount point) staged into its scratch, or mounted as an overlay over a
shared, already hashed package (``ale.runs.packages``); and the package's tree hash
as the later phases take it (``public_tree``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ale.data.base import DataError
from ale.data.sources import open_source
from ale.layout import Evidence
from ale.record import evidence as ev
from ale.runs import packages
from ale.runs.state import RunState


async def stage_input(state: RunState) -> None:
    spec = state.prep.data_spec
    if spec is None or state.variant.metadata.get("requires_task_data") is False:
        # No data: ALE's REQUIRES_TASK_DATA = False (its config's metadata says
        # requires_task_data: false), or no source at all. An empty input folder.
        note = "task has no data source" if spec is None else "the task stages no data (requires_task_data: false)"
        state.folder.input_host.mkdir(parents=True, exist_ok=True, mode=0o755)
        _make_workspace_mount_point(state)
        state.record.store.write_json(Evidence.INPUT_STAGED, {"source": None, "note": note})
        return
    state.live.source = open_source(spec, base_dir=state.prep.task.path, image_store=state.prep.provider.image_store())
    key = state.variant.data_key
    shared = await asyncio.to_thread(_stage_shared, state)
    if shared is None:
        tree = await asyncio.to_thread(state.live.source.stage_input, key, state.folder.input_host)
        _make_workspace_mount_point(state)
    else:
        tree = shared
    record = {"source": spec, "key": key.relpath, "layout": state.live.source.layout_of(key),
              "location": state.live.source.location(key), "tree": tree}
    if state.live.package is not None:
        record["shared_package"] = {"key": state.live.package.key,
                                    "created_at": state.live.package.meta.get("created_at"),
                                    "digest": state.live.package.meta["public_tree"]["digest"]}
    state.record.store.write_json(Evidence.INPUT_STAGED, record)


def _stage_shared(state: RunState) -> dict | None:
    """The run's public package as an overlay over a shared, already hashed cache entry
    (``ale.runs.packages``); None where it cannot be shared (not root, a source that
    cannot fingerprint its variant cheaply, sharing off): the run stages its own."""
    source, key, folder = state.live.source, state.variant.data_key, state.folder
    fingerprint = getattr(source, "fingerprint", None)
    if source is None or fingerprint is None or not packages.sharing_enabled():
        return None
    try:
        fp = fingerprint(key)
    except DataError:
        return None  # the staging itself says what is missing
    input_rel = folder.input_host.relative_to(folder.public_host).as_posix()
    entry = packages.entry_key(source.spec, key.relpath, source.layout_of(key), input_rel,
                               state.variant.public_relpath(state.variant.output_dir), fp)

    def build(public: Path) -> dict:
        dest = public / input_rel if input_rel != "." else public
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        tree = source.stage_input(key, dest)
        _make_workspace_mount_point(state, public)
        prefix = "" if input_rel == "." else f"{input_rel}/"
        # hashed while copied: the entry's hash reads none of these files again
        return {"tree": tree, "hashed": {prefix + rel: f for rel, f in tree["files"].items()}}

    pkg = packages.acquire(entry, build)
    try:
        packages.mount_overlay(pkg.public, folder.scratch, folder.public_host)
    except packages.PackageError:
        pkg.release()
        return None
    state.live.package = pkg
    return dict(pkg.meta["tree"])


def public_tree(state: RunState) -> dict:
    """The public package's tree hash: the shared entry's, when this run wrote nothing
    over it and its files are as hashed; else the package hashed now."""
    pkg = state.live.package
    if pkg is not None and packages.upper_untouched(state.folder.scratch) and pkg.unchanged():
        return dict(pkg.meta["public_tree"])
    return ev.hash_tree(state.folder.public_host)


def _make_workspace_mount_point(state: RunState, public: Path | None = None) -> None:
    """An empty folder in the public package (``public``: default the run's) where the
    workspace is mounted (ALE tasks write to ``<task_dir>/output``, inside the
    read-only package)."""
    rel = state.variant.public_relpath(state.variant.output_dir)
    if rel not in (None, "."):
        point = (public or state.folder.public_host) / rel
        if point.exists() and (point.is_symlink() or not point.is_dir() or any(point.iterdir())):
            raise DataError(f"the public package holds {rel!r} where the workspace is mounted; it must not")
        point.mkdir(parents=True, exist_ok=True, mode=0o755)
