"""Build the tools image, FROM a pullable base or a Debian base bootstrapped here.

Both images are cached by content: the base by its bootstrap recipe, the tools
image by its Dockerfile and the base image's id. A second build is a lookup.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors

from ale.defaults import DEFAULT_TOOLS_IMAGE, TOOLS_REPO
from ale.paths import cache_dir, repo_root
from ale.sandbox.base import SandboxError
from ale.sandbox.desktop import DEFAULT_DESKTOP_IMAGE, DESKTOP_REPO
from ale.sandbox.docker import connect
from ale.sandbox.releases import Release, debian

DEFAULT_BASE = "python:3.11-slim"
BOOTSTRAP_SUITE = "bookworm"
BOOTSTRAP_PACKAGES = "python3,python3-numpy,procps"
#: a bootstrap (debootstrap's downloads, an Ubuntu root's upgrade) past this is stopped
BOOTSTRAP_TIMEOUT_S = float(os.environ.get("ALE_BOOTSTRAP_TIMEOUT_S", "1800"))

Say = Callable[[str], None]


def images_dir() -> Path:
    root = repo_root()
    if root is None:
        raise SandboxError("cannot find images/Dockerfile: run ale from its source checkout")
    return root / "images"


def _has_image(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def bootstrap_base(
    client: docker.DockerClient, say: Say = print, *, release: Release = debian(BOOTSTRAP_SUITE),
    packages: str = BOOTSTRAP_PACKAGES,
) -> str:
    """A base image made from a release's packages (debootstrap + docker import):
    ``release`` (Debian's or Ubuntu's) with ``packages`` (comma-separated), cached by
    that recipe."""
    script = images_dir() / "bootstrap-base.sh"
    mirror = release.mirror
    args = [release.suite, mirror, packages]
    if release.distro != "debian":
        keyring = release.keyring(say)
        args += [keyring, release.components, release.updates, release.script]
        key = _sha(script.read_bytes(), *args[:3], release.distro, Path(keyring).read_bytes(), *args[4:])[:12]
        tag = f"ale-base:{release.distro}-{release.suite}-{key}"
    else:
        key = _sha(script.read_bytes(), *args)[:12]
        tag = f"ale-base:{release.suite}-{key}"
    if _has_image(client, tag):
        say(f"base image {tag} is cached")
        return tag
    say(f"bootstrapping a {release.label} base from {mirror} (about a minute)...")
    # its own session: past the bound, the script and debootstrap's downloads are killed together
    proc = subprocess.Popen(["sh", str(script), tag, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _out, err = proc.communicate(timeout=BOOTSTRAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise SandboxError(f"bootstrapping the {release.label} base image from {mirror} took over "
                           f"{BOOTSTRAP_TIMEOUT_S:.0f} s (its mirror unreachable?); stopped") from None
    except BaseException:  # Ctrl-C: nothing of it is left running
        _kill_group(proc)
        raise
    if proc.returncode != 0 or not _has_image(client, tag):
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise SandboxError(f"bootstrapping the {release.label} base image failed (exit {proc.returncode}):\n{tail}")
    return tag


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def resolve_base(client: docker.DockerClient, base: str | None, say: Say = print) -> str:
    """Use `base` if present locally or pullable; otherwise bootstrap a Debian base."""
    if base == "debian-bootstrap":
        return bootstrap_base(client, say)
    base = base or DEFAULT_BASE
    if _has_image(client, base):
        return base
    try:
        say(f"pulling {base}...")
        client.images.pull(base)
        return base
    except docker.errors.APIError as e:
        say(f"cannot pull {base} ({str(e.explanation or e)[:120]}); bootstrapping instead")
    return bootstrap_base(client, say)


def build_tools_image(
    client: docker.DockerClient | None = None,
    base: str | None = None,
    tag: str = DEFAULT_TOOLS_IMAGE,
    say: Say = print,
) -> str:
    """Build (or find cached) the tools image; returns its content tag.
    ``client`` defaults to the local engine (``EngineUnreachable`` if none)."""
    if client is None:
        client = connect()
    base_ref = resolve_base(client, base, say)
    base_id = _has_image(client, base_ref) or ""
    dockerfile = images_dir() / "Dockerfile"
    key = _sha(dockerfile.read_bytes(), base_id)[:12]
    content_tag = f"{TOOLS_REPO}:{key}"
    image_id = _has_image(client, content_tag)
    if image_id is None:
        say(f"building {content_tag} FROM {base_ref}...")
        try:
            image, _logs = client.images.build(
                path=str(images_dir()),
                dockerfile="Dockerfile",
                buildargs={"BASE": base_ref},
                tag=content_tag,
                rm=True,
                pull=False,
                labels={"org.ale.content-key": key},
            )
        except docker.errors.BuildError as e:
            log = "".join(str(x.get("stream", x.get("error", ""))) for x in e.build_log)
            raise SandboxError(f"building the tools image failed: {e.msg}\n{log[-2000:]}") from e
        image_id = image.id
    else:
        say(f"tools image {content_tag} is cached")
    volumes = (client.images.get(content_tag).attrs.get("Config") or {}).get("Volumes")
    if volumes:
        raise SandboxError(f"{content_tag} declares VOLUME {sorted(volumes)}; it must declare none")
    client.images.get(content_tag).tag(*tag.split(":", 1))
    return content_tag


def _dir_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# cua-bench's window template loads Tailwind's browser build from a CDN, which a
# sealed sandbox cannot reach: the desktop image serves the same build. It comes
# from the npm registry at build time (never committed here), pinned by sha256.
TAILWIND_PACKAGE = "@tailwindcss/browser@4.3.4"
TAILWIND_FILE = "tailwindcss-browser-4.3.4.js"
TAILWIND_SHA256 = "e54f393a8f716e47e9e21b916e934d42793dfb6ed65988583dcc3456dcb012aa"


def _tailwind(say: Say) -> tuple[bytes, bytes]:
    """(the browser build, its LICENSE), cached by digest under the cache folder."""
    cache = cache_dir() / "npm" / TAILWIND_SHA256
    js, lic = cache / TAILWIND_FILE, cache / "LICENSE"
    if not (js.is_file() and hashlib.sha256(js.read_bytes()).hexdigest() == TAILWIND_SHA256 and lic.is_file()):
        say(f"fetching {TAILWIND_PACKAGE} from the npm registry (npm pack)")
        with tempfile.TemporaryDirectory() as tmp:
            try:
                subprocess.run(["npm", "pack", TAILWIND_PACKAGE, "--silent"], cwd=tmp, check=True,
                               capture_output=True, text=True, timeout=300)
                tgz = next(Path(tmp).glob("*.tgz"))
                with tarfile.open(tgz) as tar:
                    data = {m.name: tar.extractfile(m).read() for m in tar.getmembers()  # type: ignore[union-attr]
                            if m.name in ("package/dist/index.global.js", "package/LICENSE")}
            except (OSError, subprocess.SubprocessError, StopIteration, tarfile.TarError) as e:
                raise SandboxError(f"cannot fetch {TAILWIND_PACKAGE} with npm "
                                   f"(the desktop image serves it): {e}") from e
        build = data.get("package/dist/index.global.js", b"")
        if hashlib.sha256(build).hexdigest() != TAILWIND_SHA256:
            raise SandboxError(f"{TAILWIND_PACKAGE}: dist/index.global.js is not the pinned build (sha256 "
                               f"{TAILWIND_SHA256})")
        cache.mkdir(parents=True, exist_ok=True)
        js.write_bytes(build)
        lic.write_bytes(data.get("package/LICENSE", b""))
    return js.read_bytes(), lic.read_bytes()


def build_desktop_image(
    client: docker.DockerClient | None = None,
    base: str | None = None,
    tag: str = DEFAULT_DESKTOP_IMAGE,
    say: Say = print,
) -> str:
    """Build (or find cached) the desktop image ``FROM`` the tools image: Xvfb,
    openbox, xdotool, Chromium (from Debian's packages, apt inside the build) and
    ale's desktop helper. Cached by the content of ``images/desktop`` and the
    tools image's id; returns its content tag."""
    if client is None:
        client = connect()
    tools_ref = build_tools_image(client, base=base, say=say)
    tools_id = _has_image(client, tools_ref) or ""
    folder = images_dir() / "desktop"
    mirror = os.environ.get("ALE_DEBIAN_MIRROR", "")
    key = _sha(_dir_digest(folder), tools_id, mirror, TAILWIND_SHA256)[:12]
    content_tag = f"{DESKTOP_REPO}:{key}"
    if _has_image(client, content_tag) is None:
        say(f"building {content_tag} FROM {tools_ref} (apt: Xvfb, openbox, xdotool, Chromium; a few minutes)...")
        js, lic = _tailwind(say)
        try:
            with tempfile.TemporaryDirectory() as ctx:
                shutil.copytree(folder, ctx, dirs_exist_ok=True)
                (Path(ctx) / "vendor").mkdir(exist_ok=True)
                (Path(ctx) / "vendor" / TAILWIND_FILE).write_bytes(js)
                (Path(ctx) / "vendor" / "tailwindcss-LICENSE").write_bytes(lic)
                client.images.build(
                    path=ctx, dockerfile="Dockerfile", buildargs={"TOOLS": tools_ref}, tag=content_tag,
                    rm=True, pull=False, labels={"org.ale.content-key": key},
                )
        except docker.errors.BuildError as e:
            log = "".join(str(x.get("stream", x.get("error", ""))) for x in e.build_log)
            raise SandboxError(f"building the desktop image failed: {e.msg}\n{log[-2000:]}") from e
    else:
        say(f"desktop image {content_tag} is cached")
    image = client.images.get(content_tag)
    if (image.attrs.get("Config") or {}).get("Volumes"):
        raise SandboxError(f"{content_tag} declares a VOLUME; it must declare none")
    image.tag(*tag.split(":", 1))
    return content_tag
