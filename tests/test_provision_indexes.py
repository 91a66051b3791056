"""A declared name no catalogue entry claims is resolved against the package indexes
themselves: a Debian package of that very name, else a PyPI project with a wheel for
the image's interpreter; recorded as such, never matched where the catalogue says an
index must not decide. Trees written here; the indexes faked, then the real ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from ale.provision.catalogue import load_catalogue
from ale.provision.indexes import DEBIAN_INDEX, PYPI_INDEX, Found, SystemIndexes
from ale.provision.needs import resolve_needs, software_summary
from tests.conftest import require
from tests.test_provision_needs import LINUX, task


class FakeIndexes:
    """Debian and PyPI as this test says; records what it was asked."""

    unavailable: str | None = None

    def __init__(self, debian: dict[str, str], wheels: dict[str, str]) -> None:
        self.deb, self.wheels, self.asked = debian, wheels, []

    def debian(self, name: str) -> Found | None:
        self.asked.append(("debian", name))
        return Found(DEBIAN_INDEX, name, self.deb[name]) if name in self.deb else None

    def pypi_wheel(self, name: str, python: str) -> Found | None:
        self.asked.append(("pypi", name, python))
        return Found(PYPI_INDEX, name, self.wheels[name]) if name in self.wheels else None


def test_a_debian_only_and_a_pypi_only_name_absent_from_the_catalogue(tmp_path: Path) -> None:
    idx = FakeIndexes({"wireshark": "4.0.17-0+deb12u3"}, {"pyogrio": "0.13.0"})
    d = task(tmp_path, "geo", {"vm": LINUX, "software": ["Wireshark", "PyOgrio", "Frobnicator"]})
    p = resolve_needs(d, indexes=idx)
    by = {n.name: n for n in p.needs}
    assert by["Wireshark"].provided_by.debian == ["wireshark"] and by["Wireshark"].source == DEBIAN_INDEX
    assert by["Wireshark"].check == "dpkg -s wireshark >/dev/null"
    assert by["PyOgrio"].provided_by.python == ["pyogrio"] and by["PyOgrio"].source == PYPI_INDEX
    assert "wireshark" in p.spec.debian and "pyogrio" in p.spec.python
    # What no index has stays missing, saying what was asked.
    (miss,) = p.missing
    assert miss.name == "Frobnicator" and miss.kind == "unknown" and "no PyPI wheel for Python 3.11" in miss.why
    summary = software_summary(p)
    assert summary["provisioned"] == ["Wireshark", "PyOgrio"]
    assert {b["name"]: b["source"] for b in summary["by_index"]} == {"Wireshark": DEBIAN_INDEX, "PyOgrio": PYPI_INDEX}
    assert "matched by name in Debian's index: wireshark 4.0.17" in by["Wireshark"].note


def test_the_catalogue_comes_first_and_debian_before_pypi(tmp_path: Path) -> None:
    idx = FakeIndexes({"bedtools": "2.30", "fiona": "1.9.0-1"}, {"fiona": "1.10.1", "bedtools": "0.1"})
    d = task(tmp_path, "t", {"vm": LINUX, "software": ["BEDTools", "Fiona"]})
    p = resolve_needs(d, indexes=idx)
    by = {n.name: n for n in p.needs}
    assert by["BEDTools"].source is None and by["BEDTools"].entry  # a catalogue entry: no index asked for it
    assert ("debian", "bedtools") not in idx.asked
    assert by["Fiona"].source == DEBIAN_INDEX and by["Fiona"].provided_by.debian == ["fiona"]


def test_an_ambiguous_name_is_not_matched_blindly(tmp_path: Path) -> None:
    """A PyPI project of the same name that is something else: the catalogue's
    ``not_by_index`` decides, the listing says why, and no index is asked."""
    cat = load_catalogue().model_copy(update={"not_by_index": {"tracer": "PyPI's tracer is a logging helper, not the cell tracer"}})
    idx = FakeIndexes({}, {"tracer": "1.0"})
    d = task(tmp_path, "neuro", {"vm": LINUX, "software": ["Tracer"]})
    p = resolve_needs(d, indexes=idx, catalogue=cat)
    (miss,) = p.missing
    assert "not matched by name in a package index" in miss.why and "cell tracer" in miss.why
    assert idx.asked == []


def test_a_version_asked_for_is_held_to(tmp_path: Path) -> None:
    idx = FakeIndexes({"gizmo": "1:0.23-6"}, {"rasterio": "1.4.3"})
    d = task(tmp_path, "eda", {"vm": LINUX, "software": ["Gizmo 0.33+", "rasterio 1.4"]})
    p = resolve_needs(d, indexes=idx)
    (miss,) = p.missing
    assert miss.name == "Gizmo 0.33+" and miss.kind == "version" and "gizmo 1:0.23-6" in miss.why
    (need,) = p.needs
    assert need.provided_by.python == ["rasterio==1.4.*"]
    ok = resolve_needs(task(tmp_path, "eda2", {"vm": LINUX, "software": ["Gizmo 0.2+"]}), indexes=idx)
    assert ok.complete and ok.needs[0].provided_by.debian == ["gizmo"]


def test_indexes_off_say_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ALE_PACKAGE_INDEXES", "off")
    d = task(tmp_path, "t", {"vm": LINUX, "software": ["Wireshark"]})
    (miss,) = resolve_needs(d).missing
    assert "ALE_PACKAGE_INDEXES=off" in miss.why


def test_the_real_indexes(tmp_path: Path, monkeypatch) -> None:
    """This machine's apt-cache and pip: KiCad and Wireshark are Debian 12 packages,
    pyogrio has a wheel for 3.11, PyRadiomics is the catalogue's (built from its sdist), and the
    answers are cached on disk."""
    require(shutil.which("apt-cache"), "apt-cache (Debian's package tools)")
    has_lists = subprocess.run(["apt-cache", "show", "--no-all-versions", "bash"], capture_output=True).returncode == 0
    require(has_lists, "Debian's package lists (apt-get update)")
    monkeypatch.delenv("ALE_PACKAGE_INDEXES", raising=False)
    cache = tmp_path / "idx.json"
    idx = SystemIndexes(cache)
    d = task(tmp_path, "t", {"vm": LINUX, "software": ["KiCad", "Wireshark", "pyogrio", "PyRadiomics"]})
    p = resolve_needs(d, indexes=idx)
    by = {n.name: n for n in p.needs}
    assert by["KiCad"].provided_by.debian == ["kicad"] and by["Wireshark"].provided_by.debian == ["wireshark"]
    assert {m.name for m in p.missing} <= {"PyRadiomics", "pyogrio"}
    if "pyogrio" in by:  # PyPI answered (the registry is reachable here)
        assert by["pyogrio"].source == PYPI_INDEX
    cached = json.loads(cache.read_text())
    assert "debian:kicad" in cached and cached["debian:kicad"][1]["package"] == "kicad"
    # The second resolution asks nothing: the cache answers.
    os.environ["PATH"], old = "/nonexistent", os.environ["PATH"]
    try:
        again = SystemIndexes(cache)
        assert again.debian("kicad") is not None
    finally:
        os.environ["PATH"] = old
