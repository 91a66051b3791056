"""Copy what the agent left in the workspace out, on the host, never following links.

Whatever the candidate left there, ``extract_deliverables`` returns a manifest
and never raises because of it: every entry it meets is either copied
(``files``, ``directories``) or recorded in ``skipped`` with the reason. Only a
failure to *write* the copy (the host's disk, not the workspace) raises
``DeliverablesWriteError``.

What is copied: regular files, neither setuid nor setgid, within the caps; each
is hashed while it is copied and keeps the permission bits (and, as root, the
owner) the candidate gave it. A file with several names (hard links) is copied
under each of them: the workspace is its own mount in the sandbox, so every name
of such a file lies inside it (link(2) never crosses mounts), and its content is
the candidate's own, as ``ln`` or ``cp -al`` leave it. Folders are recreated
(mode 0755). A symlink to a regular file inside the workspace (relative, or
absolute under the workspace's mount point) is copied as that file, resolved on
the workspace's own tree one real folder at a time. What is skipped, and why:
every other symlink (out of the workspace, to a folder or another link; never
followed), FIFOs, sockets, devices, setuid/setgid files, unreadable entries (each
OSError is the entry's), and everything past a limit.

Limits (all recorded in the manifest's ``limits``):

- ``max_files`` copied files and ``max_bytes`` copied bytes. A file is refused
  *before it is read* when its apparent size (``st_size``) exceeds what is left
  of ``max_bytes``: a sparse 100 GB file costs nothing.
- ``max_depth`` folder levels (a folder deeper than that is skipped, unvisited).
- ``max_entries`` entries looked at (lstat'ed), whatever they are: ten million
  empty folders cannot keep the harness busy. A folder whose listing goes past
  the budget is recorded in ``skipped`` too, its remaining entries unvisited.
- ``time_limit_s`` of wall-clock time (default 120 s), checked per entry and per
  MiB copied; what is left when it passes is skipped with "time limit".
- Paths: the walk holds one directory descriptor per level (openat), so depth
  and PATH_MAX never matter on the workspace side; a copy whose path would not
  fit PATH_MAX under the destination *or under any folder it will be copied or
  read under later* (``also_under``: the grader's working copy, the output
  folder in the grading sandbox) is skipped ("path too long"): one budget for
  every copy the harness makes.
- Holes stay holes (``ale.grading.copying``): a sparse file's copy takes the
  disk its data takes; its apparent size counts against ``max_bytes``.

Names are recorded losslessly (``ale.lossless``): ``path`` is the exact
relative path when it is valid UTF-8; otherwise it is the display form (each
undecodable byte written ``\\xNN``) and ``path_b64`` holds the exact bytes. A
name that is not valid UTF-8 or holds a backslash cannot be kept as a file name
in the signed run folder; such an entry is stored under a safe name
(``_ale-name-<sha256 of the name, 16 hex>``, unique in its folder) and
``stored_as`` says where, relative to the deliverables folder. So is a name the
run folder would fold (case, Unicode normalization: probed on the destination)
onto a name kept before it in the same folder, and one whose creation finds its
name taken all the same. The listing
``digest`` is over the stored paths, i.e. over the tree the grader reads.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import time
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from ale.data.hashing import tree_digest
from ale.grading.copying import CopyLimit, CopyWriteError, SourceReadError, copy_keeping_holes
from ale.lossless import name_fields

DEFAULT_MAX_DEPTH = 256
DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_TIME_LIMIT_S = 120.0
PATH_MAX = 4096  # Linux: bytes of a path including its terminating NUL
SAFE_NAME_PREFIX = "_ale-name-"


class DeliverablesWriteError(OSError):
    """The copy could not be written on the host (disk full, permissions of the
    run folder): the harness's failure, not the candidate's."""


class DeliverableFile(BaseModel):
    """A copied file. ``path`` (and ``path_b64``) name it in the workspace;
    ``stored_as`` is where the copy is, when not at ``path``."""

    model_config = ConfigDict(extra="forbid")
    path: str
    size: int
    sha256: str
    mode: int | None = None  # the permission bits the candidate gave it (kept on the copy)
    path_b64: str | None = None  # the exact bytes of the path, when it is not valid UTF-8
    stored_as: str | None = None  # relative to deliverables/, when the copy is not at `path`

    @property
    def stored_path(self) -> str:
        return self.stored_as or self.path


class DeliverableDir(BaseModel):
    """A folder recreated in the copy (its mode is the candidate's; the copy's is 0755)."""

    model_config = ConfigDict(extra="forbid")
    path: str
    mode: int | None = None
    path_b64: str | None = None
    stored_as: str | None = None


class SkippedEntry(BaseModel):
    """An entry that was not copied, and why. ``kind`` is what lstat said it is
    (file, dir, symlink, fifo, socket, char-device, block-device, other) or None
    when it could not be looked at."""

    model_config = ConfigDict(extra="forbid")
    path: str
    reason: str
    path_b64: str | None = None
    kind: str | None = None
    size: int | None = None  # st_size, for files refused by size
    #: The copy limit that kept it out (files, bytes, entries, depth, time, path);
    #: None when its kind or state did.
    limit: str | None = None


class DeliverableLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_files: int
    max_bytes: int
    max_depth: int
    max_entries: int
    time_limit_s: float
    max_path_bytes: int  # the longest relative path a copy may have under the destination


class DeliverablesManifest(BaseModel):
    """``deliverables.json``. The fields after ``digest`` were added later and
    default to what a run folder of an earlier version implies."""

    model_config = ConfigDict(extra="forbid")
    files: list[DeliverableFile]
    skipped: list[SkippedEntry]
    total_bytes: int
    digest: str  # sha256 over the sorted (stored path, sha256, size) listing
    directories: list[DeliverableDir] = []
    limits: DeliverableLimits | None = None
    entries_visited: int | None = None
    stopped: str | None = None  # why the walk ended early ("time limit", "entry limit"), None if it did not
    seconds: float | None = None
    folding: dict[str, bool] | None = None  # how the run folder compares names (``probe_folding``)


def listing_digest(files: list[DeliverableFile]) -> str:
    """The tree digest every hashed listing in ale uses (input, reference, deliverables),
    over the paths the copies are stored at."""
    return tree_digest({f.stored_path: {"sha256": f.sha256, "size": f.size} for f in files})


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "char-device"), (stat.S_ISBLK, "block-device"),
    ):
        if test(mode):
            return name
    return "other"


def _needs_safe_name(raw: bytes) -> bool:
    if b"\\" in raw:
        return True
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _safe_name(raw: bytes, taken: set[bytes]) -> bytes:
    base = SAFE_NAME_PREFIX + hashlib.sha256(raw).hexdigest()[:16]
    name, n = base.encode(), 1
    while name in taken:
        n += 1
        name = f"{base}-{n}".encode()
    return name


_T = TypeVar("_T")


@dataclass(frozen=True)
class Folding:
    """How the run folder compares names: whether it folds case (macOS, ext4 casefold,
    a Windows share) and Unicode normalization (APFS, ext4 casefold), as probed
    (``probe_folding``). Names that fold to the same key cannot both be kept there."""

    case: bool = False
    unicode: bool = False

    def key(self, name: bytes) -> bytes:
        if not (self.case or self.unicode):
            return name
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            return name
        # Wider than any one file system folds: a name kept under a safe name more
        # than needed costs nothing; two names on one file cost the copy.
        text = unicodedata.normalize("NFKD", text)
        if self.case:
            text = unicodedata.normalize("NFKD", text.casefold())
        return text.encode("utf-8")

    def to_dict(self) -> dict[str, bool]:
        return {"case": self.case, "unicode": self.unicode}


_PROBE = "_ale-fold-probe-"


def probe_folding(dir_fd: int) -> Folding:
    """Whether the folder open as ``dir_fd`` (the harness's own, empty) folds case or
    Unicode normalization: a probe file is made under one spelling and looked up
    under another, then removed."""

    def folds(made: str, looked_up: str) -> bool:
        try:
            fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        except OSError:
            return False
        os.close(fd)
        try:
            os.stat(looked_up, dir_fd=dir_fd, follow_symlinks=False)
            return True
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(made, dir_fd=dir_fd)

    return Folding(case=folds(_PROBE + "Aa", _PROBE + "aA"),
                   unicode=folds(_PROBE + "\u00e9", _PROBE + "e\u0301"))


def _strerror(e: BaseException) -> str:
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    return f"{type(e).__name__}: {e}"


#: Folder names agents fill with tools, not answers (besides any hidden folder).
BULKY_FOLDERS = frozenset({b"node_modules", b"__pycache__", b"site-packages", b"dist-packages", b"venv", b"env",
                           b"envs", b"conda", b"miniconda3", b"anaconda3", b"micromamba", b"cache", b"target"})


def _bulky(name: bytes) -> bool:
    """A folder visited after its ordinary siblings: hidden, or a tool's."""
    return name.startswith(b".") or name.lower() in BULKY_FOLDERS


@dataclass
class _Frame:
    """One folder being walked: its descriptor and the entries still to handle."""

    fd: int
    rel: bytes  # relative path in the workspace ("" for the root)
    stored: bytes  # relative path of its copy
    depth: int  # the root is 0; its entries are at depth 1
    entries: list[tuple[bytes, bytes]] = field(default_factory=list)  # (name, stored name), in order


@dataclass(frozen=True)
class _Abandoned:
    """Why a file's copy was given up part way; ``limit`` names the copy limit, if one."""

    reason: str
    limit: str | None = None


class _Extractor:
    def __init__(self, dest_fd: int, limits: DeliverableLimits, owner: tuple[int, int] | None, deadline: float,
                 mount_point: bytes | None = None):
        self.dest_fd = dest_fd
        self.root_fd = -1
        self.mount_point = mount_point.rstrip(b"/") if mount_point else None
        self.limits = limits
        self.owner = owner
        self.deadline = deadline
        self.files: list[DeliverableFile] = []
        self.dirs: list[DeliverableDir] = []
        self.skipped: list[SkippedEntry] = []
        self.total = 0
        self.visited = 0
        self.timed_out = False
        self.entry_limited = False
        self.folding: Folding = Folding()

    def fold(self, name: bytes) -> bytes:
        """The name as the run folder compares names (see ``Folding``)."""
        return self.folding.key(name)

    # -- recording ------------------------------------------------------------
    def skip(self, rel: bytes, reason: str, kind: str | None = None, size: int | None = None,
             limit: str | None = None) -> None:
        path, b64 = name_fields(rel or b".")
        self.skipped.append(SkippedEntry(path=path, path_b64=b64, reason=reason, kind=kind, size=size, limit=limit))

    def out_of_time(self) -> bool:
        if not self.timed_out and time.monotonic() > self.deadline:
            self.timed_out = True
        return self.timed_out

    @property
    def stopped(self) -> str | None:
        return "time limit" if self.timed_out else "entry limit" if self.entry_limited else None

    @property
    def time_reason(self) -> str:
        return f"time limit of {self.limits.time_limit_s:g} s reached: not visited"

    # -- listing ----------------------------------------------------------------
    def list_dir(self, frame: _Frame) -> None:
        """Read the folder's names (within the entry budget), choose each one's stored name."""
        budget = self.limits.max_entries - self.visited
        names: list[bytes] = []
        folders: set[bytes] = set()
        more = False
        with os.scandir(frame.fd) as it:
            for i, entry in enumerate(it):
                if len(names) >= budget:
                    more = True
                    break
                if i % 1024 == 1023 and self.out_of_time():
                    more = True
                    break
                names.append(os.fsencode(entry.name))
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        folders.add(names[-1])
        self.visited += len(names)
        # A folder's own files before its subfolders, and hidden or tool folders
        # (.conda_env, node_modules, a venv, a cache) after the others, each group by
        # name: when a cap is reached, what an environment holds gives way to the
        # answers beside it, wherever they sort.
        names.sort(key=lambda n: (n in folders, n in folders and _bulky(n), n))
        # A name keeps its name unless it cannot be a file name in the signed folder, or
        # the run folder folds it (case, Unicode) onto a name kept before it in this order.
        kept: set[bytes] = set()  # the kept names, as the run folder compares them
        keep = []
        for n in names:
            key = self.fold(n)
            ok = not _needs_safe_name(n) and key not in kept
            if ok:
                kept.add(key)
            keep.append(ok)
        for n, ok in zip(names, keep, strict=True):
            if ok:
                frame.entries.append((n, n))
            else:
                s = _safe_name(n, kept)
                kept.add(s)
                frame.entries.append((n, s))
        frame.entries.reverse()  # popped from the end, so handled in sorted order
        if more:
            if self.timed_out:
                why, limit = self.time_reason.replace("not visited", "the rest of this folder was not visited"), "time"
            else:
                self.entry_limited = True
                why, limit = (f"entry limit of {self.limits.max_entries} reached: the rest of this folder was not "
                              "visited"), "entries"
            self.skip(frame.rel, why, kind="dir", limit=limit)

    # -- one entry ------------------------------------------------------------------
    def handle(self, frame: _Frame, name: bytes, stored_name: bytes) -> _Frame | None:
        """Copy or skip one entry; a folder to descend into is returned as a new frame."""
        rel = frame.rel + b"/" + name if frame.rel else name
        stored = frame.stored + b"/" + stored_name if frame.stored else stored_name
        try:
            st = os.stat(name, dir_fd=frame.fd, follow_symlinks=False)
        except OSError as e:
            self.skip(rel, f"cannot stat: {_strerror(e)}")
            return None
        kind = _kind(st.st_mode)
        if len(stored) > self.limits.max_path_bytes:
            self.skip(rel, f"path too long: its copy would need {len(stored)} bytes under the deliverables "
                           f"folder and the copies made of it, the limit is {self.limits.max_path_bytes}",
                      kind=kind, limit="path")
            return None
        if kind == "dir":
            return self.enter(frame, name, rel, stored, st)
        src_dir, src_name = frame.fd, name
        if kind == "symlink":
            target = self._link_inside(rel, name, frame.fd)
            if target is None:
                self.skip(rel, "symlink", kind=kind)
                return None
            src_dir, src_name, st, kind = target
        reason, limit = None, None
        if kind != "file":
            reason = f"not a regular file ({kind})"
        elif st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            reason = "setuid/setgid"
        elif len(self.files) >= self.limits.max_files:
            reason, limit = f"file count cap of {self.limits.max_files} reached", "files"
        elif self.total + st.st_size > self.limits.max_bytes:
            reason, limit = f"total size cap of {self.limits.max_bytes} bytes reached", "bytes"
        if reason:
            self.skip(rel, reason, kind=kind, size=st.st_size if kind == "file" else None, limit=limit)
            return None
        try:
            self.copy(src_dir, src_name, rel, stored, st)
        finally:
            if src_dir != frame.fd:
                os.close(src_dir)
        return None

    def _link_inside(self, rel: bytes, name: bytes, dir_fd: int) -> tuple[int, bytes, os.stat_result, str] | None:
        """A symlink to a regular file inside the workspace, as its target: (the
        target's folder fd, its name, its stat, its kind), else None (the link is
        skipped). Relative targets, and absolute ones under the workspace's mount
        point in the sandbox, are resolved on the workspace's own tree, one real
        folder at a time (no link followed further): a link can never reach out of
        the workspace (on ALE's VM, ``answer.json -> ../reference/answer.json``
        dangles during the run and resolves to the reference at grading)."""
        try:
            text = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            return None
        text = os.fsencode(text)
        if text.startswith(b"/"):
            if self.mount_point is None or not (text == self.mount_point or text.startswith(self.mount_point + b"/")):
                return None
            joined = text[len(self.mount_point):].lstrip(b"/")
        else:
            parent = rel.rpartition(b"/")[0]
            joined = parent + b"/" + text if parent else text
        norm = os.path.normpath(joined)
        if norm in (b".", b"..") or norm.startswith((b"../", b"/")) or self.root_fd < 0:
            return None
        *folders, leaf = norm.split(b"/")
        fd = os.dup(self.root_fd)
        try:
            for part in folders:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NOCTTY, dir_fd=fd)
                os.close(fd)
                fd = nxt
            st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
        except OSError:
            os.close(fd)
            return None
        kind = _kind(st.st_mode)
        if kind != "file":  # a link to a folder, to another link, to a FIFO...: never followed
            os.close(fd)
            return None
        return fd, leaf, st, kind

    def enter(self, frame: _Frame, name: bytes, rel: bytes, stored: bytes, st: os.stat_result) -> _Frame | None:
        if frame.depth + 1 > self.limits.max_depth:
            self.skip(rel, f"depth limit of {self.limits.max_depth} reached: not visited", kind="dir", limit="depth")
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NOCTTY, dir_fd=frame.fd)
        except OSError as e:
            self.skip(rel, f"unreadable directory: {_strerror(e)}", kind="dir")
            return None
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode) or os.fstat(fd).st_ino != st.st_ino:
                raise _Changed
            try:
                self._mkdir(stored)
            except DeliverablesWriteError as e:
                if e.errno != errno.EEXIST:
                    raise
                stored, _ = self._fresh(rel, stored, self._mkdir)
            sub = _Frame(fd=fd, rel=rel, stored=stored, depth=frame.depth + 1)
            self.list_dir(sub)
        except _Changed:
            os.close(fd)
            self.skip(rel, "changed while copying", kind="dir")
            return None
        except DeliverablesWriteError:
            os.close(fd)
            raise
        except Exception as e:  # reading the listing failed: the folder's own problem
            os.close(fd)
            self.skip(rel, f"unreadable directory: {_strerror(e)}", kind="dir")
            return None
        path, b64 = name_fields(rel)
        self.dirs.append(DeliverableDir(path=path, path_b64=b64, mode=stat.S_IMODE(st.st_mode),
                                        stored_as=None if stored == rel else stored.decode()))
        return sub

    def copy(self, dir_fd: int, name: bytes, rel: bytes, stored: bytes, st: os.stat_result) -> None:
        try:
            src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
        except OSError as e:
            self.skip(rel, f"unreadable: {_strerror(e)}", kind="file", size=st.st_size)
            return
        try:
            fst = os.fstat(src)
            if not stat.S_ISREG(fst.st_mode) or fst.st_ino != st.st_ino or fst.st_dev != st.st_dev:
                self.skip(rel, "changed while copying", kind="file")
                return
            mode = stat.S_IMODE(st.st_mode)
            try:
                dst = self._create(stored)
            except DeliverablesWriteError as e:
                if e.errno != errno.EEXIST:
                    raise
                # The name collides in the run folder although the probe saw no folding
                # (a folder's own casefold attribute): the copy takes a safe name.
                stored, dst = self._fresh(rel, stored, self._create)
            try:
                outcome = self._copy_hashing(src, dst, self.limits.max_bytes - self.total)
                if not isinstance(outcome, _Abandoned):
                    self._keep_mode(dst, mode)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        if isinstance(outcome, _Abandoned):
            self._unlink(stored)
            self.skip(rel, outcome.reason, kind="file", size=st.st_size, limit=outcome.limit)
            return
        digest, size = outcome
        self.total += size
        path, b64 = name_fields(rel)
        self.files.append(DeliverableFile(path=path, path_b64=b64, size=size, sha256=digest, mode=mode,
                                          stored_as=None if stored == rel else stored.decode()))

    def _copy_hashing(self, src: int, dst: int, limit: int) -> tuple[str, int] | _Abandoned:
        """(sha256, size) of what was copied (holes kept as holes: ``ale.grading.copying``),
        or why the copy was abandoned."""
        h = hashlib.sha256()
        try:
            n = copy_keeping_holes(src, dst, budget=limit, hasher=h, out_of_time=self.out_of_time)
        except CopyLimit as e:
            if e.limit == "time":
                return _Abandoned(f"time limit of {self.limits.time_limit_s:g} s reached while copying", "time")
            return _Abandoned(f"total size cap of {self.limits.max_bytes} bytes reached", "bytes")
        except SourceReadError as e:
            return _Abandoned(f"read error: {_strerror(e)}")
        except CopyWriteError as e:
            raise DeliverablesWriteError(e.errno, f"cannot write the deliverables copy: {e.strerror}") from e
        return h.hexdigest(), n

    # -- the destination (ours: written only here, so paths are safe) -------------------
    def _mkdir(self, stored: bytes) -> None:
        try:
            os.mkdir(stored, 0o755, dir_fd=self.dest_fd)
            return None
        except OSError as e:
            raise DeliverablesWriteError(e.errno,
                                         f"cannot create {stored!r} in the deliverables copy: {e.strerror}") from e

    def _create(self, stored: bytes) -> int:
        try:
            return os.open(stored, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=self.dest_fd)
        except OSError as e:
            raise DeliverablesWriteError(e.errno,
                                         f"cannot create {stored!r} in the deliverables copy: {e.strerror}") from e

    def _fresh(self, rel: bytes, stored: bytes, make: Callable[[bytes], _T]) -> tuple[bytes, _T]:
        """``make`` under a safe name in the same folder, for an entry whose stored name
        turned out to be taken: (the stored path it got, what ``make`` returned)."""
        parent, _, _ = stored.rpartition(b"/")
        base = SAFE_NAME_PREFIX + hashlib.sha256(rel).hexdigest()[:16]
        for n in range(1, 101):
            name = (base if n == 1 else f"{base}-{n}").encode()
            candidate = parent + b"/" + name if parent else name
            try:
                return candidate, make(candidate)
            except DeliverablesWriteError as e:
                if e.errno != errno.EEXIST:
                    raise
        raise DeliverablesWriteError(errno.EEXIST, f"no free name for {rel!r} in the deliverables copy")

    def _unlink(self, stored: bytes) -> None:
        try:
            os.unlink(stored, dir_fd=self.dest_fd)
        except OSError as e:
            raise DeliverablesWriteError(e.errno,
                                         f"cannot remove {stored!r} from the deliverables copy: {e.strerror}") from e

    def _keep_mode(self, fd: int, mode: int) -> None:
        if self.owner is not None:
            try:
                os.fchown(fd, *self.owner)
            except OSError:
                mode |= 0o444  # not ours to give away: keep it readable by the grader instead
        else:
            mode |= 0o400  # the harness's own file: it must stay readable to hash, sign and verify
        try:
            os.fchmod(fd, mode & 0o777)
        except OSError as e:
            raise DeliverablesWriteError(e.errno, f"cannot set the mode of a deliverables copy: {e.strerror}") from e

    # -- the walk ---------------------------------------------------------------------
    def walk(self, root: _Frame) -> None:
        stack = [root]
        try:
            while stack:
                frame = stack[-1]
                if not frame.entries:
                    stack.pop()
                    if frame is not root:
                        os.close(frame.fd)
                    continue
                name, stored_name = frame.entries.pop()
                if self.out_of_time():
                    rel = frame.rel + b"/" + name if frame.rel else name
                    self.skip(rel, self.time_reason, limit="time")
                    continue
                try:
                    sub = self.handle(frame, name, stored_name)
                except DeliverablesWriteError:
                    raise
                except Exception as e:  # whatever the entry did, it is the entry's
                    rel = frame.rel + b"/" + name if frame.rel else name
                    self.skip(rel, f"not copied: {_strerror(e)}")
                    continue
                if sub is not None:
                    stack.append(sub)
        finally:
            for frame in stack:
                if frame is not root:
                    os.close(frame.fd)


class _Changed(Exception):
    pass


def path_budget(*bases: str | Path) -> int:
    """The longest relative path (bytes) a copy may have under every one of ``bases``
    and still fit ``PATH_MAX`` as an absolute path: one budget for every copy."""
    longest = max((len(os.fsencode(os.path.abspath(b))) for b in bases), default=0)
    return max(0, PATH_MAX - 1 - longest - 1)


def extract_deliverables(
    workspace: Path, dest: Path, *, max_files: int, max_bytes: int, owner: tuple[int, int] | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH, max_entries: int = DEFAULT_MAX_ENTRIES,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S, mount_point: str | None = None,
    also_under: Iterable[str | Path] = (),
) -> DeliverablesManifest:
    """Copy regular files from `workspace` into `dest` (which must not exist; its
    parent must) and return the manifest of what was copied and skipped.

    Never raises because of what the workspace holds (see the module doc); raises
    ``FileExistsError`` when `dest` exists and ``DeliverablesWriteError`` when the
    copy cannot be written. Each copy keeps the permission bits the candidate gave
    the file (setuid and setgid files are never copied) and, with ``owner`` (the
    candidate's uid:gid, when the harness may chown), its owner too: a grader
    running as the candidate user sees the files as the candidate left them (ALE
    graders check outputs made read-only, for one). Without ``owner`` the copy
    stays readable by the harness (owner-read is added). ``mount_point`` is where
    the workspace is mounted in the sandbox: a symlink whose absolute target lies
    under it is resolved inside the workspace like a relative one. ``also_under``
    names every other folder the copy will be read or copied under (the grader's
    working copy, the output folder in the grading sandbox): one path budget, for
    the longest of them and ``dest`` (``path_budget``), so what fits here fits there.
    The run folder is probed for case and Unicode folding (``probe_folding``): names
    it would fold onto one another are stored under safe names."""
    started = time.monotonic()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=False, mode=0o755)
    limits = DeliverableLimits(max_files=max_files, max_bytes=max_bytes, max_depth=max_depth,
                               max_entries=max_entries, time_limit_s=time_limit_s,
                               max_path_bytes=path_budget(dest, *also_under))
    dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    x = _Extractor(dest_fd, limits, owner, started + time_limit_s, os.fsencode(mount_point) if mount_point else None)
    x.folding = probe_folding(dest_fd)
    try:
        try:
            root_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            x.skip(b"", f"the workspace cannot be opened: {_strerror(e)}")
            root_fd = -1
        if root_fd >= 0:
            x.root_fd = root_fd
            root = _Frame(fd=root_fd, rel=b"", stored=b"", depth=0)
            try:
                x.list_dir(root)
                x.walk(root)
            except DeliverablesWriteError:
                raise
            except Exception as e:
                x.skip(b"", f"the workspace cannot be listed: {_strerror(e)}", kind="dir")
            finally:
                os.close(root_fd)
    finally:
        os.close(dest_fd)
    return DeliverablesManifest(
        files=x.files, skipped=x.skipped, total_bytes=x.total, digest=listing_digest(x.files),
        directories=x.dirs, limits=limits, entries_visited=x.visited, stopped=x.stopped,
        seconds=round(time.monotonic() - started, 4), folding=x.folding.to_dict(),
    )
