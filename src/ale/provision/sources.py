"""Where needs are stated besides the card's ``software`` list: the ``environment`` block
of ale's own task cards, a variant's ``input/runtime_env/`` manifests, and an
operator's overlay file. Each is parsed and validated here; ``needs.py`` merges them.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ale.provision.catalogue import Entry, check_debian_names, check_requirements


class ProvisionError(ValueError):
    """A source of needs is malformed; the message names the file (and the key)."""


_VERSION = re.compile(r"^[0-9]+(\.[0-9]+){0,2}$")


def _errors(e: ValidationError) -> str:
    out = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        out.append(f"{where}: {msg}" if where else msg)
    return "; ".join(out)


class _Packages(BaseModel):
    """Packages stated directly (an ``environment`` block, an overlay rule): Debian
    names and PEP 508 requirements, each checked when read."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    debian: list[str] = Field(default_factory=list)
    python: list[str] = Field(default_factory=list)
    store_only: list[str] = Field(default_factory=list)

    @field_validator("debian")
    @classmethod
    def _debian(cls, v: list[str]) -> list[str]:
        return check_debian_names(v)

    @field_validator("python", "store_only")
    @classmethod
    def _python(cls, v: list[str]) -> list[str]:
        return check_requirements(v)


# -- the environment block of ale's own task cards ------------------------------------
class EnvironmentBlock(_Packages):
    """``task_card.json``'s ``environment``: what the task's image must hold, stated
    explicitly (no catalogue involved)::

        "environment": {
          "debian": ["bedtools"],            # Debian 12 packages
          "python": ["pandas>=2"],           # installed into the default python3
          "store_only": ["polars"],          # only kept in the offline package store
          "python_version": "3.11",          # the interpreter the task needs
          "lockfile": "env/uv.lock",         # (or a list) manifests for the store, under the task folder
          "image": "registry/x:tag"          # or: a ready image, instead of all the above
        }

    Unknown keys are refused.
    """

    python_version: str | None = None
    lockfile: str | list[str] | None = None
    image: str | None = None

    @field_validator("python_version")
    @classmethod
    def _pyver(cls, v: str | None) -> str | None:
        if v is not None and not _VERSION.match(v):
            raise ValueError(f"{v!r} is not a Python version like 3.11")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c.isspace() for c in v)):
            raise ValueError(f"{v!r} is not an image reference")
        return v

    @property
    def lockfiles(self) -> list[str]:
        if self.lockfile is None:
            return []
        return [self.lockfile] if isinstance(self.lockfile, str) else list(self.lockfile)


def parse_environment_block(raw: dict[str, Any], card_path: Path) -> EnvironmentBlock | None:
    """The card's ``environment`` block, validated (None: the card has none).

    Raises ``ProvisionError`` naming the card and the offending key.
    """
    block = raw.get("environment")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ProvisionError(f"{card_path}: environment must be an object, got {type(block).__name__}")
    unknown = sorted(set(block) - set(EnvironmentBlock.model_fields))
    if unknown:
        known = ", ".join(EnvironmentBlock.model_fields)
        raise ProvisionError(f"{card_path}: environment: unknown key {unknown[0]!r} (known: {known})")
    try:
        env = EnvironmentBlock.model_validate(block)
    except ValidationError as e:
        raise ProvisionError(f"{card_path}: environment.{_errors(e)}") from None
    if env.image is not None:
        others = [k for k in ("debian", "python", "store_only", "python_version", "lockfile") if k in block]
        if others:
            raise ProvisionError(f"{card_path}: environment: image names a ready image; it cannot be combined with "
                                 f"{', '.join(others)}")
    return env


def read_task_lockfile(task_dir: Path, rel: str, card_path: Path) -> tuple[str, str]:
    """(file name, text) of a lock file the environment block names, which must lie
    inside the task folder."""
    root = task_dir.resolve()
    p = (root / rel).resolve()
    if not p.is_relative_to(root):
        raise ProvisionError(f"{card_path}: environment.lockfile {rel!r} leaves the task folder")
    try:
        return p.name, p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProvisionError(f"{card_path}: environment.lockfile {rel!r}: {e}") from None


# -- a variant's input/runtime_env/ manifests -------------------------------------------
RUNTIME_ENV = "runtime_env"
MANIFESTS = ("requirements.txt", "pyproject.toml", "uv.lock")


class Manifest(BaseModel):
    """One manifest file: its requirements (for the store), a note on anything the
    store cannot honour, and its text (a ``LockFile`` for the builder)."""

    model_config = ConfigDict(frozen=True)
    name: str
    origin: str
    text: str
    requirements: list[str] = Field(default_factory=list)
    requires_python: str | None = None
    packages: int = 0
    problems: list[str] = Field(default_factory=list)


def _requirements_txt(text: str) -> tuple[list[str], list[str]]:
    reqs, problems = [], []
    joined = re.sub(r"\\\n", " ", text)
    for n, line in enumerate(joined.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if not line:
            continue
        if line.startswith("-"):
            problems.append(f"line {n}: option {line.split()[0]!r} is not followed (only requirements are read)")
            continue
        line = re.sub(r"\s--hash[= ]\S+", "", line).strip()
        try:
            reqs.append(str(Requirement(line)))
        except InvalidRequirement as e:
            problems.append(f"line {n}: {line!r} is not a requirement ({e})")
    return reqs, problems


def _pyproject(text: str) -> tuple[list[str], str | None, list[str]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return [], None, [f"invalid TOML: {e}"]
    project = data.get("project")
    if not isinstance(project, dict):
        project = {}
    found: list[Any] = list(project.get("dependencies") or [])
    groups = data.get("dependency-groups")
    if isinstance(groups, dict):  # uv sync installs the dev group by default; keep them all in the store
        for items in groups.values():
            found.extend(x for x in (items or []) if isinstance(x, str))
    reqs, problems = [], []
    for r in found:
        try:
            reqs.append(str(Requirement(str(r))))
        except InvalidRequirement as e:
            problems.append(f"{r!r} is not a requirement ({e})")
    rp = project.get("requires-python")
    return reqs, rp if isinstance(rp, str) else None, problems


def _uv_lock(text: str) -> tuple[int, list[str]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return 0, [f"invalid TOML: {e}"]
    pkgs = data.get("package")
    return (len(pkgs) if isinstance(pkgs, list) else 0), []


def read_runtime_env(input_dir: Path, origin_prefix: str = "input") -> list[Manifest]:
    """The manifests in ``input_dir/runtime_env/`` (none when the folder is absent)."""
    folder = input_dir / RUNTIME_ENV
    out: list[Manifest] = []
    if not folder.is_dir():
        return out
    for name in MANIFESTS:
        p = folder / name
        if not p.is_file():
            continue
        origin = f"{origin_prefix}/{RUNTIME_ENV}/{name}"
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            out.append(Manifest(name=name, origin=origin, text="", problems=[f"cannot read: {e}"]))
            continue
        if name == "requirements.txt":
            reqs, problems = _requirements_txt(text)
            out.append(Manifest(name=name, origin=origin, text=text, requirements=reqs, problems=problems))
        elif name == "pyproject.toml":
            reqs, rp, problems = _pyproject(text)
            out.append(Manifest(name=name, origin=origin, text=text, requirements=reqs, requires_python=rp,
                                problems=problems))
        else:
            n, problems = _uv_lock(text)
            out.append(Manifest(name=name, origin=origin, text=text, packages=n, problems=problems))
    return out


# -- the operator's overlay -------------------------------------------------------------
class OverlayRule(_Packages):
    """Extra needs for the tasks a rule applies to: free-form ``software`` names (through
    the catalogue), or packages stated directly; ``image`` replaces the built image."""

    software: list[str] = Field(default_factory=list)
    image: str | None = None


class Overlay(BaseModel):
    """An operator's file of needs that task files do not state (ALE's task files run
    unchanged)::

        all:                          # every task
          python: [rich]
        tasks:                        # a glob over the task's path (any trailing part of it)
          "life_sciences/rgi_*": {software: [RGI]}
          "ff5_public_reconstruction": {debian: [chromium]}
        mappings:                     # name → packages: extends (and overrides) the catalogue
          GrowthBook: {python: [growthbook], check: "python3 -c 'import growthbook'"}
          Nextflow: {unavailable: {kind: unpackaged, why: "..."}}
        python_versions: ["3.12"]     # interpreters the image builder provides
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    all: OverlayRule | None = None
    tasks: dict[str, OverlayRule] = Field(default_factory=dict)
    mappings: dict[str, dict[str, Any]] = Field(default_factory=dict)
    python_versions: list[str] = Field(default_factory=list)
    path: str = ""

    def entries(self) -> list[Entry]:
        out = []
        for name, body in self.mappings.items():
            if not isinstance(body, dict):
                raise ProvisionError(f"{self.path}: mappings.{name}: must be an object")
            try:
                out.append(Entry.model_validate({**body, "name": name}))
            except ValidationError as e:
                raise ProvisionError(f"{self.path}: mappings.{name}.{_errors(e)}") from None
        return out

    def rules_for(self, task_dir: Path) -> list[tuple[str, OverlayRule]]:
        """(label, rule) for every rule that applies to ``task_dir``, ``all`` first."""
        out: list[tuple[str, OverlayRule]] = []
        if self.all is not None:
            out.append(("all", self.all))
        resolved = Path(task_dir).resolve()
        parts = resolved.parts[1:]
        candidates = [resolved.as_posix(), *("/".join(parts[i:]) for i in range(len(parts)))]
        for pattern, rule in self.tasks.items():
            pat = pattern.rstrip("/")
            if any(fnmatch.fnmatchcase(c, pat) for c in candidates):
                out.append((f"tasks[{pattern}]", rule))
        return out


def parse_overlay(data: Any, where: str) -> Overlay:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProvisionError(f"{where}: an overlay must be a mapping, got {type(data).__name__}")
    try:
        ov = Overlay.model_validate({**data, "path": where})
    except ValidationError as e:
        raise ProvisionError(f"{where}: {_errors(e)}") from None
    for v in ov.python_versions:
        if not _VERSION.match(v):
            raise ProvisionError(f"{where}: python_versions: {v!r} is not a version like 3.12")
    ov.entries()  # validate the mappings now, naming the file
    return ov


def load_overlay(path: str | Path) -> Overlay:
    """Read an overlay file (YAML or JSON), validated; ``ProvisionError`` names it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProvisionError(f"{p}: cannot read the overlay: {e}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ProvisionError(f"{p}: invalid {'JSON' if p.suffix == '.json' else 'YAML'}: {e}") from None
    return parse_overlay(data, str(p))
