"""Task data sources: where a variant's input, software and reference come from.

Layout, the same for every source:
``<root>/tasks/<domain>/<task>/<variant>/{input,software,reference}``
(a sealed variant has ``reference.7z`` instead of ``reference/``, and any variant
may carry a ``manifest.json``). Two roles: the candidate side stages ``input``
(and ``software``); only the grading side stages ``reference``, and only after the
candidate container is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ale.status import RunStatus

# A tree hash: {"files": {relpath: {"sha256": str, "size": int}}, "digest": str, "count": int}
TreeHash = dict[str, Any]


class DataError(RuntimeError):
    """A data source failed: missing folder, unreadable file, digest mismatch.

    `status` is the run status the lifecycle should give a run this error stops.
    """

    status: RunStatus = RunStatus.INFRASTRUCTURE_ERROR

    def __init__(self, message: str, *, status: RunStatus | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class ReferenceError(DataError):  # noqa: A001 - the name the lifecycle catches
    """The reference cannot be staged as committed: wrong password, corrupt or
    oversized archive, unsafe entry, digest mismatch. Always grading_failed."""

    status = RunStatus.GRADING_FAILED


@dataclass(frozen=True)
class VariantKey:
    domain: str
    task: str
    variant: str

    @property
    def relpath(self) -> str:
        return f"tasks/{self.domain}/{self.task}/{self.variant}"

    @classmethod
    def parse(cls, text: str) -> VariantKey:
        """`domain/task/variant`, with or without a leading `tasks/`."""
        parts = [p for p in text.strip("/").split("/") if p]
        if parts and parts[0] == "tasks":
            parts = parts[1:]
        if len(parts) != 3 or any(p in (".", "..") for p in parts):
            raise DataError(f"variant key {text!r} is not of the form domain/task/variant")
        return cls(*parts)


@dataclass(frozen=True)
class ReferenceCommitment:
    """What is committed before the agent starts: a digest over the reference."""

    kind: str  # "tree" (sha256 over a file manifest) or "archive" (sha256 of reference.7z)
    sha256: str
    files: int  # files in the reference tree; for an archive, as its manifest records (0: unknown)


class DataSource(Protocol):
    spec: str

    def stage_input(self, key: VariantKey, dest: Path) -> TreeHash:
        """Copy input/ into dest (and software/ into dest.parent/"software" when present).

        Returns the tree hash of the staged input.
        """
        ...

    def commit_reference(self, key: VariantKey) -> ReferenceCommitment | None:
        """Digest of the reference as it will be staged, or None if there is none."""
        ...

    def stage_reference(
        self, key: VariantKey, dest: Path, commitment: ReferenceCommitment | None
    ) -> None:
        """Trusted side only: place the reference in dest, checking the commitment."""
        ...
