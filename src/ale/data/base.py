"""Task data sources: where a variant's input, software and reference come from.

Layout, the same for every source:
``<root>/tasks/<domain>/<task>/<variant>/{input,software,reference}``.
Two roles: the candidate side stages ``input`` (and ``software``); only the
grading side stages ``reference``, and only after the candidate container is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class DataError(RuntimeError):
    """A data source failed: missing folder, unreadable file, digest mismatch."""


@dataclass(frozen=True)
class VariantKey:
    domain: str
    task: str
    variant: str

    @property
    def relpath(self) -> str:
        return f"tasks/{self.domain}/{self.task}/{self.variant}"


@dataclass(frozen=True)
class ReferenceCommitment:
    """What is committed before the agent starts: a digest over the reference."""

    kind: str  # "tree" (sha256 over a file manifest) or "archive" (sha256 of reference.7z)
    sha256: str
    files: int


class DataSource(Protocol):
    spec: str

    def stage_input(self, key: VariantKey, dest: Path) -> None:
        """Copy input/ (and software/ into dest/../software when present) into dest."""
        ...

    def commit_reference(self, key: VariantKey) -> ReferenceCommitment | None:
        """Digest of the reference as it will be staged, or None if there is none."""
        ...

    def stage_reference(self, key: VariantKey, dest: Path, commitment: ReferenceCommitment | None) -> None:
        """Trusted side only: place the reference in dest, checking the commitment."""
        ...
