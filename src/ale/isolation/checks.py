"""Checks of a container's effective state, read from `docker inspect`.

Every rule of the table in ISOLATION.md is one registered rule (`inspect_rules`)
producing one `Check` with a stable dotted id; `rules.judge` runs them at a
moment. This module keeps the vocabulary every caller shares (`Check`, `Moment`,
`failures`, `violation_line`), the entry points the callers have always used
(`check_inspect`, `diff_captures`), and the image record the evidence keeps.

The same functions run at run time (before and after the agent) and later in
`ale verify` over the stored raw JSON, so they take plain dicts and never call
the engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from ale.isolation.inspect_rules import (
    DOCKER_DEFAULT_CAPS,
    ZERO_TIME,
    looks_like_credential,
    normalize_cap,
    parse_size,
)
from ale.isolation.registry import MOMENTS, Check, Moment, as_moment, failures
from ale.isolation.rules import judge
from ale.sandbox.base import Mount
from ale.sandbox.policy import IsolationPolicy

__all__ = [
    "DOCKER_DEFAULT_CAPS", "MOMENTS", "ZERO_TIME", "Check", "Moment", "as_moment", "check_inspect",
    "diff_captures", "failures", "image_record", "image_store", "looks_like_credential", "normalize_cap",
    "parse_size", "violation_line", "violation_lines",
]  # fmt: skip


def violation_line(group: str, check: Check) -> str:
    """The one human line for a failed or unknown check, under its group (the run's
    step that judged it: ``inspect-before``, ``probes-after``, ...)."""
    c = check
    return f"[{group}] {c.id}: expected {c.expected!r}, observed {c.observed!r}" \
        + (f" ({c.detail})" if c.detail else "")


def violation_lines(group: str, checks: Iterable[Check]) -> list[str]:
    """`violation_line` of every check that did not pass."""
    return [violation_line(group, c) for c in failures(checks)]


def check_inspect(
    inspect: dict,
    policy: IsolationPolicy,
    expected_mounts: list[Mount],
    *,
    phase: Moment | str,
    image_inspect: dict | None = None,
    mount_inodes: dict[str, int] | None = None,
) -> list[Check]:
    """Every rule of ISOLATION.md's inspect table at moment `phase`, as one Check each."""
    return judge(as_moment(phase), policy=policy, mounts=expected_mounts, inspect=inspect,
                 image_inspect=image_inspect, mount_inodes=mount_inodes)


def diff_captures(before: dict, after: dict) -> list[Check]:
    """`Config`, `HostConfig` and `Mounts` must be identical in both captures."""
    return judge("after", captures=(before, after))


# -- image ---------------------------------------------------------------------
_CONTAINERD_SNAPSHOTTERS = frozenset({"overlayfs", "native", "stargz", "devmapper"})


def image_store(image_inspect: dict, container_inspect: dict | None = None) -> str:
    """`containerd` (snapshotter image store), `graphdriver:<name>`, or `unknown`."""
    if "Descriptor" in image_inspect:
        return "containerd"
    name = None
    for doc in (container_inspect, image_inspect):
        if isinstance(doc, dict):
            name = (doc.get("GraphDriver") or {}).get("Name") or doc.get("Driver") or name
            if name:
                break
    if not name:
        return "unknown"
    return "containerd" if name in _CONTAINERD_SNAPSHOTTERS else f"graphdriver:{name}"


def image_record(image_inspect: dict, container_inspect: dict | None = None) -> dict:
    """What the evidence keeps about the image a container ran."""
    cfg = image_inspect.get("Config") or {}
    return {
        "id": image_inspect.get("Id"),
        "repo_tags": image_inspect.get("RepoTags") or [],
        "repo_digests": image_inspect.get("RepoDigests") or [],
        "created": image_inspect.get("Created"),
        "architecture": image_inspect.get("Architecture"),
        "os": image_inspect.get("Os"),
        "size": image_inspect.get("Size"),
        "layers": (image_inspect.get("RootFS") or {}).get("Layers") or [],
        "labels": cfg.get("Labels") or {},
        "volumes": cfg.get("Volumes") or {},
        "user": cfg.get("User"),
        "store": image_store(image_inspect, container_inspect),
        "container_image": (container_inspect or {}).get("Image"),
    }
