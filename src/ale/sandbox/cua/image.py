"""``ale image build --cua``: a cua-compatible image built here, with no registry.

1. A Debian 13 (trixie) root from Debian packages (``images/bootstrap-base.sh``:
   debootstrap, then ``docker import``): cua's computer-server needs Python >=3.12
   and Debian 12 has 3.11. With it: ``python3-evdev`` (no wheel on PyPI; it needs a
   compiler), numpy (as the tools image has it), Xvfb and ``x11-xserver-utils``
   (pymonctl, which computer-server imports, exits without ``xrandr`` when a display is
   set).
2. The wheels of ``cua-computer-server`` and its dependencies, downloaded on the
   host with the host's pip for the root's Python and platform (a build container
   cannot verify PyPI's certificate here), with an empty placeholder wheel named
   ``evdev`` beside them so the resolver takes Debian's (the placeholder is not kept).
3. ``images/cua``: a venv (``--system-site-packages``) installed from those wheels
   with no index, a non-root user 1000, and ``/opt/cua/computer-server`` (Xvfb when
   there is no display, then ``python -m computer_server``) as the entrypoint.

Cached by content: ``ale-cua:<key12>``, key = sha256(images/cua, the base image's
id, the requirements); a second build is a lookup. Tagged ``ale-cua:latest`` too.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import tempfile
import zipfile
from pathlib import Path

import docker

from ale.sandbox.base import SandboxError
from ale.sandbox.docker import connect
from ale.sandbox.env_image import (
    _build,
    _refuse_volumes,
    _run_once,
    _world_readable,
    pip_download,
    probe_platform,
)
from ale.sandbox.image import Say, _dir_digest, _has_image, _sha, bootstrap_base, images_dir
from ale.sandbox.releases import debian

CUA_REPO = "ale-cua"
DEFAULT_CUA_IMAGE = f"{CUA_REPO}:latest"
CUA_SUITE = "trixie"
CUA_PACKAGES = "python3,python3-venv,python3-evdev,python3-numpy,procps,xvfb,x11-xserver-utils"
CUA_SERVER = "cua-computer-server==0.3.46"
# The newest fastapi refuses computer-server's websocket_max_size argument at import.
CUA_REQUIREMENTS = (CUA_SERVER, "fastapi<0.140")


def _placeholder_wheel(folder: Path, name: str, version: str) -> Path:
    """An empty wheel ``name==version`` (metadata only) for the resolver."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: ale\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    path = folder / f"{name}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(text)}")
        z.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    return path


def _debian_version(client: docker.DockerClient, image: str, module: str) -> str:
    out = _run_once(client, image, ["python3", "-c", f"import importlib.metadata as m; print(m.version({module!r}))"])
    return out.strip().splitlines()[-1]


def build_cua_image(client: docker.DockerClient | None = None, tag: str = DEFAULT_CUA_IMAGE, say: Say = print) -> str:
    """Build (or find cached) the cua-compatible image; returns its content tag."""
    if client is None:
        client = connect()
    base_ref = bootstrap_base(client, say, release=debian(CUA_SUITE), packages=CUA_PACKAGES)
    base_id = _has_image(client, base_ref) or ""
    folder = images_dir() / "cua"
    key = _sha(_dir_digest(folder), base_id, *CUA_REQUIREMENTS)[:12]
    content_tag = f"{CUA_REPO}:{key}"
    if _has_image(client, content_tag) is None:
        target = probe_platform(client, base_ref)
        evdev = _debian_version(client, base_ref, "evdev")
        say(f"building {content_tag} FROM {base_ref} (Python {target['python_full']}, {CUA_SERVER})...")
        with tempfile.TemporaryDirectory() as tmp:
            ctx, links = Path(tmp) / "ctx", Path(tmp) / "links"
            shutil.copytree(folder, ctx)
            (ctx / "wheels").mkdir()
            links.mkdir()
            _placeholder_wheel(links, "evdev", evdev)
            pip_download(CUA_REQUIREMENTS, ctx / "wheels", target, say, find_links=links)
            for w in (ctx / "wheels").glob("evdev-*.whl"):
                w.unlink()
            _world_readable(ctx)
            _build(client, ctx, "Dockerfile", tag=content_tag, buildargs={"BASE": base_ref, "CUA_SERVER": CUA_SERVER},
                   labels={"org.ale.content-key": key}, say=say, what="the cua image")
    else:
        say(f"cua image {content_tag} is cached")
    image = _refuse_volumes(client, content_tag)
    if not image.tag(*tag.split(":", 1)):
        raise SandboxError(f"cannot tag {content_tag} as {tag}")
    return content_tag
