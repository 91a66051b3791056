"""Task data sources: where a variant's input, software and reference come from.

Two layouts of a data root are read (see ale.data.roots):

- ALE's own (its buckets, its Hugging Face dataset, its local fetch):
  ``<root>/<domain>/<task>/<variant>/{input,software,reference}``;
- the ``tasks/`` layout: ``<root>/tasks/<domain>/<task>/<variant>/...``.

A sealed variant has ``reference.7z`` instead of ``reference/``, and any variant
may carry a ``manifest.json``. Two roles: the candidate side stages ``input``
(and ``software``); only the grading side stages ``reference``, and only after the
candidate container is gone.

This module also defines the `ImageStore` protocol: all that baked images need
from a container engine. ale.data never talks to an engine itself; the sandbox
layer implements the protocol (ale.sandbox.docker_images.DockerImageStore).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from ale.status import RunStatus

# A tree hash: {"files": {relpath: {"sha256": str, "size": int}}, "digest": str, "count": int}
TreeHash = dict[str, Any]

# Where variants sit under a data root: "ale" is <root>/<domain>/<task>/<variant>,
# "tasks" is <root>/tasks/<domain>/<task>/<variant>.
Layout = Literal["ale", "tasks"]
# What a source is told: one layout, or "auto" (each variant is looked up under both).
LayoutChoice = Literal["auto", "ale", "tasks"]
LAYOUT_CHOICES: tuple[LayoutChoice, ...] = ("auto", "ale", "tasks")


class DataError(RuntimeError):
    """A data source failed: missing folder, unreadable file, digest mismatch.

    `status` is the run status the lifecycle should give a run this error stops.
    """

    status: RunStatus = RunStatus.INFRASTRUCTURE_ERROR
    #: Whether another attempt may succeed (an unreachable store may answer later).
    retryable: bool = True

    def __init__(self, message: str, *, status: RunStatus | None = None, retryable: bool | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if retryable is not None:
            self.retryable = retryable


class DataMissing(DataError):
    """The source answered, and the folder or file is not there. Trying again
    finds the same: a run it stops is recorded once, never retried."""

    retryable = False


class ReferenceError(DataError):  # noqa: A001 - the name the lifecycle catches
    """The reference cannot be staged as committed: wrong password, corrupt or
    oversized archive, unsafe entry, digest mismatch. Always grading_failed."""

    status = RunStatus.GRADING_FAILED


class ImageNotFound(DataError):
    """An image store has no image of that name (ImageStore.lookup)."""


def check_layout(value: str, where: str) -> LayoutChoice:
    """`value` as a LayoutChoice; DataError naming `where` and the value otherwise."""
    for choice in LAYOUT_CHOICES:
        if value == choice:
            return choice
    raise DataError(f"{where}: unknown layout {value!r}: use auto, ale or tasks")


@dataclass(frozen=True)
class VariantKey:
    domain: str
    task: str
    variant: str

    @property
    def name(self) -> str:
        """`domain/task/variant`, the key as users write it."""
        return f"{self.domain}/{self.task}/{self.variant}"

    @property
    def relpath(self) -> str:
        """The key as `tasks/<domain>/<task>/<variant>`: the stable name runs, evidence
        and messages use, whatever layout the variant was found in (see relpath_in)."""
        return f"tasks/{self.name}"

    def relpath_in(self, layout: Layout) -> str:
        """The variant folder below a data root of that layout."""
        return self.name if layout == "ale" else self.relpath

    @classmethod
    def parse(cls, text: str) -> VariantKey:
        """`domain/task/variant`, with or without a leading `tasks/`."""
        parts = [p for p in text.strip("/").split("/") if p]
        if len(parts) == 4 and parts[0] == "tasks":
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
    layout: LayoutChoice  # as configured; layout_of(key) says what a variant resolved to

    def layout_of(self, key: VariantKey) -> Layout:
        """The layout the variant is read from, resolved once per key and then pinned
        (so input, commitment and reference all come from the same folder).

        Raises DataError when the variant is in neither layout tried (naming the
        paths tried) or, under "auto", in both (naming both paths)."""
        ...

    def location(self, key: VariantKey) -> str:
        """Where the variant folder is (a path or URL, for evidence and messages)."""
        ...

    def variants(self) -> list[VariantKey]:
        """Every variant under the root, in the layouts this source reads.

        Under "auto", a top-level `tasks/` folder is the tasks layout, never an ALE
        domain called "tasks" (choose layout "ale" for that). Raises DataError when
        the root cannot be listed."""
        ...

    def prefetch_variant(self, key: VariantKey, *, reference: bool = False) -> int:
        """Make the variant ready to stage (for `ale data pull`); returns bytes fetched
        or found in a cache (0 when nothing needs fetching). DataError when missing."""
        ...

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


# ----------------------------------------------------------------------------- images


@dataclass(frozen=True)
class ImageInfo:
    """An image as the engine knows it: its id (sha256:...) and its labels."""

    id: str
    labels: Mapping[str, str]


class ImageReader(Protocol):
    """Reads paths out of one image, through a helper that runs nothing of the image."""

    def exists(self, path: str) -> bool:
        """Whether the absolute path exists in the image (file or folder).

        Raises DataError (naming the path and image) when the engine fails to say."""
        ...

    def get_tar(self, path: str) -> Iterator[bytes] | None:
        """The absolute path as a tar stream, in chunks; None when it does not exist.

        A folder's tar holds the folder under its own base name (``input/...``), a
        file's tar holds that one file. The chunks must be consumed before the
        reader is closed. Raises DataError (naming the path and image) for any
        failure other than absence."""
        ...


class ImageStore(Protocol):
    """What baked-data images need from a container engine, and nothing more."""

    def lookup(self, ref: str) -> ImageInfo:
        """The image `ref` (a tag or an id) names in the local engine (never pulls).

        Raises ImageNotFound naming `ref` when the engine has no such image, and
        DataError when the engine cannot be reached or fails."""
        ...

    def build(self, context: Path, *, tag: str, labels: Mapping[str, str]) -> str:
        """Build `context/Dockerfile` as `tag` with `labels`, without pulling the base
        image and removing intermediate containers; returns the new image's id.

        Raises DataError with the engine's message when the build fails."""
        ...

    def reader(self, image_id: str) -> AbstractContextManager[ImageReader]:
        """A fresh reader of the image: a helper container created with no network,
        never started, labelled as ale's and removed when the context exits.

        Raises DataError when the helper cannot be created."""
        ...
