"""`ale data validate ROOT`: what a task author should fix before publishing a data root
(in either layout, see ale.data.roots)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from ale.data.base import VariantKey, check_layout
from ale.data.hashing import sha256_file
from ale.data.roots import candidates
from ale.data.sealing import ARCHIVE_NAME, MANIFEST_NAME

VARIANT_ENTRIES = {"input", "software", "reference", ARCHIVE_NAME, MANIFEST_NAME}
ROOT_EXTRAS = {"README.md", "README", "LICENSE", "LICENSE.md", ".gitattributes", ".gitignore"}
DEFAULT_HUGE_BYTES = 1024**3


class Problem(BaseModel):
    severity: Literal["error", "warning"]
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.path}: {self.message}"


def validate_root(
    root: Path,
    *,
    layout: str = "auto",
    require_sealed: bool = False,
    huge_bytes: int = DEFAULT_HUGE_BYTES,
    check_manifests: bool = True,
) -> list[Problem]:
    """Every problem in a data root, in the layouts `layout` names (ale.data.roots).

    "tasks" reads `<root>/tasks/<domain>/<task>/<variant>/...` only (other entries at
    the root are stray); "ale" reads `<root>/<domain>/<task>/<variant>/...`; "auto"
    reads both, a top-level `tasks/` being the tasks layout, and reports a variant
    under both layouts as an error (sources refuse it). Hidden entries at the root
    are never read and are reported as warnings. Raises DataError for an unknown
    layout; every other finding is a Problem.
    """
    choice = check_layout(layout, f"data root {root}")
    root = Path(root)
    out: list[Problem] = []

    def err(p: Path, msg: str) -> None:
        out.append(Problem(severity="error", path=str(p), message=msg))

    def warn(p: Path, msg: str) -> None:
        out.append(Problem(severity="warning", path=str(p), message=msg))

    if not root.is_dir():
        err(root, "data root not found")
        return out
    tasks = root / "tasks"
    domains: list[Path] = []
    if choice == "tasks" and (not tasks.is_dir() or tasks.is_symlink()):
        err(tasks, "missing tasks/ folder (layout: tasks/<domain>/<task>/<variant>/{input,software,reference})")
        return out
    for entry in sorted(root.iterdir()):
        name = entry.name
        if name in ROOT_EXTRAS:
            continue
        if name == "tasks" and choice in ("auto", "tasks"):
            if tasks.is_symlink() or not tasks.is_dir():
                err(tasks, "the tasks/ folder is a symbolic link or a file")
            else:
                domains.extend(sorted(tasks.iterdir()))
            continue
        if choice == "tasks":
            warn(entry, "stray entry at the data root (only tasks/ is read)")
        elif name.startswith("."):
            warn(entry, "hidden entry at the data root (never read)")
        elif entry.is_dir() and not entry.is_symlink():
            domains.append(entry)
        elif entry.is_symlink():
            err(entry, "symbolic link where a domain folder belongs")
        else:
            warn(entry, "stray entry at the data root (expected domain folders or tasks/)")
    found: dict[VariantKey, Path] = {}
    for domain in domains:
        if not _is_dir(domain, err, "domain"):
            continue
        task_dirs = sorted(domain.iterdir())
        if not task_dirs:
            warn(domain, "empty domain folder")
        for task in task_dirs:
            if not _is_dir(task, err, "task"):
                continue
            variants = sorted(task.iterdir())
            if not variants:
                warn(task, "task folder without variants")
            for variant in variants:
                if not _is_dir(variant, err, "variant"):
                    continue
                key = VariantKey(domain.name, task.name, variant.name)
                if key in found:
                    err(
                        variant,
                        f"variant {key.name} is under both layouts (also {found[key]}): sources refuse it; "
                        "remove one or choose a layout",
                    )
                found[key] = variant
                _check_variant(variant, require_sealed, huge_bytes, check_manifests, err, warn)
    if not found:
        looked = " and ".join(
            f"{root}/{'tasks/' if lay == 'tasks' else ''}<domain>/<task>/<variant>" for lay in candidates(choice)
        )
        err(root, f"no variants found (looked for {looked})")
    return out


def _is_dir(p: Path, err: object, level: str) -> bool:
    if p.is_symlink():
        err(p, f"symbolic link where a {level} folder belongs")  # type: ignore[operator]
        return False
    if not p.is_dir():
        err(p, f"stray file at the {level} level (expected only {level} folders here)")  # type: ignore[operator]
        return False
    return True


def _check_variant(v: Path, require_sealed: bool, huge: int, check_manifests: bool, err, warn) -> None:  # noqa: ANN001
    names = {p.name for p in v.iterdir()}
    for name in sorted(names - VARIANT_ENTRIES):
        warn(v / name,
             "stray entry in a variant folder (expected input/, software/, reference/ or reference.7z, manifest.json)")
    if "input" not in names:
        err(v / "input", "missing input folder")
    elif not (v / "input").is_dir() or (v / "input").is_symlink():
        err(v / "input", "input must be a folder")
    has_clear = "reference" in names
    has_archive = ARCHIVE_NAME in names
    if not has_clear and not has_archive:
        err(v / "reference", "missing reference (neither reference/ nor reference.7z)")
    if has_clear and require_sealed:
        if has_archive:
            err(v / "reference", "a clear reference/ sits next to reference.7z; remove it before publishing")
        else:
            err(v / "reference", "reference is not sealed (run `ale data seal`)")
    if has_archive and ((v / ARCHIVE_NAME).is_symlink() or not (v / ARCHIVE_NAME).is_file()):
        err(v / ARCHIVE_NAME, "reference.7z must be a regular file")
    for part in ("input", "software", "reference"):
        base = v / part
        if base.is_dir() and not base.is_symlink():
            for dirpath, dirnames, filenames in os.walk(base):
                for name in dirnames + filenames:
                    p = Path(dirpath) / name
                    st = p.lstat()
                    if stat.S_ISLNK(st.st_mode):
                        err(p, "symbolic link (data trees hold only regular files and folders)")
                    elif stat.S_ISREG(st.st_mode):
                        if st.st_size > huge:
                            warn(p, f"huge file: {st.st_size} bytes (threshold {huge})")
                    elif not stat.S_ISDIR(st.st_mode):
                        err(p, "special file (FIFO, socket or device)")
    if has_archive and (v / ARCHIVE_NAME).is_file() and (v / ARCHIVE_NAME).stat().st_size > huge:
        warn(v / ARCHIVE_NAME, f"huge file: {(v / ARCHIVE_NAME).stat().st_size} bytes (threshold {huge})")
    if check_manifests and MANIFEST_NAME in names:
        _check_manifest(v, err)


def _check_manifest(v: Path, err) -> None:  # noqa: ANN001
    path = v / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        err(path, f"not valid JSON: {exc}")
        return
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        err(path, "needs a 'files' object (relpath -> {sha256, size})")
        return
    for rel, entry in sorted(files.items()):
        target = v / rel
        if ".." in Path(rel).parts or rel.startswith("/"):
            err(path, f"entry {rel!r} points outside the variant")
            continue
        if not isinstance(entry, dict) or "sha256" not in entry or "size" not in entry:
            err(path, f"entry {rel!r} needs sha256 and size")
            continue
        if not target.is_file() or target.is_symlink():
            if rel.startswith("reference/") and (v / ARCHIVE_NAME).is_file():
                continue
            err(target, "listed in manifest.json but missing")
            continue
        digest, size = sha256_file(target)
        if digest != entry["sha256"] or size != entry["size"]:
            err(target,
                f"sha256 {digest} ({size} bytes) differs from manifest.json ({entry['sha256']}, {entry['size']} bytes)")
    archive = data.get("reference_archive")
    if isinstance(archive, dict) and (v / ARCHIVE_NAME).is_file():
        digest, _ = sha256_file(v / ARCHIVE_NAME)
        if digest != archive.get("sha256"):
            err(v / ARCHIVE_NAME,
                f"sha256 {digest} differs from manifest.json's reference_archive {archive.get('sha256')}")
    elif isinstance(archive, dict):
        err(v / ARCHIVE_NAME, "manifest.json records a reference archive, but reference.7z is missing")
