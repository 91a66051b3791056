"""The one way the harness copies a candidate's file: holes stay holes.

A sparse file costs the candidate nothing in its workspace (the watchdog counts
allocated blocks); copied byte by byte it would cost the run folder its apparent
size, once in the deliverables and again in the grader's working copy. Every copy
of a candidate's file goes through ``copy_keeping_holes``: the data regions are
found with ``SEEK_DATA``/``SEEK_HOLE`` and only they are written; the holes are
left as holes (``ftruncate`` to the apparent size), and read as zeros by whoever
reads the copy, the hash included. On a file system without ``SEEK_DATA`` the file
is read to its end as data.

The limits are the caller's: ``budget`` caps the apparent size (what a reader of
the copy sees, holes included), ``out_of_time`` is asked once per MiB (holes
included), and a hasher sees exactly the bytes a reader of the copy reads.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

CHUNK = 1 << 20
_ZEROS = bytes(CHUNK)


class CopyLimit(Exception):
    """The copy went past ``budget`` (``limit`` "bytes") or its time (``limit`` "time")."""

    def __init__(self, limit: str):
        super().__init__(limit)
        self.limit = limit


class SourceReadError(OSError):
    """Reading the source failed (the candidate's file: its problem, not the harness's)."""


class CopyWriteError(OSError):
    """Writing the copy failed (the host's disk: the harness's problem)."""


def _write_all(dst: int, data: bytes | memoryview, pos: int) -> None:
    view = memoryview(data)
    try:
        while view:
            n = os.pwrite(dst, view, pos)
            view, pos = view[n:], pos + n
    except OSError as e:
        raise CopyWriteError(e.errno, e.strerror) from e


def copy_keeping_holes(src: int, dst: int, *, budget: int | None = None, hasher: Any = None,
                       out_of_time: Callable[[], bool] | None = None) -> int:
    """Copy the open file ``src`` into the empty open file ``dst`` (both descriptors),
    holes kept; return the apparent size copied. Raises ``CopyLimit`` past ``budget``
    bytes or ``out_of_time()``, ``SourceReadError`` when ``src`` cannot be read,
    ``CopyWriteError`` when ``dst`` cannot be written."""
    pos = 0
    sparse = True

    def account(n: int) -> None:
        if budget is not None and pos + n > budget:
            raise CopyLimit("bytes")
        if out_of_time is not None and out_of_time():
            raise CopyLimit("time")

    while True:
        hole_end: int | None = None  # where the data region starting at pos ends (None: read to EOF)
        if sparse:
            try:
                data = os.lseek(src, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data at or past pos: a hole to the end
                    data = -1
                elif e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                    sparse, data = False, pos  # no SEEK_DATA here: everything is data
                else:
                    raise SourceReadError(e.errno, e.strerror) from e
            end = data if data >= 0 else _size(src)
            while pos < end:  # the hole [pos, end): zeros to a reader, nothing on disk
                n = min(CHUNK, end - pos)
                account(n)
                if hasher is not None:
                    hasher.update(_ZEROS[:n])
                pos += n
            if data < 0:
                break
            if sparse:
                try:
                    hole_end = os.lseek(src, pos, os.SEEK_HOLE)
                except OSError:
                    hole_end = None
        eof = False
        while hole_end is None or pos < hole_end:
            want = CHUNK if hole_end is None else min(CHUNK, hole_end - pos)
            try:
                chunk = os.pread(src, want, pos)
            except OSError as e:
                raise SourceReadError(e.errno, e.strerror) from e
            if not chunk:
                eof = True
                break
            account(len(chunk))
            if hasher is not None:
                hasher.update(chunk)
            _write_all(dst, chunk, pos)
            pos += len(chunk)
        if eof or not sparse:
            break
    try:
        os.ftruncate(dst, pos)  # a trailing hole, kept as one
    except OSError as e:
        raise CopyWriteError(e.errno, e.strerror) from e
    return pos


def _size(fd: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError as e:
        raise SourceReadError(e.errno, e.strerror) from e
