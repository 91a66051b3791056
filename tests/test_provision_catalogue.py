"""The software catalogue: loading and validating it, matching free-form names (case,
punctuation, version suffixes, aliases, parentheticals, lists), and what it cannot
provide being reported with why."""

from __future__ import annotations

import json

import pytest

from ale.provision.catalogue import (
    CATALOGUE_FILE,
    CatalogueError,
    Entry,
    load_catalogue,
    normalize,
    parse_catalogue,
    parse_name,
    split_names,
    version_satisfies,
)
from ale.provision.needs import _Merge

# A handful of names as ALE's Linux cards write them, and the entry each must match.
REPRESENTATIVE = {
    "Python": "python",
    "NumPy": "numpy",
    "numpy": "numpy",
    "pandas": "pandas",
    "SciPy": "scipy",
    "scikit-learn": "scikit-learn",
    "sklearn": "scikit-learn",
    "PyTorch (CPU)": "pytorch",
    "R": "r",
    "Rscript": "rscript",
    "uv": "uv",
    "BEDTools": "bedtools",
    "NCBI BLAST+": "ncbi-blast+",
    "ncbi-blast+": "ncbi-blast+",
    "LibreOffice Calc": "libreoffice-calc",
    "libreoffice-calc": "libreoffice-calc",
    "GNU Octave": "octave",
    "GNU sort": "coreutils",
    "g++ (C++17)": "g++",
    "Pillow": "pillow",
    "AnnData": "anndata",
    "pdftotext": "poppler-utils",
    "SQLite": "sqlite",
    "xdg-open": "xdg-open",
    "Docker": "docker",
    "UCBShift (CSpred)": "ucbshift",
    "X-EISD (xeisd)": "x-eisd",
    "LEAP 1.26 (leaptorch)": "leap",
}


def _match(name: str) -> str | None:
    cat = load_catalogue()
    idx = cat.index()
    for k in parse_name(name).candidates:
        if k in idx:
            return idx[k].name
    return None


def test_the_shipped_catalogue_loads_and_every_entry_is_valid() -> None:
    cat = load_catalogue()
    assert len(cat.entries) > 150
    assert cat.base_python == "3.11"
    for e in cat.entries:
        assert e.unavailable is not None or e.check, f"{e.name}: a providable entry has a check command"
    # the data file is what ships: one entry a line, valid JSON
    assert json.loads(CATALOGUE_FILE.read_text())["entries"]


@pytest.mark.parametrize(("name", "entry"), sorted(REPRESENTATIVE.items()))
def test_names_match_without_regard_to_case_punctuation_versions_and_aliases(name: str, entry: str) -> None:
    assert _match(name) == entry


def test_normalize_keeps_letters_digits_and_plus() -> None:
    assert normalize("NCBI BLAST+") == normalize("ncbi-blast+") == "ncbiblast+"
    assert normalize("Scikit_Learn") == normalize("scikit-learn")


def test_version_suffixes_are_parsed() -> None:
    p = parse_name("Python 3.12")
    assert p.version == "3.12" and not p.at_least and "python" in p.candidates
    p = parse_name("Python 3.10+")
    assert p.version == "3.10" and p.at_least
    p = parse_name("Sabaki v0.52.2")
    assert p.version == "0.52.2" and "sabaki" in p.candidates
    p = parse_name("LEAP 1.26 (leaptorch)")
    assert p.version == "1.26" and {"leap", "leaptorch"} <= set(p.candidates)
    p = parse_name("python3.12")
    assert p.version == "3.12" and "python" in p.candidates
    assert parse_name("BWA-MEM2").version is None  # a digit inside a name is not a version
    assert parse_name("h5py").version is None


def test_lists_in_one_item_are_split_but_task_paths_stay_whole() -> None:
    assert split_names("Amber 22 / SLURM / CUDA 11.6.2 (reference environment only)") == [
        "Amber 22", "SLURM", "CUDA 11.6.2 (reference environment only)"]
    assert split_names("sbt 1.9+ with Chisel 6.5.0") == ["sbt 1.9+", "Chisel 6.5.0"]
    assert split_names("nf-core/sarek") == ["nf-core/sarek"]
    assert split_names("AmberTools 23 via software/run_ambertools.sh") == ["AmberTools 23 via software/run_ambertools.sh"]


def test_version_satisfies() -> None:
    assert version_satisfies("3.11", "3", False)
    assert version_satisfies("3.11", "3.10", True)
    assert not version_satisfies("3.11", "3.10", False)
    assert not version_satisfies("0.23", "0.33", True)
    assert version_satisfies("3.11.2", "3.11", False)


def _resolve(*names: str) -> _Merge:
    m = _Merge(load_catalogue())
    for n in names:
        m.item(n, "test")
    return m


def test_providable_names_resolve_to_packages() -> None:
    m = _resolve("pandas", "BEDTools", "PyTorch", "NumPy", "Python 3.10+", "SimGlucose 0.2.11")
    assert not m.missing
    spec = m.spec()
    assert "pandas" in spec.python and "simglucose==0.2.11" in spec.python
    assert {"bedtools", "python3-torch"} <= set(spec.debian)
    assert "numpy" in spec.store_only and "numpy" not in spec.python  # the tools image has it installed
    by = {n.name: n for n in m.needs}
    assert by["NumPy"].provided_by.base and by["Python 3.10+"].provided_by.base
    assert by["BEDTools"].check == "bedtools --version"


def test_unprovidable_and_unknown_names_are_reported_with_why() -> None:
    m = _resolve("Docker", "CUDA 11.6.2", "Amber 22", "Python 3.9", "Yosys 0.99+",
                 "Frobnicator 9000")
    kinds = {x.name: x.kind for x in m.missing}
    assert kinds == {"Docker": "container", "CUDA 11.6.2": "gpu", "Amber 22": "licensed",
                     "Python 3.9": "version", "Yosys 0.99+": "version",
                     "Frobnicator 9000": "unknown"}
    why = {x.name: x.why for x in m.missing}
    assert "not in the catalogue" in why["Frobnicator 9000"]
    assert "3.11" in why["Python 3.9"] and "0.23" in why["Yosys 0.99+"]
    assert not m.needs and m.spec().empty


def test_a_malformed_catalogue_is_refused_naming_the_entry() -> None:
    with pytest.raises(CatalogueError, match=r"entry 'x'.debian: .*not a Debian package name"):
        parse_catalogue({"entries": [{"name": "x", "debian": ["Not A Package"], "check": "true"}]}, "cat.json")
    with pytest.raises(CatalogueError, match="names no package"):
        parse_catalogue({"entries": [{"name": "x"}]}, "cat.json")
    with pytest.raises(CatalogueError, match="names both"):
        parse_catalogue({"entries": [{"name": "a", "base": True}, {"name": "b", "aliases": ["A"], "base": True}]}, "c")
    with pytest.raises(CatalogueError, match=r"entry 'x'.debain: unknown key"):
        parse_catalogue({"entries": [{"name": "x", "base": True, "debain": []}]}, "c")


def test_extra_entries_take_precedence() -> None:
    cat = load_catalogue().with_entries([Entry(name="Docker", python=["docker"], check="true")])
    assert cat.lookup("docker") is not None and cat.lookup("docker").python == ["docker"]  # type: ignore[union-attr]
    assert cat.lookup("docker-compose") is not None  # the rest is kept
