"""The distribution releases ale bootstraps base images from (debootstrap, then ``docker
import``: ``images/bootstrap-base.sh``), with no container registry.

Debian's releases come from the Debian mirror and are checked with debootstrap's own
keyring. Ubuntu's come from Ubuntu's archive (``ALE_UBUNTU_MIRROR``) and are checked with
Ubuntu's archive keyring, which itself comes as a Debian package (``ubuntu-keyring``,
from Debian trixie: fetched by apt, whose signature chain is Debian's archive keyring);
an operator whose host has the keyring installed, or who names one with
``ALE_UBUNTU_KEYRING``, uses that. An Ubuntu root is upgraded to its release's
``-updates`` and ``-security`` suites, as an installed Ubuntu machine (ALE's
``cpu-free-ubuntu`` VM among them) would be.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ale.paths import cache_dir
from ale.sandbox.base import SandboxError

Say = Callable[[str], None]

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
UBUNTU_KEYRING_HOST = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
#: the Debian release whose ``ubuntu-keyring`` package holds Ubuntu's archive keys
KEYRING_SUITE = "trixie"
UBUNTU_VERSIONS = {"jammy": "22.04", "noble": "24.04"}


@dataclass(frozen=True)
class Release:
    """A release a base image is bootstrapped from."""

    distro: str  # "debian" or "ubuntu"
    suite: str

    @property
    def label(self) -> str:
        if self.distro == "ubuntu":
            return f"Ubuntu {UBUNTU_VERSIONS.get(self.suite, self.suite)} ({self.suite})"
        return f"Debian {self.suite}"

    @property
    def mirror(self) -> str:
        if self.distro == "ubuntu":
            return os.environ.get("ALE_UBUNTU_MIRROR", "http://archive.ubuntu.com/ubuntu")
        return os.environ.get("ALE_DEBIAN_MIRROR", "http://deb.debian.org/debian")

    @property
    def components(self) -> str:
        # universe: most of what a task's Debian names are, in Ubuntu, is there
        return "main,universe" if self.distro == "ubuntu" else "main"

    @property
    def updates(self) -> str:
        return f"{self.suite}-updates,{self.suite}-security" if self.distro == "ubuntu" else ""

    @property
    def script(self) -> str:
        """debootstrap's script, for a suite it does not know by name (Debian 12's
        debootstrap predates noble): Ubuntu's are all ``gutsy``'s."""
        if self.distro == "ubuntu" and not Path(f"/usr/share/debootstrap/scripts/{self.suite}").exists():
            return "/usr/share/debootstrap/scripts/gutsy"
        return ""

    def keyring(self, say: Say = print) -> str:
        """The keyring the archive's signatures are checked with ("" for debootstrap's own)."""
        return str(ubuntu_keyring(say)) if self.distro == "ubuntu" else ""


def debian(suite: str) -> Release:
    return Release("debian", suite)


def ubuntu(suite: str) -> Release:
    return Release("ubuntu", suite)


def ubuntu_keyring(say: Say = print) -> Path:
    """Ubuntu's archive keyring: ``ALE_UBUNTU_KEYRING``, the host's (package
    ``ubuntu-keyring``), or the one in Debian trixie's ``ubuntu-keyring`` package, fetched
    once with apt (signatures checked against Debian's archive keyring) and cached."""
    named = os.environ.get("ALE_UBUNTU_KEYRING")
    if named:
        if not Path(named).is_file():
            raise SandboxError(f"ALE_UBUNTU_KEYRING={named}: no such file (unset it to fetch Ubuntu's keyring)")
        return Path(named)
    if UBUNTU_KEYRING_HOST.is_file():
        return UBUNTU_KEYRING_HOST
    cached = cache_dir() / "keyrings" / "ubuntu-archive-keyring.gpg"
    if cached.is_file():
        return cached
    if not DEBIAN_KEYRING.is_file():
        raise SandboxError(f"{DEBIAN_KEYRING} is missing (apt-get install debian-archive-keyring): it checks the "
                           "package that carries Ubuntu's archive keyring; or set ALE_UBUNTU_KEYRING to a keyring file")
    say(f"fetching Ubuntu's archive keyring (Debian {KEYRING_SUITE}'s ubuntu-keyring package, checked by apt)...")
    with tempfile.TemporaryDirectory(prefix="ale-keyring-") as tmp:
        t = Path(tmp)
        for d in ("lists/partial", "cache/archives/partial", "dl", "x"):
            (t / d).mkdir(parents=True)
        (t / "sources.list").write_text(
            f"deb [signed-by={DEBIAN_KEYRING}] {debian(KEYRING_SUITE).mirror} {KEYRING_SUITE} main\n")
        opts = [f"-o=Dir::Etc::SourceList={t / 'sources.list'}", "-o=Dir::Etc::SourceParts=/dev/null",
                f"-o=Dir::State::Lists={t / 'lists'}", f"-o=Dir::Cache={t / 'cache'}",
                "-o=Dir::State::Status=/dev/null", "-o=APT::Sandbox::User=root", "-o=Acquire::Check-Valid-Until=false"]
        steps = ((["apt-get", *opts, "-q", "update"], t),
                 (["apt-get", *opts, "-q", "download", "ubuntu-keyring"], t / "dl"))
        for argv, cwd in steps:
            proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
            if proc.returncode != 0:
                what = " ".join(argv[len(opts) + 2:])
                raise SandboxError(f"fetching Debian {KEYRING_SUITE}'s ubuntu-keyring failed "
                                   f"(apt-get {what}, exit {proc.returncode}): {proc.stderr.strip()[-600:]}; "
                                   "set ALE_UBUNTU_KEYRING to a copy of Ubuntu's archive keyring instead")
        debs = sorted((t / "dl").glob("ubuntu-keyring_*.deb"))
        if not debs:
            raise SandboxError(f"apt downloaded no ubuntu-keyring package from Debian {KEYRING_SUITE}")
        deb = debs[-1]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(t / "x")], check=True, capture_output=True)
        got = t / "x" / UBUNTU_KEYRING_HOST.relative_to("/")
        if not got.is_file():
            raise SandboxError(f"{deb.name} holds no {UBUNTU_KEYRING_HOST}")
        cached.parent.mkdir(parents=True, exist_ok=True)
        part = cached.with_suffix(".part")
        shutil.copyfile(got, part)
        os.replace(part, cached)
    return cached
