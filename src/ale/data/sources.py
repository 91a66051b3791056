"""Open a data source from its spec (the only factory), and prefetch for `ale data pull`.

Specs: ``local:<dir>`` (or a plain path), ``s3://bucket/prefix``,
``gs://bucket/prefix``, ``hf://datasets/<org>/<name>[@revision][/prefix]`` and
``image:<ref>`` (a baked image), each optionally followed by ``#layout=auto|ale|tasks``.
Every source reads both layouts of a data root (ale.data.roots):
``<root>/<domain>/<task>/<variant>/...`` (ALE's) and
``<root>/tasks/<domain>/<task>/<variant>/...``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ale.data.baked import ImageSource
from ale.data.base import DataError, DataSource, ImageStore, VariantKey
from ale.data.local import LocalSource
from ale.data.remote import RemoteSource
from ale.data.roots import choose_layout, split_spec

REMOTE_SCHEMES = ("s3://", "gs://", "gcs://", "hf://", "memory://")


def open_source(
    spec: str,
    *,
    base_dir: Path | None = None,
    layout: str | None = None,
    anon: bool | None = None,
    storage_options: dict[str, Any] | None = None,
    reference_storage_options: dict[str, Any] | None = None,
    secret_store: Path | None = None,
    image_store: ImageStore | None = None,
) -> DataSource:
    """The data source a spec names.

    `base_dir` resolves a relative local path (default: the current folder).
    `layout` is "auto", "ale" or "tasks" (default: the spec's ``#layout=`` option,
    else "auto"). `anon`, `storage_options` and `reference_storage_options`
    configure remote sources (see ale.data.remote); `secret_store` is the grader's
    password file for sealed references; `image_store` serves `image:` sources
    (required for them, e.g. ale.sandbox.docker_images.DockerImageStore).

    Raises DataError for an empty or unknown spec, an unknown option or layout, a
    layout argument that contradicts the spec's, and whatever the source itself
    refuses when opening (an image that is not there, a bucket-less URL).
    """
    spec = spec.strip()
    if not spec:
        raise DataError("empty data source spec")
    if spec.startswith("image:"):
        return ImageSource(spec, store=image_store, layout=layout, secret_store=secret_store)
    if spec.startswith(REMOTE_SCHEMES):
        return RemoteSource(
            spec,
            layout=layout,
            anon=anon,
            storage_options=storage_options,
            reference_storage_options=reference_storage_options,
            secret_store=secret_store,
        )
    base, options = split_spec(spec)
    chosen = choose_layout(spec, options.get("layout"), layout)
    return LocalSource(_local_path(spec, base, base_dir), layout=chosen, secret_store=secret_store)


def _local_path(spec: str, base: str, base_dir: Path | None) -> Path:
    if base.startswith("file://"):
        base = "local:" + base[len("file://") :]
    if "://" in base:
        raise DataError(
            f"unknown data source {spec!r}: use local:<dir>, s3://, gs://, hf://datasets/<org>/<name> or image:<ref>"
        )
    raw = base[len("local:") :] if base.startswith("local:") else base
    path = Path(raw).expanduser()
    return path if path.is_absolute() else (base_dir or Path.cwd()) / path


def anchor_spec(spec: str, base_dir: Path) -> str:
    """The spec with a relative local path made absolute against `base_dir`; any
    other spec unchanged. For specs given where the task folder is not their base:
    ``ale run --data`` (the current folder), an experiment's ``data_source`` (the
    experiment file's folder). A task card's own spec stays relative to its task."""
    stripped = spec.strip()
    if not stripped or stripped.startswith(("image:", *REMOTE_SCHEMES)):
        return spec
    base, options = split_spec(stripped)
    if "://" in base and not base.startswith("file://"):
        return spec  # open_source names the problem
    path = os.path.normpath(_local_path(stripped, base, base_dir))
    return "local:" + path + ("#" + stripped.rpartition("#")[2] if options else "")


def prefetch(
    spec: str,
    keys: list[VariantKey],
    *,
    base_dir: Path | None = None,
    layout: str | None = None,
    reference: bool = False,
    anon: bool | None = None,
    progress: bool | None = None,
    image_store: ImageStore | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """Warm the cache for `keys` (for `ale data pull`); returns the bytes fetched or found.

    A local source needs no cache: its variants are only checked to exist (as is
    a baked image's, which needs `image_store`). Each line said names the variant
    and the layout it was found in. Raises DataError for a missing variant (naming
    the paths tried) or a failed download.
    """
    source = open_source(spec, base_dir=base_dir, layout=layout, anon=anon, image_store=image_store)
    if isinstance(source, RemoteSource):
        source.progress = progress
    total = 0
    for key in keys:
        n = source.prefetch_variant(key, reference=reference)
        total += n
        where = f"{source.location(key)} ({source.layout_of(key)} layout)"
        if isinstance(source, LocalSource):
            say(f"{key.relpath}: local, nothing to fetch: {where}")
        elif isinstance(source, RemoteSource):
            say(f"{key.relpath}: {n} bytes in the cache from {where}")
        else:
            say(f"{key.relpath}: ready in {where}")
    return total
