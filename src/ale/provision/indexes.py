"""Package indexes asked by name: a declared name that is a Debian package, or a PyPI
project with a wheel for the image's interpreter, needs no catalogue entry.

The order of resolution (``needs._Merge.name``): the catalogue first (names that differ
from their packages, names no package provides, names an index must not decide), then
Debian's index, then PyPI's. What an index provides is recorded as such (``Need.source``
``debian-index`` / ``pypi-index``, with the version found), so a listing and the
environment's evidence say that a name was matched by spelling, not by a curated entry.

The indexes are the ordinary clients as this machine has them configured: ``apt-cache``
(Debian 12's lists, the tools image's release) and ``pip index versions`` restricted to
wheels for the image's interpreter and platform (an sdist-only project is not matched:
it would need a build). Answers are cached on disk for a day
(``<cache>/package-indexes.json``); ``ALE_PACKAGE_INDEXES=off`` turns the look-ups off
(an offline machine: the names stay missing, saying so). Hand-written rather than
python-apt or pip's internals: those are not stable APIs, and both clients' answers
are one line to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from packaging.utils import canonicalize_name

from ale.paths import cache_dir

DEBIAN_INDEX = "debian-index"
PYPI_INDEX = "pypi-index"
# The tools image's platform: a wheel must install there.
WHEEL_PLATFORM = "manylinux2014_x86_64"
CACHE_TTL_S = 24 * 3600
_LOOKUP_TIMEOUT_S = 60.0
_DEBIAN_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_PYPI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_PIP_LATEST = re.compile(r"^\S+ \(([^)]+)\)", re.M)


@dataclass(frozen=True)
class Found:
    """A package an index has under the asked name: which index, the package's own
    name there, and its version."""

    source: str
    package: str
    version: str


class PackageIndexes(Protocol):
    """What the resolver asks: a Debian package of exactly that name, a PyPI project
    with a wheel for ``python``. None when there is none (or the index cannot be asked:
    ``unavailable`` then says why)."""

    unavailable: str | None

    def debian(self, name: str) -> Found | None: ...

    def pypi_wheel(self, name: str, python: str) -> Found | None: ...


def debian_name(text: str) -> str | None:
    """``"Wireshark"`` → ``wireshark``, ``"GNU Octave"`` → ``gnu-octave``; None when the
    text cannot be a Debian package name."""
    n = re.sub(r"\s+", "-", text.strip().lower())
    return n if _DEBIAN_NAME.match(n) else None


def pypi_name(text: str) -> str | None:
    """The canonical PyPI project name the text spells (``"PyOgrio"`` → ``pyogrio``), or None."""
    t = text.strip()
    return canonicalize_name(t) if _PYPI_NAME.match(t) else None


class SystemIndexes:
    """``apt-cache`` and ``pip index versions``, cached on disk."""

    def __init__(self, cache_file: Path | None = None) -> None:
        self.cache_file = cache_file or cache_dir() / "package-indexes.json"
        self._cache: dict[str, list] | None = None
        off = os.environ.get("ALE_PACKAGE_INDEXES", "").lower() in ("off", "0", "no")
        self.unavailable: str | None = "ALE_PACKAGE_INDEXES=off" if off else None

    # -- the disk cache ------------------------------------------------------------
    def _load(self) -> dict[str, list]:
        if self._cache is None:
            try:
                doc = json.loads(self.cache_file.read_text())
                self._cache = doc if isinstance(doc, dict) else {}
            except (OSError, ValueError):
                self._cache = {}
        return self._cache

    def _cached(self, key: str) -> tuple[bool, Found | None]:
        hit = self._load().get(key)
        if not isinstance(hit, list) or len(hit) != 2 or time.time() - float(hit[0]) > CACHE_TTL_S:
            return False, None
        return True, (Found(**hit[1]) if isinstance(hit[1], dict) else None)

    def _store(self, key: str, found: Found | None) -> None:
        cache = self._load()
        cache[key] = [time.time(), found.__dict__ if found else None]
        with contextlib.suppress(OSError):
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache))
            tmp.replace(self.cache_file)

    # -- the look-ups --------------------------------------------------------------
    def debian(self, name: str) -> Found | None:
        if self.unavailable:
            return None
        key = f"debian:{name}"
        hit, found = self._cached(key)
        if hit or shutil.which("apt-cache") is None:
            return found
        try:
            r = subprocess.run(["apt-cache", "show", "--no-all-versions", name], capture_output=True, text=True,
                               timeout=_LOOKUP_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        version = next((ln.split(":", 1)[1].strip() for ln in r.stdout.splitlines() if ln.startswith("Version:")), None)
        # A virtual package (provided by others) has no record of its own: not matched.
        pkg = next((ln.split(":", 1)[1].strip() for ln in r.stdout.splitlines() if ln.startswith("Package:")), None)
        found = Found(DEBIAN_INDEX, name, version) if r.returncode == 0 and version and pkg == name else None
        self._store(key, found)
        return found

    def pypi_wheel(self, name: str, python: str) -> Found | None:
        if self.unavailable:
            return None
        key = f"pypi:{python}:{name}"
        hit, found = self._cached(key)
        if hit:
            return found
        argv = [sys.executable, "-m", "pip", "index", "versions", name, "--only-binary=:all:",
                f"--python-version={python}", f"--platform={WHEEL_PLATFORM}", "--implementation=cp",
                "--disable-pip-version-check"]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=_LOOKUP_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = _PIP_LATEST.search(r.stdout)
        found = Found(PYPI_INDEX, name, m.group(1)) if r.returncode == 0 and m else None
        # Only a definite answer is cached: an unreachable index is asked again next time.
        if found is not None or "No matching distribution" in r.stderr:
            self._store(key, found)
        return found


class NoIndexes:
    """No index is asked (tests of the catalogue alone; an offline listing)."""

    unavailable: str | None = "no package index is asked here"

    def debian(self, name: str) -> Found | None:
        return None

    def pypi_wheel(self, name: str, python: str) -> Found | None:
        return None


def default_indexes() -> PackageIndexes:
    return SystemIndexes()
