"""The rules read from the host's listing of the workspace: it began empty."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ale.isolation.registry import WORKSPACE, Missing, Moment, Verdict, rule


@dataclass(frozen=True)
class WorkspaceSubject:
    """A listing of the workspace (`probes.workspace_listing`), and the inode it had at creation."""

    moment: Moment
    listing: Any  # {"entries": [{"name", ...}], "inode", ...}; None when it was not recorded
    expected_inode: int | None = None


def _listed(s: WorkspaceSubject) -> bool:
    return isinstance(s.listing, dict) and "entries" in s.listing


@rule("ws.empty_at_start", source=WORKSPACE, area="workspace", expected=[], moments=("before", "running"))
def empty_at_start(s: WorkspaceSubject) -> Verdict:
    """The workspace folder has no entry (observed: the names found).

    The candidate's deliverables are what it wrote: nothing may be there before it starts.
    """
    if not _listed(s):
        raise Missing("entries")
    names = [e["name"] for e in s.listing["entries"]]
    return not names, names, f"workspace not empty: {names[:20]}" if names else ""


@rule("ws.same_inode", source=WORKSPACE, area="workspace", expected=lambda s: s.expected_inode,
      moments=("before", "running"),
      when=lambda s: s.expected_inode is not None and _listed(s),
      when_doc="when the inode at creation is known and the listing was recorded")
def same_inode(s: WorkspaceSubject) -> Verdict:
    """The workspace folder has the inode it had when this run created it.

    A folder replaced at the same path (with files in it, or a link) is not the one proven empty.
    """
    inode = s.listing.get("inode")
    ok = inode == s.expected_inode
    return ok, inode, "" if ok else "the workspace folder was replaced"
