"""Wheels built from sdists, before the seal, never on the host.

A requirement PyPI has no wheel of for the image's interpreter (PyRadiomics: only an
sdist since Python 3.9) is built into a wheel inside a **build container**: the
environment's system stage plus a compiler and the interpreter's headers
(``images/env/Dockerfile.builder``, built by ``env_image.builder_image``), run with
no network, as a non-root user, with the sdist and its build dependencies' wheels
mounted read-only and one output folder. The host only downloads: the sdist from PyPI's JSON API (its sha256 checked
against the index's), the build dependencies as wheels with the host's pip for the
image's platform. Nothing of the package runs on the host (``pip download`` of an
sdist would run its ``setup.py`` to read its metadata).

Build dependencies: the sdist's ``[build-system] requires`` (read from the archive,
not run; ``setuptools`` and ``wheel`` without one) and ``extra`` ones a catalogue
entry names (a ``setup.py`` that imports numpy without declaring it). The build runs
without isolation from a venv holding exactly those.

Cached by content: ``<cache>/built-wheels/<key>/``, key = sha256(the sdist's sha256,
the builder image's id, the build requirements, the build script). The build's venv
holds the build requirements' wheels only, not the image's Debian packages: an
extension is compiled against the numpy the store has (2.x, whose ABI also serves
1.x), not Debian 12's 1.24, which the installed packages may replace. A failed build is returned with
its log's tail; the caller reports it as missing and the environment is built
without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import ssl
import tarfile
import tempfile
import tomllib
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ale.paths import cache_dir
from ale.sandbox.base import LABEL_MANAGED, LABEL_ROLE, SandboxError
from ale.sandbox.image import Say, _has_image, _sha

BUILD_ROLE = "env-wheel-build"
PYPI_JSON = os.environ.get("ALE_PYPI_JSON", "https://pypi.org/pypi")
BUILD_TIMEOUT_S = 1800
DEFAULT_BUILD_REQUIRES = ("setuptools", "wheel")


@dataclass
class Built:
    """One sdist's build: what was built (``wheel``) or why not (``error``, ``log``)."""

    requirement: str
    builder: str = ""
    sdist: str = ""
    sdist_sha256: str = ""
    build_requires: list[str] = field(default_factory=list)
    wheel: str | None = None
    wheel_sha256: str | None = None
    cached: bool = False
    error: str | None = None
    log: str = ""

    def record(self) -> dict[str, Any]:
        out = {"requirement": self.requirement, "builder": self.builder, "sdist": self.sdist,
               "sdist_sha256": self.sdist_sha256,
               "build_requires": self.build_requires, "wheel": self.wheel, "wheel_sha256": self.wheel_sha256,
               "cached": self.cached, "how": "built from sdist in a build container (no network)"}
        if self.error:
            out.update(error=self.error, log=self.log[-3000:])
        return out


def _ssl_context() -> ssl.SSLContext:
    cert = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    return ssl.create_default_context(cafile=cert) if cert and Path(cert).is_file() else ssl.create_default_context()


def find_sdist(requirement: str, python: str | None = None) -> tuple[str, str, str]:
    """(file name, URL, sha256) of the newest sdist PyPI has that meets
    ``requirement`` (and whose ``Requires-Python`` admits ``python``, the image's
    interpreter, when given); SandboxError when there is none."""
    req = Requirement(requirement)
    url = f"{PYPI_JSON}/{canonicalize_name(req.name)}/json"
    try:
        with urllib.request.urlopen(url, timeout=60, context=_ssl_context()) as r:  # noqa: S310 (a fixed https URL)
            data = json.load(r)
    except (OSError, ValueError) as e:
        raise SandboxError(f"PyPI's index has no {req.name}: {e}") from e
    best: tuple[Version, dict[str, Any]] | None = None
    for v, files in (data.get("releases") or {}).items():
        try:
            version = Version(v)
        except InvalidVersion:
            continue
        if not req.specifier.contains(version, prereleases=bool(req.specifier) and version.is_prerelease):
            continue
        sdist = next((f for f in files if f.get("packagetype") == "sdist" and not f.get("yanked")
                      and _admits(f.get("requires_python"), python)), None)
        if sdist is not None and (best is None or version > best[0]):
            best = (version, sdist)
    if best is None:
        raise SandboxError(f"PyPI has no sdist of {requirement}")
    f = best[1]
    # a mirror of the index may give file URLs relative to the page (``../../packages/...``)
    return str(f["filename"]), urllib.parse.urljoin(url, str(f["url"])), str(f["digests"]["sha256"])


def _admits(requires_python: str | None, python: str | None) -> bool:
    if not requires_python or not python:
        return True
    try:
        return SpecifierSet(requires_python).contains(Version(python), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True  # a malformed marker: the build itself will say


def fetch_sdist(requirement: str, dest: Path, python: str | None = None) -> tuple[Path, str]:
    """The sdist for ``requirement`` in ``dest`` (cached on the host by its sha256)."""
    name, url, sha = find_sdist(requirement, python)
    cached = cache_dir() / "sdists" / sha / name
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        part = cached.with_suffix(".part")
        try:
            with urllib.request.urlopen(url, timeout=300, context=_ssl_context()) as r, part.open("wb") as out:  # noqa: S310
                shutil.copyfileobj(r, out)
        except (OSError, ValueError) as e:  # the build fails, reported with why; the environment goes on without it
            part.unlink(missing_ok=True)
            raise SandboxError(f"downloading {name} from {url} failed: {e}") from e
        got = hashlib.sha256(part.read_bytes()).hexdigest()
        if got != sha:
            part.unlink()
            raise SandboxError(f"{name}: sha256 {got} is not the index's {sha}")
        part.rename(cached)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(cached, dest / name)
    return dest / name, sha


def build_requires(sdist: Path) -> list[str]:
    """The sdist's declared build requirements, read from its ``pyproject.toml``
    (not run): ``setuptools`` and ``wheel`` when it declares none."""
    try:
        with tarfile.open(sdist) as tar:
            member = next((m for m in tar.getmembers()
                           if m.isfile() and m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")), None)
            f = tar.extractfile(member) if member else None
            data = tomllib.loads(f.read().decode()) if f else {}
    except (tarfile.TarError, tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
        data = {}
    reqs = (data.get("build-system") or {}).get("requires")
    return [str(r) for r in reqs] if isinstance(reqs, list) and reqs else list(DEFAULT_BUILD_REQUIRES)


BUILD_SCRIPT = r"""set -e
python3 -m venv /tmp/build-env
/tmp/build-env/bin/pip install --quiet --no-index --find-links /deps -r /deps/build-requirements.txt
cd /tmp && /tmp/build-env/bin/pip wheel --no-deps --no-build-isolation --no-index --find-links /deps \
    -w /out "/src/$1"
"""


def build_wheel(client: docker.DockerClient, builder: str, sdist: Path, deps: Path, out: Path,
                timeout: float = BUILD_TIMEOUT_S) -> tuple[bool, str]:
    """Run the build of ``sdist`` in ``builder`` (no network, uid 1000, read-only
    inputs); (succeeded, its log)."""
    out.chmod(0o777)
    container = client.containers.create(
        builder, command=["sh", "-c", BUILD_SCRIPT, "build", sdist.name], user="1000:1000", network_mode="none",
        cap_drop=["ALL"], security_opt=["no-new-privileges"], working_dir="/tmp",
        environment={"HOME": "/tmp", "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null"},
        volumes={str(sdist.parent): {"bind": "/src", "mode": "ro"}, str(deps): {"bind": "/deps", "mode": "ro"},
                 str(out): {"bind": "/out", "mode": "rw"}},
        labels={LABEL_MANAGED: "1", LABEL_ROLE: BUILD_ROLE}, detach=True,
    )
    try:
        container.start()
        try:
            status = container.wait(timeout=timeout)
        except Exception as e:  # the engine's read timeout: the build overran
            return False, f"the build did not finish in {timeout:.0f}s: {e}"
        log = container.logs(stdout=True, stderr=True).decode(errors="replace")
        return status.get("StatusCode") == 0, log
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)


def build_from_sdist(client: docker.DockerClient, requirement: str, *, builder: str, extra: list[str],
                     download: Any, say: Say, python: str | None = None) -> tuple[Built, Path | None]:
    """Build ``requirement``'s sdist into a wheel (cached); (what happened, the folder
    holding the wheel). ``download(reqs, dest)`` fetches wheels for the image."""
    done = Built(requirement=requirement, builder=builder)
    with tempfile.TemporaryDirectory(prefix="ale-sdist-") as tmp:
        try:
            sdist, sha = fetch_sdist(requirement, Path(tmp) / "src", python)
        except (SandboxError, OSError) as e:
            done.error = str(e)
            return done, None
        done.sdist, done.sdist_sha256 = sdist.name, sha
        reqs = sorted({*build_requires(sdist), *extra})
        done.build_requires = reqs
        builder_id = _has_image(client, builder) or builder
        folder = cache_dir() / "built-wheels" / _sha(sha, builder_id, json.dumps(reqs), BUILD_SCRIPT)[:24]
        wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
        if wheels:
            done.wheel, done.cached = wheels[0].name, True
            done.wheel_sha256 = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
            say(f"wheel of {sdist.name} is cached ({wheels[0].name})")
            return done, folder
        deps = Path(tmp) / "deps"
        deps.mkdir()
        try:
            download(reqs, deps)
        except SandboxError as e:
            done.error = f"its build dependencies {reqs} have no wheels for the image: {e}"
            return done, None
        (deps / "build-requirements.txt").write_text("".join(f"{r}\n" for r in reqs))
        for p in [sdist.parent, sdist, deps, *deps.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        Path(tmp).chmod(0o755)
        out = Path(tmp) / "out"
        out.mkdir()
        say(f"building a wheel from {sdist.name} in {builder} (no network; build requirements: {' '.join(reqs)})...")
        ok, log = build_wheel(client, builder, sdist, deps, out)
        done.log = log
        built = sorted(out.glob("*.whl"))
        if not ok or not built:
            done.error = "the build failed" if not ok else "the build made no wheel"
            say(f"building {sdist.name} failed; the environment is built without it:\n"
                + "\n".join(log.strip().splitlines()[-15:]))
            return done, None
        folder.mkdir(parents=True, exist_ok=True)
        for w in built:
            shutil.copy(w, folder / w.name)
        done.wheel = built[0].name
        done.wheel_sha256 = hashlib.sha256(built[0].read_bytes()).hexdigest()
        say(f"built {done.wheel} from {sdist.name}")
        return done, folder
