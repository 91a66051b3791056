"""A run's software, provisioned before the seal.

What the task needs (its card's ``software`` list, its variant's staged
``input/runtime_env/`` manifests, an ``environment`` block, the operator's overlay:
``ale.provision.resolve_needs``) becomes a content-cached environment image on the
trusted side (``ale.sandbox.env_image``), built on first use and found afterwards.
The candidate's sandbox and the grading sandbox start from it; the seal is
unchanged. ``evidence/environment.json`` records the image, every need with its
origin, what is missing and why, and what the image holds (its record, whose
sha256 the image carries as a label that ``ale verify`` re-derives).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ale.provision.needs import Provisioning, resolve_needs
from ale.provision.sources import Overlay, ProvisionError, load_overlay
from ale.sandbox.base import SandboxError
from ale.sandbox.software import record_digest

log = logging.getLogger("ale.software")

Say = Callable[[str], None]

# One build per spec at a time in this process: concurrent runs of the same needs
# wait for the first build and then find its image.
_BUILD_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _build_lock(key: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _BUILD_LOCKS.setdefault(key, threading.Lock())

class SoftwareError(RuntimeError):
    """The task's software could not be provided (a malformed environment block or
    overlay: final; a build that failed: retryable). Raised before the candidate's
    sandbox exists."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


def read_overlay(path: str | None) -> Overlay | None:
    if path is None:
        return None
    try:
        return load_overlay(path)
    except ProvisionError as e:
        raise SoftwareError(str(e)) from e


def resolve(task_dir: str | Path, *, input_dir: Path | None, overlay: Overlay | None) -> Provisioning:
    try:
        return resolve_needs(task_dir, input_dir=input_dir if input_dir is not None and input_dir.is_dir() else None,
                             overlay=overlay)
    except ProvisionError as e:
        raise SoftwareError(str(e)) from e


def build_for(prov: Provisioning, base_image: str, say: Say) -> tuple[str, dict[str, Any]]:
    """The image a run with these needs starts from, and the environment record for
    its evidence: the base itself when nothing is needed, a ready image the task
    names, or the (cached) environment image built on ``base_image``."""
    doc: dict[str, Any] = {
        "base": base_image,
        "spec_key": prov.spec.key(),
        "declared": prov.declared,
        "needs": [n.model_dump(mode="json") for n in prov.needs],
        "missing": [m.model_dump(mode="json") for m in prov.missing],
        "notes": prov.notes,
    }
    if prov.image is not None:
        doc.update(image=prov.image, kind="ready image")
        return prov.image, doc
    if prov.spec.empty:
        doc.update(image=base_image, kind="base")
        return base_image, doc
    from ale.sandbox.env_image import build_env_image

    try:
        with _build_lock(f"{prov.spec.key()}:{base_image}"):
            env = build_env_image(prov.spec, base_image=base_image, say=say)
    except SandboxError as e:
        raise SoftwareError(f"building the environment of {prov.task} failed: {e}", retryable=True) from e
    doc.update(image=env.tag, kind="environment image", image_id=env.image_id, key=env.key, size=env.size,
               cached=env.cached, build_s=round(env.build_s, 3), record=env.record,
               record_sha256=record_digest(env.record))
    doc["missing"] = _missing(prov, env.record)
    return env.tag, doc


def _missing(prov: Provisioning, record: dict[str, Any]) -> list[dict[str, Any]]:
    """What the task needs and does not get: unprovidable names, and what the build
    could not fetch (a package with no wheel for the image)."""
    built = [m for m in record.get("missing", []) if isinstance(m, dict)]
    return [m.model_dump(mode="json") for m in prov.missing] + [
        {"name": m.get("name"), "origin": "build", "why": m.get("why"), "kind": "build"} for m in built]


# Environment images this process found or built: (spec key, base) -> (image, record).
# A run re-uses one after checking the engine still has that image id for its tag.
_FOUND: dict[str, tuple[str, dict[str, Any]]] = {}


async def provide(task_dir: str | Path, *, input_dir: Path | None, overlay_path: str | None, base_image: str,
                  say: Say | None = None,
                  image_id: Callable[[str], str | None] | None = None) -> tuple[str, dict[str, Any]]:
    """Resolve and build off the event loop (a first build takes minutes). ``image_id``
    (the engine's id of a tag, None if absent) lets a run re-use an image this
    process already found: one engine call instead of a lookup."""
    speak = say or log.info
    overlay = read_overlay(overlay_path)
    prov = await asyncio.to_thread(resolve, task_dir, input_dir=input_dir, overlay=overlay)
    memo = f"{prov.spec.key()}:{prov.image}:{base_image}"
    found = _FOUND.get(memo)
    if found is not None and image_id is not None and "image_id" in found[1]:
        image, doc = found
        if await asyncio.to_thread(image_id, image) == doc["image_id"]:
            fresh = {**doc, "declared": prov.declared, "needs": [n.model_dump(mode="json") for n in prov.needs],
                     "missing": _missing(prov, doc.get("record") or {}), "notes": prov.notes, "cached": True,
                     "build_s": 0.0}
            return image, fresh
    image, doc = await asyncio.to_thread(build_for, prov, base_image, speak)
    _FOUND[memo] = (image, doc)
    return image, doc


async def provide_for_vm(task_dir: str | Path, *, input_dir: Path | None, overlay_path: str | None, guest: str,
                         say: Say | None = None) -> tuple[str, dict[str, Any]]:
    """A VM run's software: the environment image built as for a container run (on
    the tools image, on the trusted side), then made a VM guest of its own (its root
    that image, the same kernel and guest agent: ``build_vm_image(root_image=...)``,
    cached by content). Nothing needed: the run's guest as it is. Returns the guest's
    ref and the environment record, whose ``image_id`` is the guest's base disk (what
    the VM's inspect names) and ``root_image_id`` the environment image it was made of."""
    from ale.defaults import DEFAULT_TOOLS_IMAGE
    from ale.runs.images import ensure_images
    from ale.sandbox.docker import DockerProvider
    from ale.sandbox.qemu.image import build_vm_image

    speak = say or log.info
    docker = DockerProvider()
    await asyncio.to_thread(ensure_images, [DEFAULT_TOOLS_IMAGE], speak, provider=docker)

    def image_id(ref: str) -> str | None:
        try:
            return str(docker.image_inspect(ref).get("Id"))
        except SandboxError:
            return None

    image, doc = await provide(task_dir, input_dir=input_dir, overlay_path=overlay_path, base_image=DEFAULT_TOOLS_IMAGE,
                               say=speak, image_id=image_id)
    if doc.get("kind") == "base":  # nothing to add: the guest as planned
        return guest, {**doc, "image": guest, "base": guest, "note": "nothing declared needs more than the guest has"}
    try:
        built = await asyncio.to_thread(build_vm_image, say=speak, root_image=image)
    except SandboxError as e:
        raise SoftwareError(f"making a VM guest of {image} failed: {e}", retryable=True) from e
    manifest = built.manifest
    return str(manifest["ref"]), {**doc, "image": manifest["ref"], "image_id": f"sha256:{built.sha256}",
                                  "root_image": image, "root_image_id": manifest.get("root_image_id"),
                                  "vm_guest": {k: manifest.get(k) for k in ("ref", "key", "base_sha256", "disk_bytes",
                                                                             "kernel_package", "built_s")}}
