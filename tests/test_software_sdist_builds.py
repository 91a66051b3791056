"""Requirements PyPI has only an sdist of (issue 30): built into wheels inside a build
container (no network, uid 1000), from build dependencies downloaded as wheels, cached
by content, recorded as built; a build that fails is reported with its log and the
environment is built without it. The sdists here are written by the test (a PyPI name
that does not exist, so the index has no wheel), one with a build dependency its
``setup.py`` imports, one whose build fails."""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from ale.sandbox import wheel_builds
from ale.sandbox.env_image import ENV_REPO, EnvImage, build_env_image, env_key
from ale.sandbox.software import SoftwareSpec
from tests.conftest import TOOLS_IMAGE

GOOD = "ale-sdist-demo-zz9"
BROKEN = "ale-sdist-broken-zz9"

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61", "wheel", "six"]
build-backend = "setuptools.build_meta"
"""

SETUP = """\
import six  # the build dependency: not installed unless the build environment has it
from setuptools import setup
open("ale_sdist_demo_zz9.py", "w").write("BUILT_WITH_SIX = %r\\n" % six.__version__)
setup(name="ale-sdist-demo-zz9", version="1.0", py_modules=["ale_sdist_demo_zz9"], install_requires=["tabulate"])
"""

BROKEN_SETUP = """\
raise SystemExit("ale test: this sdist does not build")
"""


def sdist(folder: Path, name: str, files: dict[str, str]) -> Path:
    stem = f"{name.replace('-', '_')}-1.0"
    path = folder / f"{stem}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in {**files, "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{stem}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def sdists(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sdists")
    return {GOOD: sdist(folder, GOOD, {"pyproject.toml": PYPROJECT, "setup.py": SETUP}),
            BROKEN: sdist(folder, BROKEN, {"setup.py": BROKEN_SETUP})}


def test_build_requirements_are_read_from_the_archive_not_run(sdists: dict[str, Path]) -> None:
    assert wheel_builds.build_requires(sdists[GOOD]) == ["setuptools>=61", "wheel", "six"]
    assert wheel_builds.build_requires(sdists[BROKEN]) == ["setuptools", "wheel"]  # no pyproject.toml


def test_a_spec_without_build_requires_keeps_its_key() -> None:
    assert "build_requires" not in SoftwareSpec(python=("x",)).content()


built_cache: list[Any] = []  # the module's cache folder and sdist fetcher, for the cached re-build


@pytest.fixture(scope="module")
def built(docker_client, sdists, tmp_path_factory) -> Iterator[tuple[EnvImage, list[str]]]:
    def fetch(requirement: str, dest: Path, python: str | None = None) -> tuple[Path, str]:
        import hashlib
        import shutil

        src = sdists[requirement]
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest / src.name)
        return dest / src.name, hashlib.sha256(src.read_bytes()).hexdigest()

    cache = str(tmp_path_factory.getbasetemp() / "ale-cache")
    built_cache[:] = [cache, fetch]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALE_CACHE_DIR", cache)
        mp.setattr(wheel_builds, "fetch_sdist", fetch)
        lines: list[str] = []
        spec = SoftwareSpec(python=(GOOD, BROKEN))
        stale = f"{ENV_REPO}:{env_key(spec, docker_client.images.get(TOOLS_IMAGE).id)[:12]}"
        with contextlib.suppress(docker.errors.ImageNotFound):  # the builds are what is tested, not the cache
            docker_client.images.remove(stale)
        image = build_env_image(spec, client=docker_client, base_image=TOOLS_IMAGE, say=lines.append)
        yield image, lines


@pytest.mark.docker
def test_an_sdist_with_a_build_dependency_is_built_and_installed(docker_client, built) -> None:
    image, lines = built
    (good,) = [b for b in image.record["built"] if b["requirement"] == GOOD]
    assert good["wheel"].startswith("ale_sdist_demo_zz9-1.0-") and good["wheel_sha256"]
    assert good["build_requires"] == ["setuptools>=61", "six", "wheel"]
    assert good["how"].startswith("built from sdist")
    assert any(f["name"] == good["wheel"] for f in image.record["store"]["files"])
    assert any(f["name"].startswith("tabulate-") for f in image.record["store"]["files"])  # its dependency
    from ale.sandbox.env_image import _run_once

    out = _run_once(docker_client, image.tag, ["python3", "-c", "import ale_sdist_demo_zz9 as m, tabulate; "
                                                                "print(m.BUILT_WITH_SIX)"])
    assert out.strip().startswith("1.")  # six's version, read at build time in the build container


@pytest.mark.docker
def test_a_failed_build_is_missing_with_its_log_and_the_image_is_built_without_it(built) -> None:
    image, lines = built
    (broken,) = [b for b in image.record["built"] if b["requirement"] == BROKEN]
    assert broken["wheel"] is None and broken["error"] == "the build failed"
    assert "ale test: this sdist does not build" in broken["log"]
    (miss,) = [m for m in image.record["missing"] if m["name"] == BROKEN]
    assert "building it from its sdist" in miss["why"] and "this sdist does not build" in miss["why"]
    assert any("failed; the environment is built without it" in line for line in lines)


@pytest.mark.docker
def test_a_second_build_takes_the_cached_wheel(docker_client, built, monkeypatch) -> None:
    image, _ = built
    first = next(b for b in image.record["built"] if b["requirement"] == GOOD)
    monkeypatch.setenv("ALE_CACHE_DIR", built_cache[0])
    monkeypatch.setattr(wheel_builds, "fetch_sdist", built_cache[1])
    done, folder = wheel_builds.build_from_sdist(docker_client, GOOD, builder=first["builder"], extra=[],
                                                 download=lambda reqs, dest: pytest.fail("downloaded again"),
                                                 say=lambda _l: None)
    assert done.cached and folder is not None and done.wheel_sha256 == first["wheel_sha256"]
    assert json.loads(json.dumps(done.record()))["cached"] is True


def test_a_looser_requirement_is_met_by_the_wheel_built_for_an_exact_pin(tmp_path, monkeypatch) -> None:
    """ALE's nsclc_radiomics variant: the card's PyRadiomics is the catalogue's
    `pyradiomics==3.0.1` (built from its sdist), its `runtime_env/pyproject.toml` asks
    for a bare `pyradiomics`, whose newest sdist (3.1.0) does not build. The bare one is
    met by the wheel built for the pin, not built (and reported missing) on its own."""
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename

    from ale.sandbox import env_image
    from ale.sandbox.base import SandboxError

    builds: list[str] = []

    def build_from_sdist(client, requirement, *, builder, extra, download, say, python=None):
        builds.append(requirement)
        done = wheel_builds.Built(requirement=requirement, builder=builder, sdist="demo-x.tar.gz")
        if requirement != "demo==1.0":
            done.error = "the build failed"  # the newest sdist (2.0) does not build
            return done, None
        folder = tmp_path / "built"
        folder.mkdir()
        (folder / "demo-1.0-py3-none-any.whl").write_bytes(b"wheel")
        done.wheel = "demo-1.0-py3-none-any.whl"
        return done, folder

    def pip_download(reqs, dest, target, say, *, no_deps=False, find_links=None):
        links = [find_links] if isinstance(find_links, Path) else list(find_links or [])
        for r in map(Requirement, reqs):
            have = [w for link in links for w in link.glob("*.whl")
                    if parse_wheel_filename(w.name)[0] == r.name and parse_wheel_filename(w.name)[1] in r.specifier]
            if not have:  # PyPI has only sdists of `demo`
                raise SandboxError(f"ERROR: No matching distribution found for {r}")

    monkeypatch.setattr(wheel_builds, "build_from_sdist", build_from_sdist)
    monkeypatch.setattr(env_image, "pip_download", pip_download)
    monkeypatch.setattr(env_image, "builder_image", lambda *a, **k: "ale-env-builder:test")
    spec = SoftwareSpec(python=("demo==1.0",), store_only=("demo",))
    why = "no wheel for the image's interpreter and platform: ERROR: No matching distribution found for demo"
    # as the sets are resolved: the manifest's bare `demo` (store_only, and its pyproject) first
    missing = [{"name": "demo", "why": why}, {"name": "demo", "why": why}, {"name": "demo==1.0", "why": why}]
    wheels = tmp_path / "store"
    wheels.mkdir()
    lines: list[str] = []
    still, records = env_image._built_from_sdists(None, spec, "system", missing, wheels, {"machine": "x86_64"},
                                                  lines.append)
    assert still == []
    assert builds == ["demo==1.0"]  # the pin first; the bare requirement never built
    assert [r["requirement"] for r in records] == ["demo==1.0"] and records[0]["wheel"]
    assert (wheels / "demo-1.0-py3-none-any.whl").is_file()
    assert sum("met by a wheel built from an sdist here" in line for line in lines) == 2


def test_exact_pins() -> None:
    from ale.sandbox.env_image import _exact_pin

    assert _exact_pin("pyradiomics==3.0.1") and _exact_pin("a===1")
    assert not any(map(_exact_pin, ["pyradiomics", "a>=1", "a==1.*", "a==1,<2", "not a requirement!"]))


def test_an_index_giving_relative_file_urls_is_read_against_its_page(monkeypatch) -> None:
    """A mirror of PyPI's JSON API may give a file's URL relative to the page
    (``../../packages/...``: squidpy's, seen building ALE's corpus); it is resolved
    against the page, not refused as "unknown url type"."""
    from ale.sandbox import wheel_builds

    page = {"releases": {"1.8.3": [{"packagetype": "sdist", "filename": "squidpy-1.8.3.tar.gz",
                                    "url": "../../packages/a7/d8/squidpy-1.8.3.tar.gz",
                                    "digests": {"sha256": "0" * 64}}]}}
    monkeypatch.setattr(wheel_builds, "PYPI_JSON", "https://mirror.example/pypi")
    monkeypatch.setattr(wheel_builds.urllib.request, "urlopen",
                        lambda url, **_kw: contextlib.nullcontext(io.BytesIO(json.dumps(page).encode())))
    name, url, _sha = wheel_builds.find_sdist("squidpy")
    assert (name, url) == ("squidpy-1.8.3.tar.gz", "https://mirror.example/packages/a7/d8/squidpy-1.8.3.tar.gz")


def test_the_sdist_taken_is_the_newest_whose_requires_python_admits_the_image(monkeypatch) -> None:
    """squidpy 1.8.3's sdist requires Python >= 3.12: for a 3.11 image the newest
    release that admits 3.11 is taken (ALE's spatial transcriptomics task built with
    squidpy missing before)."""
    from ale.sandbox import wheel_builds

    def rel(v: str, rp: str | None) -> list[dict[str, Any]]:
        return [{"packagetype": "sdist", "filename": f"squidpy-{v}.tar.gz", "url": f"https://x/squidpy-{v}.tar.gz",
                 "digests": {"sha256": "0" * 64}, "requires_python": rp}]

    page = {"releases": {"1.8.3": rel("1.8.3", ">=3.12"), "1.6.5": rel("1.6.5", ">=3.10"), "1.2.0": rel("1.2.0", None)}}
    monkeypatch.setattr(wheel_builds.urllib.request, "urlopen",
                        lambda url, **_kw: contextlib.nullcontext(io.BytesIO(json.dumps(page).encode())))
    assert wheel_builds.find_sdist("squidpy", "3.11")[0] == "squidpy-1.6.5.tar.gz"
    assert wheel_builds.find_sdist("squidpy", "3.12")[0] == "squidpy-1.8.3.tar.gz"
    assert wheel_builds.find_sdist("squidpy")[0] == "squidpy-1.8.3.tar.gz"
