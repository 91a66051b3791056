"""Build a task environment image from a ``SoftwareSpec``, on the trusted side.

The image is the tools image plus, in this order (so that tasks with the same
Debian set share the first stage):

1. ``ale-env-system:<key>``: the spec's Debian packages (apt inside the build,
   ``--no-install-recommends``, lists cleaned), pip and venv for the default
   ``python3`` where it lacks them, ``uv``, and ``/etc/pip.conf`` and
   ``/etc/uv/uv.toml``, which point pip and uv at the package store (pip with no
   index, uv offline), uv's cache under ``/tmp`` and no Python downloads. Files, not
   image ENV: the sandbox's environment is allowlisted by the isolation checks (the
   one variable an image sets, ``UV_PROJECT_ENVIRONMENT``, is on the allowlist).
2. the package store ``/opt/ale/wheels``: wheels for the spec's ``python`` and
   ``store_only`` requirements with their dependencies, and the versions its lock
   files pin. They are downloaded on the host with the host's pip (the build
   container cannot verify PyPI's certificate here, the host's pip is configured
   for it), for the image's interpreter and platform, and copied in; then the
   ``python`` requirements are installed from the store, offline, into the default
   ``python3``; a task's uv project (one ``uv.lock``) is installed, as locked, into
   ``/opt/ale/uv-project``, which ``UV_PROJECT_ENVIRONMENT`` names (``uv_project``).
3. ``/opt/ale/software-record.json``: the record of what the image holds, taken by
   running the built image once with no network: the Debian package list, the
   default interpreter's Python packages, the store's files and digest. Its sha256
   is the image label ``org.ale.env.record-sha256``.

Cached by content: ``ale-env:<key12>`` with key = sha256(spec key, base image id,
this recipe). A second build is a lookup. An empty spec is the base image itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any

import docker
import docker.errors
from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, Field

from ale.paths import cache_dir
from ale.sandbox.base import LABEL_MANAGED, LABEL_ROLE, SandboxError
from ale.sandbox.image import (
    Say,
    _dir_digest,
    _has_image,
    _sha,
    bootstrap_base,
    build_tools_image,
    images_dir,
)
from ale.sandbox.releases import debian, ubuntu
from ale.sandbox.software import RECORD_LABEL, LockFile, SoftwareSpec

ENV_REPO = "ale-env"
#: The image's read-only uv project environment (see ``uv_project``) and the variable
#: that points uv at it (on the policy's environment allowlist).
UV_PROJECT_ENV = "/opt/ale/uv-project"
UV_PROJECT_VAR = "UV_PROJECT_ENVIRONMENT"
SYSTEM_REPO = "ale-env-system"
BUILDER_REPO = "ale-env-builder"
#: uv, from PyPI's ``uv`` wheel (which ships the binary); pinned so that the recipe,
#: hence the cache key, does not drift.
UV_VERSION = "0.13.9"
STORE = "/opt/ale/wheels"
RECORD_PATH = "/opt/ale/software-record.json"
#: Bump when the build changes in a way the files under images/env do not show.
RECIPE_VERSION = "3"  # 2: the uv project environment; 3: command shims, prepare
RECORD_ROLE = "env-record"
#: Interpreters other than the tools image's (Debian 12: Python 3.11), each the
#: default ``python3`` of a release whose packages this machine's mirrors serve: a spec
#: that asks for one is built on a tools image bootstrapped from that release (the same
#: ``images/Dockerfile``), so its packages, wheels and ``python`` are that version's.
#: 3.10 and 3.12 are Ubuntu 22.04's and 24.04's (ALE's own ``cpu-free-ubuntu`` VM is an
#: Ubuntu machine), 3.13 and 3.14 Debian trixie's and sid's.
INTERPRETER_RELEASES = {"3.10": ubuntu("jammy"), "3.12": ubuntu("noble"), "3.13": debian("trixie"),
                        "3.14": debian("sid")}
LABEL_KEY = "org.ale.env.key"
LABEL_RECORD = RECORD_LABEL

# Runs once in the built image (no network, uid 1000, read-only root): what it holds.
RECORD_SCRIPT = r"""
import hashlib, json, os, platform, shutil, subprocess, sys
out = {"python": {"executable": sys.executable, "realpath": os.path.realpath(sys.executable),
                  "version": platform.python_version()}}
try:  # the release the image is (Debian 12; Ubuntu 22.04 for Python 3.10, ...)
    with open("/etc/os-release") as f:
        rel = dict(l.rstrip("\n").split("=", 1) for l in f if "=" in l)
    out["os"] = {k.lower(): rel.get(k, "").strip('"') for k in ("ID", "VERSION_ID", "VERSION_CODENAME", "PRETTY_NAME")}
except OSError:
    out["os"] = None
p = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Architecture}\n"],
                   capture_output=True, text=True)
out["debian"] = sorted([dict(zip(("name", "version", "arch"), l.split("\t"))) for l in p.stdout.splitlines() if l],
                       key=lambda d: d["name"])
p = subprocess.run([sys.executable, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True)
if p.returncode == 0:
    pk, how = [{"name": d["name"], "version": d["version"]} for d in json.loads(p.stdout)], "pip list"
else:
    import importlib.metadata as md
    pk, how = [{"name": d.metadata["Name"], "version": d.version} for d in md.distributions()], "importlib.metadata"
out["python"]["packages"] = sorted(pk, key=lambda d: d["name"].lower())
out["python"]["lister"] = how
store, files = "/opt/ale/wheels", []
if os.path.isdir(store):
    for n in sorted(os.listdir(store)):
        h = hashlib.sha256()
        with open(os.path.join(store, n), "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        files.append({"name": n, "sha256": h.hexdigest(), "size": os.path.getsize(os.path.join(store, n))})
d = hashlib.sha256()
for f in files:
    d.update(f["name"].encode() + b"\0" + f["sha256"].encode() + b"\n")
out["store"] = {"path": store, "files": files, "digest": d.hexdigest()}
cmds = {}
for c in ("python", "python3", "pip", "uv", *sys.argv[1:]):
    w = shutil.which(c)
    cmds[c] = os.path.realpath(w) if w else None
out["commands"] = cmds
uv = subprocess.run(["uv", "--version"], capture_output=True, text=True) if cmds["uv"] else None
out["uv"] = uv.stdout.strip() if uv and uv.returncode == 0 else None
print(json.dumps(out))
"""

# What a probe of the base image says about its interpreter and platform.
_PLATFORM_SCRIPT = (
    "import json, platform, sys; "
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], 'python_full': platform.python_version(), "
    "'libc': platform.libc_ver(), "
    "'machine': platform.machine()}))"
)


class EnvImage(BaseModel):
    """A built (or found) task environment."""

    tag: str
    image_id: str
    key: str
    size: int
    base: str
    base_id: str
    cached: bool = False
    build_s: float = 0.0
    #: what the image holds (``/opt/ale/software-record.json``): Debian packages, the
    #: default interpreter's packages, the store's files and digest, the spec, and
    #: needs the build could not meet (``missing``: ``[{"name", "why"}]``).
    record: dict[str, Any] = Field(default_factory=dict)

    @property
    def store_digest(self) -> str | None:
        return (self.record.get("store") or {}).get("digest")


# --------------------------------------------------------------------------- needs


def _requirement_lines(text: str) -> list[str]:
    """The requirement lines of a requirements.txt that an index can provide:
    options (``-r``, ``-e``, ``--index-url``), local paths and hashes dropped."""
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#") or line.startswith("-"):
            continue
        line = re.sub(r"\s--hash[= ]\S+", "", line).strip().rstrip("\\").strip()
        if line.startswith((".", "/", "file:")) or ("://" in line and "@" not in line):
            continue
        out.append(line)
    return out


def _marker_env(target: dict[str, Any]) -> dict[str, str]:
    """The PEP 508 environment of the image's python3 (Linux, CPython)."""
    full = str(target.get("python_full") or f"{target['python']}.0")
    return {"python_version": str(target["python"]), "python_full_version": full, "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
            "os_name": "posix", "platform_machine": str(target.get("machine") or "x86_64")}


def _for_target(pkg: dict[str, Any], target: dict[str, Any] | None) -> bool:
    """False when every one of a locked version's ``resolution-markers`` excludes the
    image's interpreter (a lock for ``>=3.10`` pins numpy 2.5 for Python 3.12 only)."""
    markers = pkg.get("resolution-markers")
    if target is None or not isinstance(markers, list) or not markers:
        return True
    env = _marker_env(target)
    for m in markers:
        try:
            if Marker(str(m)).evaluate(env):
                return True
        except (InvalidMarker, UndefinedEnvironmentName, UndefinedComparison):
            return True
    return False


def lock_needs(lf: LockFile, target: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """(requirements resolved with their dependencies, exact pins taken without them)
    that a lock file or manifest puts into the store; with ``target`` (the image's
    platform), a uv.lock's versions locked only for other interpreters are left out."""
    name = lf.name.rsplit("/", 1)[-1]
    if name == "uv.lock":
        data = tomllib.loads(lf.text)
        pins = []
        for pkg in data.get("package", []):
            source = pkg.get("source") or {}
            if "registry" in source and pkg.get("name") and pkg.get("version") and _for_target(pkg, target):
                pins.append(f"{pkg['name']}=={pkg['version']}")
        return [], sorted(set(pins))
    if name == "pyproject.toml":
        data = tomllib.loads(lf.text)
        reqs = list((data.get("project") or {}).get("dependencies") or [])
        for group in (data.get("dependency-groups") or {}).values():
            reqs += [r for r in group if isinstance(r, str)]
        # `uv sync` builds a packaged project: its build backend must be in the store.
        reqs += list((data.get("build-system") or {}).get("requires") or [])
        return sorted(set(reqs)), []
    return _requirement_lines(lf.text), []


def _project_pins(lock: LockFile, pyproject: LockFile | None, target: dict[str, Any], uv: Path) -> list[str]:
    """The exact packages ``uv sync`` installs from ``lock`` on the image's
    interpreter and platform: ``uv export --frozen`` (the host's copy of the pinned
    uv, offline), its markers evaluated for the image (a Windows-only colorama is
    not installed, or `uv sync` would remove it from the read-only environment).
    Without the project's pyproject.toml, the lock's pins for this interpreter."""
    if pyproject is None:
        return lock_needs(lock, target)[1]
    with tempfile.TemporaryDirectory(prefix="ale-uv-project-") as tmp:
        Path(tmp, "pyproject.toml").write_text(pyproject.text)
        Path(tmp, "uv.lock").write_text(lock.text)
        proc = subprocess.run([str(uv / "uv"), "export", "--frozen", "--no-hashes", "--no-emit-project", "--no-header",
                               "--no-annotate", "--project", tmp, "--offline", "--no-config"],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "UV_CACHE_DIR": tmp + "/cache"})
    if proc.returncode != 0:
        raise SandboxError(f"uv export of {lock.origin or lock.name} failed: {proc.stderr.strip()[-400:]}")
    env = _marker_env(target)
    pins = []
    for line in proc.stdout.splitlines():
        req, _, marker = line.partition(";")
        req = req.strip()
        if "==" not in req or req.startswith(("#", "-")):
            continue
        if marker.strip():
            try:
                if not Marker(marker.strip()).evaluate(env):
                    continue
            except (InvalidMarker, UndefinedEnvironmentName, UndefinedComparison):
                pass
        pins.append(req)
    return sorted(set(pins))


def uv_project(spec: SoftwareSpec, target: dict[str, Any], wheels: Path, say: Say = print) -> dict[str, Any] | None:
    """The task's one uv project (a ``uv.lock``, with the ``pyproject.toml`` of its
    folder), as the image's read-only project environment holds it: what ``uv sync``
    installs on this interpreter, where the store has the wheel. ALE's prompts say
    ``uv sync [--frozen] --project input/runtime_env``: that folder is read-only in
    the sandbox and a fresh environment would need the lock's PyPI URLs, so the image
    carries the environment already synced (``UV_PROJECT_ENVIRONMENT``). None when
    the spec has no uv.lock, or more than one (which would each need their own)."""
    locks = [lf for lf in spec.lockfiles if lf.name.rsplit("/", 1)[-1] == "uv.lock"]
    if len(locks) != 1:
        return None
    lock = locks[0]

    def folder(lf: LockFile) -> str:
        return lf.origin.rsplit("/", 1)[0] if "/" in lf.origin else ""

    pyproject = next((lf for lf in spec.lockfiles
                      if lf.name.rsplit("/", 1)[-1] == "pyproject.toml" and folder(lf) == folder(lock)), None)
    pins = _project_pins(lock, pyproject, target, uv_binaries(target, say))
    have = set()
    for w in wheels.glob("*.whl"):
        with suppress(InvalidWheelFilename, InvalidVersion):
            wheel_name, wheel_version, _, _ = parse_wheel_filename(w.name)
            have.add((wheel_name, wheel_version))
    installed = []
    for pin in pins:
        name, _, version = pin.partition("==")
        with suppress(InvalidVersion):
            if (canonicalize_name(name), Version(version)) in have:
                installed.append(pin)
    doc: dict[str, Any] = {"path": UV_PROJECT_ENV, "lock": lock.origin or lock.name, "installed": installed,
                           "not_in_store": sorted(set(pins) - set(installed))}
    if pyproject is not None:
        with suppress(tomllib.TOMLDecodeError):
            data = tomllib.loads(pyproject.text)
            if data.get("build-system") is not None \
                    and ((data.get("tool") or {}).get("uv") or {}).get("package") is not False:
                doc["note"] = ("a packaged project: `uv sync` would also install the project itself into the read-only "
                               "environment; `uv sync --no-install-project`, or a copy of the project, works")
    return doc


def _platform_args(target: dict[str, Any]) -> list[str]:
    machine = target.get("machine") or "x86_64"
    libc, version = (target.get("libc") or ["", ""])[:2]
    args = ["--implementation", "cp", "--python-version", target["python"]]
    if libc == "glibc" and re.fullmatch(r"2\.\d+", version or ""):
        top = int(version.split(".")[1])
        args += [a for k in range(top, 4, -1) for a in ("--platform", f"manylinux_2_{k}_{machine}")]
        if machine in ("x86_64", "i686"):
            args += ["--platform", f"manylinux2014_{machine}", "--platform", f"manylinux2010_{machine}",
                     "--platform", f"manylinux1_{machine}"]
        elif machine == "aarch64":
            args += ["--platform", "manylinux2014_aarch64"]
    else:
        raise SandboxError(f"the base image's C library is {libc or 'unknown'} {version}: "
                           "only glibc images can take PyPI's manylinux wheels")
    return args


def _run_lines(cmd: list[str], say: Say, *, what: str) -> None:
    """Run a host command, streaming its output through ``say``."""
    say(f"$ {' '.join(cmd[:4])} ... ({what})")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            say(f"  {line}")
            tail = (tail + [line])[-20:]
    if proc.wait() != 0:
        raise SandboxError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def pip_download(reqs: Iterable[str], dest: Path, target: dict[str, Any], say: Say, *, no_deps: bool = False,
                 find_links: Path | list[Path] | None = None) -> None:
    """Download wheels for ``reqs`` (with their dependencies unless ``no_deps``) into
    ``dest``, for the target interpreter and platform, with the host's pip
    (``find_links``: folders of wheels to take before the index's)."""
    reqs = list(reqs)
    if not reqs:
        return
    cmd = [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:",
           "--progress-bar", "off", "--disable-pip-version-check", *_platform_args(target)]
    if no_deps:
        cmd.append("--no-deps")
    links = [find_links] if isinstance(find_links, Path) else list(find_links or [])
    for link in links:
        cmd += ["--find-links", str(link)]
    if links:  # wheels built here are tagged linux_<machine>, not manylinux
        cmd += ["--platform", f"linux_{target.get('machine') or 'x86_64'}"]
    _run_lines(cmd + reqs, say, what=f"pip download of {len(reqs)} requirement(s)")


def _last_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[-1] if lines else type(e).__name__


def download_set(reqs: list[str], dest: Path, target: dict[str, Any], say: Say) -> list[dict[str, str]]:
    """One set of requirements resolved together, with their dependencies. If the
    set fails, each requirement is tried alone; those that still fail are returned
    as missing, not fatal. Wheels only: an sdist-only release is missing, never
    built here (building runs the package's own code on the trusted side)."""
    if not reqs:
        return []
    errors: dict[str, str] = {}
    try:
        pip_download(reqs, dest, target, say)
        return []
    except SandboxError as e:
        if len(reqs) == 1:
            errors[reqs[0]] = _last_line(e)
        else:
            say(f"resolving {len(reqs)} requirements together failed; trying each alone")
    missing = []
    for req in reqs:
        why = errors.get(req)
        if why is None:
            try:
                pip_download([req], dest, target, say)
                continue
            except SandboxError as e:
                why = _last_line(e)
        missing.append({"name": req, "why": f"no wheel for the image's interpreter and platform: {why}"})
    return missing


def _download_pins(pins: list[str], dest: Path, target: dict[str, Any], say: Say) -> list[dict[str, str]]:
    """Locked pins, without their dependencies (the lock has them all). A pin with no
    wheel for this platform (a Windows-only package, an sdist-only release) is
    reported as missing rather than failing the build."""
    if not pins:
        return []
    try:
        pip_download(pins, dest, target, say, no_deps=True)
        return []
    except SandboxError:
        say("some locked pins have no wheel for this platform; taking them one by one")
    missing = []
    for pin in pins:
        try:
            pip_download([pin], dest, target, lambda _line: None, no_deps=True)
        except SandboxError as e:
            missing.append({"name": pin, "why": f"no wheel for the image's platform: {_last_line(e)}"})
    return missing


def uv_binaries(target: dict[str, Any], say: Say = print) -> Path:
    """A folder holding ``uv`` and ``uvx`` (``UV_VERSION``) for the target platform,
    from PyPI's ``uv`` wheel, cached on the host."""
    machine = target.get("machine") or "x86_64"
    folder = cache_dir() / "uv" / f"{UV_VERSION}-{machine}"
    if (folder / "uv").is_file() and (folder / "uvx").is_file():
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        pip_download([f"uv=={UV_VERSION}"], Path(tmp), target, say, no_deps=True)
        wheel = next(Path(tmp).glob("uv-*.whl"))
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for name in ("uv", "uvx"):
                member = next(m for m in z.namelist() if m.endswith(f".data/scripts/{name}"))
                out = folder / f".{name}.part"
                out.write_bytes(z.read(member))
                out.chmod(0o755)
                out.rename(folder / name)
    return folder


# --------------------------------------------------------------------------- docker


def _build(client: docker.DockerClient, ctx: Path, dockerfile: str, *, tag: str | None,
           buildargs: dict[str, str], labels: dict[str, str], say: Say, what: str) -> str:
    """One ``docker build``, its output streamed through ``say``; returns the image id."""
    image_id = None
    errors: list[str] = []
    tail: list[str] = []
    try:
        for chunk in client.api.build(path=str(ctx), dockerfile=dockerfile, tag=tag, buildargs=buildargs,
                                      labels=labels, rm=True, forcerm=True, pull=False, decode=True):
            if "stream" in chunk:
                for line in str(chunk["stream"]).splitlines():
                    if line.strip():
                        say(f"  {line.rstrip()}")
                        tail = (tail + [line.rstrip()])[-25:]
                        m = re.match(r"Successfully built ([0-9a-f]+)", line)
                        if m:
                            image_id = image_id or m.group(1)
            if "error" in chunk:
                errors.append(str(chunk["error"]).strip())
            aux = chunk.get("aux")
            if isinstance(aux, dict) and aux.get("ID"):
                image_id = str(aux["ID"])
    except docker.errors.APIError as e:
        raise SandboxError(f"building {what} failed: {e}") from e
    if errors or image_id is None:
        raise SandboxError(f"building {what} failed: {'; '.join(errors) or 'no image id'}\n" + "\n".join(tail))
    return client.images.get(image_id).id


def _run_once(client: docker.DockerClient, image: str, argv: list[str], *, timeout: float = 300) -> str:
    """Run argv once in ``image``: no network, uid 1000, read-only root, no
    capabilities; its stdout, or SandboxError with its stderr."""
    container = client.containers.create(
        image, command=argv, user="1000:1000", network_mode="none", read_only=True, cap_drop=["ALL"],
        security_opt=["no-new-privileges"], tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"},
        ulimits=[docker.types.Ulimit(name="core", soft=0, hard=0)],
        labels={LABEL_MANAGED: "1", LABEL_ROLE: RECORD_ROLE}, detach=True,
    )
    try:
        container.start()
        status = container.wait(timeout=timeout)
        out = container.logs(stdout=True, stderr=False).decode()
        if status.get("StatusCode") != 0:
            err = container.logs(stdout=False, stderr=True).decode()
            raise SandboxError(f"running {argv[0]} in {image} failed (exit {status.get('StatusCode')}): {err[-1500:]}")
        return out
    finally:
        with suppress(docker.errors.APIError):
            container.remove(force=True)


def _read_file(client: docker.DockerClient, image: str, path: str) -> bytes | None:
    """A file of an image, read through a never-started container."""
    container = client.containers.create(image, command=["true"], network_mode="none",
                                         labels={LABEL_MANAGED: "1", LABEL_ROLE: RECORD_ROLE})
    try:
        try:
            chunks, _ = container.get_archive(path)
        except docker.errors.NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member else None
            return f.read() if f else None
    finally:
        with suppress(docker.errors.APIError):
            container.remove(force=True)


def probe_platform(client: docker.DockerClient, image: str) -> dict[str, Any]:
    """The default python3's version, the C library and the machine of ``image``."""
    out = _run_once(client, image, ["python3", "-c", _PLATFORM_SCRIPT], timeout=120)
    return dict(json.loads(out.strip().splitlines()[-1]))


def take_record(client: docker.DockerClient, image: str, commands: Iterable[str] = ()) -> dict[str, Any]:
    """What ``image`` holds, read by running it once with no network (``commands``:
    further commands whose paths it records, the spec's shims)."""
    out = _run_once(client, image, ["python3", "-c", RECORD_SCRIPT, *commands])
    return dict(json.loads(out.strip().splitlines()[-1]))


def _record_of(client: docker.DockerClient, image_id: str, *, run: bool) -> dict[str, Any]:
    """The record of a built image, cached on the host by image id: read from
    ``RECORD_PATH`` in the image, or (``run``, for an image without one) taken."""
    cached = cache_dir() / "env-records" / f"{image_id.split(':')[-1]}.json"
    with suppress(OSError, ValueError):
        return dict(json.loads(cached.read_text()))
    raw = _read_file(client, image_id, RECORD_PATH)
    if raw is not None:
        record = dict(json.loads(raw))
    elif run:
        record = take_record(client, image_id)
    else:
        raise SandboxError(f"image {image_id} has no {RECORD_PATH}")
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".part")
    tmp.write_text(json.dumps(record, sort_keys=True))
    tmp.replace(cached)
    return record


def _refuse_volumes(client: docker.DockerClient, ref: str) -> Any:
    image = client.images.get(ref)
    volumes = (image.attrs.get("Config") or {}).get("Volumes")
    if volumes:
        raise SandboxError(f"{ref} declares VOLUME {sorted(volumes)}; it must declare none")
    return image


def _world_readable(ctx: Path) -> None:
    """Modes for COPY: folders and executables 0755, other files 0644 (COPY keeps them)."""
    for p in [ctx, *ctx.rglob("*")]:
        p.chmod(0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644)


def _mb(n: int | float) -> str:
    return f"{n / 1e6:.1f} MB"


# --------------------------------------------------------------------------- build


def spec_content(spec: SoftwareSpec) -> dict[str, Any]:
    """The spec as its key sees it: an image is shared by every task with the same
    needs, so where a need came from (a lock file's ``origin``) is the run's
    evidence, not the image's."""
    return spec.content()


def env_folder() -> Path:
    return images_dir() / "env"


def recipe_digest() -> str:
    """What, besides the spec and the base image, decides the image's content."""
    mirror = os.environ.get("ALE_DEBIAN_MIRROR", "")
    return _sha(RECIPE_VERSION, _dir_digest(env_folder()), RECORD_SCRIPT, RECORD_PATH, UV_VERSION, mirror)


def env_key(spec: SoftwareSpec, base_id: str) -> str:
    return _sha(spec.key(), base_id, recipe_digest())


def _system_stage(client: docker.DockerClient, spec: SoftwareSpec, base_ref: str, base_id: str,
                  target: dict[str, Any], say: Say) -> str:
    """Stage 1 (keyed by the Debian set): its content tag, built unless cached."""
    folder = env_folder()
    mirror = os.environ.get("ALE_DEBIAN_MIRROR", "")
    recipe = _sha(RECIPE_VERSION,
                  *(folder.joinpath(n).read_bytes() for n in ("Dockerfile.system", "pip.conf", "uv.toml")))
    key = _sha(base_id, json.dumps(list(spec.debian)), mirror, recipe, UV_VERSION)[:12]
    tag = f"{SYSTEM_REPO}:{key}"
    if _has_image(client, tag):
        say(f"system stage {tag} is cached (Debian: {' '.join(spec.debian) or 'none'})")
        return tag
    say(f"building {tag} FROM {base_ref} (apt: {' '.join(spec.debian) or 'pip/venv only'}; uv {UV_VERSION})...")
    uv = uv_binaries(target, say)
    with tempfile.TemporaryDirectory(prefix="ale-env-") as tmp:
        ctx = Path(tmp)
        for n in ("Dockerfile.system", "pip.conf", "uv.toml"):
            shutil.copy(folder / n, ctx / n)
        (ctx / "bin").mkdir()
        for n in ("uv", "uvx"):
            shutil.copy(uv / n, ctx / "bin" / n)
        _world_readable(ctx)
        _build(client, ctx, "Dockerfile.system", tag=tag,
               buildargs={"BASE": base_ref, "DEBIAN_PACKAGES": " ".join(spec.debian), "DEBIAN_MIRROR": mirror},
               labels={"org.ale.env.system-key": key}, say=say, what=tag)
    _refuse_volumes(client, tag)
    return tag


# pip's own lines around a failed build (the package's output is what says why)
_PIP_NOISE = re.compile(r"^\s*(note:|hint:|error:|×|╰─>|│|\[end of output\]|ERROR: Failed|Building wheel"
                        r"|Processing |Running setup|Failed to build)")


def builder_image(client: docker.DockerClient, system: str, dockerfile: Path, say: Say) -> str:
    """The build container's image: the system stage plus a compiler and the
    interpreter's headers (Debian packages); cached by content."""
    system_id = _has_image(client, system) or system
    key = _sha(system_id, dockerfile.read_bytes())[:12]
    tag = f"{BUILDER_REPO}:{key}"
    if _has_image(client, tag):
        return tag
    say(f"building the wheel builder {tag} FROM {system} (a compiler and Python headers)...")
    with tempfile.TemporaryDirectory(prefix="ale-builder-") as tmp:
        shutil.copy(dockerfile, Path(tmp) / "Dockerfile")
        _build(client, Path(tmp), "Dockerfile", tag=tag, buildargs={"SYSTEM": system},
               labels={"org.ale.image": "env-builder"}, say=say, what=tag)
    return tag


def _built_from_sdists(client: docker.DockerClient, spec: SoftwareSpec, system: str, missing: list[dict[str, str]],
                       wheels: Path, target: dict[str, Any],
                       say: Say) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """The spec's requirements that had no wheel, built from their sdists in a build
    container (``wheel_builds``) and put into the store with their dependencies;
    (what is still missing, the record of each build). A build that fails stays
    missing, with its log's tail."""
    from ale.sandbox.wheel_builds import build_from_sdist

    wanted = {*spec.python, *spec.store_only}
    # Exact pins (a catalogue's `pyradiomics==3.0.1`) first: a looser requirement of the
    # same project (a manifest's bare `pyradiomics`) may then be met by their wheel,
    # where building the newest sdist would fail (3.1.0 lacks its C headers).
    todo = sorted((m for m in missing if m["name"] in wanted), key=lambda m: not _exact_pin(m["name"]))
    if not todo:
        return missing, []
    still = [m for m in missing if m["name"] not in wanted]
    builder = builder_image(client, system, env_folder() / "Dockerfile.builder", say)
    records: list[dict[str, Any]] = []
    built_links: list[Path] = []  # folders of the wheels built so far (and their built dependencies)

    def build(req: str) -> tuple[Any, Path | None]:
        return build_from_sdist(client, req, builder=builder, extra=list(spec.build_requires),
                                download=lambda reqs, dest: pip_download(reqs, dest, target, say), say=say,
                                python=target.get("python"))

    for m in todo:
        req = m["name"]
        if built_links:
            try:
                pip_download([req], wheels, target, lambda _line: None, find_links=built_links)
                say(f"{req}: met by a wheel built from an sdist here; not built again")
                continue
            except SandboxError:
                pass
        done, folder = build(req)
        deps_built: list[Any] = []
        if folder is not None:
            links, tried = [folder], {canonicalize_name(Requirement(req).name)}
            while True:  # its dependencies, building those that have only an sdist too (docopt)
                try:
                    pip_download([req], wheels, target, say, find_links=links)
                    break
                except SandboxError as e:
                    dep = next((d for d in _unmet_names(str(e))
                                if canonicalize_name(Requirement(d).name) not in tried), None)
                    if dep is None or len(tried) > MAX_SDIST_DEPENDENCIES:
                        done.error = f"built, but its dependencies have no wheels for the image: {_last_line(e)}"
                        break
                    tried.add(canonicalize_name(Requirement(dep).name))
                    say(f"{req}: its dependency {dep} has no wheel for the image either; building it from its sdist")
                    dep_done, dep_folder = build(dep)
                    deps_built.append(dep_done)
                    if dep_folder is None:
                        done.error = (f"built, but its dependency {dep} has no wheel and its sdist did not build: "
                                      f"{dep_done.error}")
                        done.log = dep_done.log
                        break
                    links.append(dep_folder)
            if done.error is None:
                built_links += [link for link in links if link not in built_links]
                for link in links:
                    for w in link.glob("*.whl"):
                        shutil.copy(w, wheels / w.name)
        records += [done.record(), *(d.record() for d in deps_built)]
        if done.error:
            log = " | ".join([ln.strip() for ln in done.log.splitlines() if ln.strip()
                              and not _PIP_NOISE.match(ln)][-6:])
            still.append({"name": req,
                          "why": f"{m['why']}; building it from its sdist {done.sdist or '(none)'} failed: "
                                              f"{done.error}" + (f" (log: {log})" if log else "")})
    return still, records


def _exact_pin(req: str) -> bool:
    """Whether ``req`` names one version exactly (``name==1.2``, no wildcard)."""
    try:
        specs = list(Requirement(req).specifier)
    except InvalidRequirement:
        return False
    return len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version


#: how many of a built package's dependencies may be built from their sdists too
MAX_SDIST_DEPENDENCIES = 8
_DEPENDS_ON = re.compile(r"depends on ([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?[^\s;]*)")
_NO_DISTRIBUTION = re.compile(r"No matching distribution found for ([A-Za-z0-9][^\s;]*)")


def _unmet_names(pip_error: str) -> list[str]:
    """The requirements pip says it could not find a wheel for, in its order."""
    out = []
    for m in [*_NO_DISTRIBUTION.finditer(pip_error), *_DEPENDS_ON.finditer(pip_error)]:
        with suppress(InvalidRequirement):
            out.append(str(Requirement(m.group(1))))
    return list(dict.fromkeys(out))


def interpreter_tools_image(client: docker.DockerClient, version: str, say: Say = print) -> str:
    """The tools image on a base whose default ``python3`` is ``version``
    (``INTERPRETER_RELEASES``), bootstrapped from that release's packages; cached by content."""
    release = INTERPRETER_RELEASES[version]
    base = bootstrap_base(client, say, release=release)
    ref = build_tools_image(client, base=base, tag=f"ale-tools:python{version}", say=say)
    got = probe_platform(client, ref)["python"]
    if got != version:
        raise SandboxError(f"{release.label}'s python3 is {got}, not {version}: INTERPRETER_RELEASES is out of date")
    return ref


def _shims(ctx: Path, spec: SoftwareSpec) -> None:
    """``shims/<name>``: a two-line script that runs the spec's command line for
    ``name`` with its arguments (installed into /usr/local/bin); ``prepare.sh``:
    the spec's build-time commands, run once after the installs."""
    shims = ctx / "shims"
    shims.mkdir()
    for name, run in spec.commands:
        f = shims / name
        f.write_text(f"#!/bin/sh\n# ale: `{name}` is provided by `{run}`\nexec {run} \"$@\"\n")
        f.chmod(0o755)
    (ctx / "prepare.sh").write_text("".join(f"{line}\n" for line in spec.prepare))


def build_env_image(
    spec: SoftwareSpec,
    *,
    client: docker.DockerClient | None = None,
    base_image: str | None = None,
    say: Say = print,
) -> EnvImage:
    """Build (or find cached) the environment image for ``spec`` ``FROM`` the base
    image (default: the tools image, built or found via ``build_tools_image``).
    An empty spec is the base image itself. Raises ``SandboxError``."""
    if client is None:
        from ale.sandbox.docker import connect

        client = connect()
    t0 = time.monotonic()
    release = INTERPRETER_RELEASES.get(spec.python_version or "")
    interpreter_failed: str | None = None
    if release is not None:
        say(f"Python {spec.python_version} is {release.label}'s python3: the environment is built on a tools image "
            f"bootstrapped from {release.label}" + (f", not on {base_image}" if base_image else ""))
        try:
            base_ref = interpreter_tools_image(client, str(spec.python_version), say)
        except SandboxError as e:  # its archive unreachable, say: the task runs without it, saying so
            interpreter_failed = f"building {release.label}'s tools image failed: {str(e)[-1500:]}"
            say(f"{interpreter_failed}; the environment is built without Python {spec.python_version}")
            release = None
    if release is None:
        base_ref = build_tools_image(client, say=say) if base_image is None else base_image
    base_id = _has_image(client, base_ref)
    if base_id is None:
        raise SandboxError(f"base image {base_ref} is not in the Docker engine")
    base = _refuse_volumes(client, base_ref)
    if spec.empty:
        return EnvImage(tag=base_ref, image_id=base_id, key=_sha(spec.key(), base_id),
                        size=int(base.attrs.get("Size") or 0),
                        base=base_ref, base_id=base_id, cached=True, build_s=time.monotonic() - t0,
                        record=_record_of(client, base_id, run=True))
    key = env_key(spec, base_id)
    tag = f"{ENV_REPO}:{key[:12]}"
    image_id = _has_image(client, tag)
    if image_id is not None:
        image = _refuse_volumes(client, tag)
        say(f"environment {tag} is cached ({_mb(image.attrs.get('Size') or 0)})")
        return EnvImage(tag=tag, image_id=image_id, key=key, size=int(image.attrs.get("Size") or 0), base=base_ref,
                        base_id=base_id, cached=True, build_s=time.monotonic() - t0,
                        record=_record_of(client, image_id, run=False))

    say(f"building environment {tag} FROM {base_ref}: Debian {list(spec.debian)}, Python {list(spec.python)}, "
        f"store-only {list(spec.store_only)}, {len(spec.lockfiles)} lock file(s)")
    target = probe_platform(client, base_ref)
    missing: list[dict[str, str]] = []
    if spec.python_version and spec.python_version != target["python"]:
        missing.append({"name": f"Python {spec.python_version}",
                        "why": interpreter_failed or f"the image's python3 is {target['python']}; no package here "
                                                     f"provides {spec.python_version}"})
    system = _system_stage(client, spec, base_ref, base_id, target, say)

    with tempfile.TemporaryDirectory(prefix="ale-env-") as tmp:
        ctx = Path(tmp)
        wheels = ctx / "wheels"
        wheels.mkdir()
        # Each set is resolved on its own (the store may then hold several versions of
        # a package): what python3 gets, what `uv run --with` gets, what each manifest
        # asks for; a lock file's pins are taken as they are.
        pins: list[str] = []
        resolve_sets = [list(spec.python), list(spec.store_only)]
        for lf in spec.lockfiles:
            r, p = lock_needs(lf, target)
            resolve_sets.append(r)
            pins += p
        for reqs in resolve_sets:
            missing += download_set(reqs, wheels, target, say)
        missing, built = _built_from_sdists(client, spec, system, missing, wheels, target, say)
        missing += _download_pins(sorted(set(pins)), wheels, target, say)
        for f in wheels.iterdir():
            if f.suffix != ".whl":
                f.unlink()  # an sdist pip wheel left behind: the store holds wheels only
        store_bytes = sum(f.stat().st_size for f in wheels.iterdir())
        say(f"package store: {len(list(wheels.iterdir()))} wheel(s), {_mb(store_bytes)}")
        for m in missing:
            say(f"missing: {m['name']}: {m['why']}")
        unmet = {m["name"] for m in missing}
        (ctx / "requirements.txt").write_text("".join(f"{r}\n" for r in spec.python if r not in unmet))
        project = uv_project(spec, target, wheels, say)
        (ctx / "uv-project.txt").write_text("".join(f"{p}\n" for p in project["installed"]) if project else "")
        if project:
            say(f"uv project environment {UV_PROJECT_ENV}: {len(project['installed'])} locked package(s) "
                f"from {project['lock']}" + (f"; {project['note']}" if project.get("note") else ""))
        _shims(ctx, spec)
        _world_readable(ctx)
        for n in ("Dockerfile.python", "distro-replaced.py"):
            shutil.copy(env_folder() / n, ctx / n)
        stage = _build(client, ctx, "Dockerfile.python", tag=None, buildargs={"SYSTEM": system},
                       labels={}, say=say, what=f"the Python stage of {tag}")

    say("recording what the image holds (one run, no network)...")
    record = take_record(client, stage, [name for name, _ in spec.commands])
    record.update(
        key=key,
        spec=spec_content(spec),
        base={"ref": base_ref, "id": base_id},
        platform=target,
        missing=missing,
        recipe=recipe_digest(),
        uv_project=project,
        built=built,
    )
    body = json.dumps(record, sort_keys=True, indent=1).encode()
    record_sha = hashlib.sha256(body).hexdigest()
    with tempfile.TemporaryDirectory(prefix="ale-env-") as tmp:
        ctx = Path(tmp)
        (ctx / "software-record.json").write_bytes(body)
        (ctx / "Dockerfile").write_text(
            f"FROM {stage}\nCOPY software-record.json {RECORD_PATH}\n"
            + (f"ENV {UV_PROJECT_VAR}={UV_PROJECT_ENV}\n" if project else ""))
        (ctx / "software-record.json").chmod(0o644)
        image_id = _build(client, ctx, "Dockerfile", tag=tag, buildargs={},
                          labels={"org.ale.image": "env", LABEL_KEY: key, LABEL_RECORD: record_sha},
                          say=say, what=tag)
    image = _refuse_volumes(client, tag)
    size, base_size = int(image.attrs.get("Size") or 0), int(base.attrs.get("Size") or 0)
    elapsed = time.monotonic() - t0
    say(f"built {tag} in {elapsed:.0f}s: {_mb(size)} (base {_mb(base_size)}, +{_mb(size - base_size)}); "
        f"store {len(record['store']['files'])} wheel(s), digest {record['store']['digest'][:12]}")
    return EnvImage(tag=tag, image_id=image_id, key=key, size=size, base=base_ref, base_id=base_id,
                    cached=False, build_s=elapsed, record=record)
