"""``ale image build --vm``: a Linux test guest for ``--provider qemu``, built here from
Debian packages with no registry but Debian's (and PyPI's, for computer-server).

1. The kernel: Debian 12's ``linux-image-6.1.0-N-amd64`` (``apt-get download``, then
   ``dpkg-deb -x``): its ``vmlinuz`` and the few modules the guest needs.
2. A small initrd made here: a cpio (newc, gzip) of the host's ``busybox`` (Debian's
   ``busybox-static``), those modules and an ``/init`` that loads them, mounts
   ``/dev/vda`` and ``switch_root``s to ``/sbin/ale-init``.
3. The root: the cua-compatible image's (``ale image build --cua``: Debian 13, Python
   3.13, cua's computer-server in /opt/cua, Xvfb, the candidate user 1000), exported from
   Docker, plus ale's guest agent as ``/sbin/ale-init`` (``guest_agent.py``); its
   manifest names the server command and the screen (``guest_server``).
4. ``mkfs.ext4 -d ROOT`` on a sparse file, ``qemu-img convert -O qcow2``: the base
   disk, made read-only (0444), its sha256 beside it (``base.qcow2.sha256``).

Cached by content under ``<cache>/vm/<key12>/`` (key: the cua image's id, the kernel
package's version, busybox's digest, the guest agent and init sources); ``<cache>/vm/latest``
names the newest build. A second build is a lookup.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.paths import cache_dir
from ale.sandbox.base import ImageMissing, SandboxError
from ale.sandbox.image import Say

VM_REPO = "ale-vm"
DEFAULT_VM_IMAGE = f"{VM_REPO}:latest"
KERNEL_PATTERN = r"^linux-image-6\.1\.0-[0-9]+-amd64$"
# The modules the guest needs, in load order (dependencies first); Debian builds them as modules.
MODULES = (
    "drivers/virtio/virtio_ring", "drivers/virtio/virtio", "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci_modern_dev", "drivers/virtio/virtio_pci", "drivers/block/virtio_blk",
    "drivers/char/virtio_console", "lib/crc16", "crypto/crc32c_generic", "lib/libcrc32c", "fs/mbcache",
    "fs/jbd2/jbd2", "fs/ext4/ext4", "fs/netfs/netfs", "fs/fscache/fscache", "net/9p/9pnet",
    "net/9p/9pnet_virtio", "fs/9p/9p",
)


def initrd_init(root: str = "/dev/vda", init: str = "/sbin/ale-init", tag: str = "ale-initrd") -> str:
    """The initrd's ``/init``: load the modules, wait for ``root``, mount it and
    ``switch_root`` to ``init`` (ale's guest; the foreign test disk's with its own)."""
    return f"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /newroot
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
for m in $(/bin/busybox cat /modules.list); do /bin/busybox insmod /lib/modules/$m.ko 2>/dev/null; done
echo "[{tag}] modules loaded"
for i in $(/bin/busybox seq 1 100); do [ -b {root} ] && break; /bin/busybox sleep 0.05; done
/bin/busybox mount -t ext4 -o rw {root} /newroot || {{ echo "[{tag}] cannot mount {root}"; exec /bin/busybox sh; }}
/bin/busybox umount /proc /sys
/bin/busybox mount --move /dev /newroot/dev 2>/dev/null || /bin/busybox umount /dev
exec /bin/busybox switch_root /newroot {init}
"""


INIT_SCRIPT = initrd_init()
GUEST_INIT = "/sbin/ale-init"
GUEST_MANIFEST = "guest.json"  # what a build holds, beside its disk
SERVER_ARGV = ["/opt/cua/bin/python", "-m", "computer_server", "--host", "127.0.0.1", "--port", "8000"]
# The cua image's entrypoint: Xvfb (as the user it runs as, when CUA_SCREEN is set and the
# root has Xvfb), then computer-server with DISPLAY set. The guest's server when present.
SERVER_ENTRY = ["/opt/cua/computer-server", "--host", "127.0.0.1", "--port", "8000"]
XVFB = "/usr/bin/Xvfb"
DEFAULT_SCREEN = "1024x768x24"


def guest_server(root: Path) -> tuple[list[str] | None, dict[str, Any] | None]:
    """The computer-server command a guest root holds and its display: the cua entrypoint
    with Xvfb gives a screen (``{"server": "Xvfb", "screen": ...}``); the bare server, or
    a root without Xvfb, none (the server runs with ``PYNPUT_BACKEND=dummy``)."""
    has = [(root / p.lstrip("/")).exists() for p in (SERVER_ENTRY[0], XVFB, SERVER_ARGV[0])]
    if has[0] and has[1]:
        return SERVER_ENTRY, {"server": "Xvfb", "screen": DEFAULT_SCREEN, "display": ":99"}
    return (SERVER_ARGV if has[2] else None), None


@dataclass(frozen=True)
class VmImage:
    """One built guest: the folder holding its kernel, initrd and base disk."""

    folder: Path

    @property
    def kernel(self) -> Path:
        return self.folder / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.folder / "initrd.img"

    @property
    def base(self) -> Path:
        return self.folder / "base.qcow2"

    @property
    def manifest(self) -> dict[str, Any]:
        return dict(json.loads((self.folder / GUEST_MANIFEST).read_text()))

    @property
    def sha256(self) -> str:
        return (self.folder / "base.qcow2.sha256").read_text().split()[0]

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.kernel, self.initrd, self.base, self.folder / GUEST_MANIFEST,
                                         self.folder / "base.qcow2.sha256"))


def vm_root() -> Path:
    """``<cache>/vm``, or ``ALE_VM_DIR``."""
    return Path(os.environ.get("ALE_VM_DIR") or cache_dir() / "vm")


def is_default_guest(ref: str) -> bool:
    """``ref`` names ale's own default guest (a run's default image, ``ale-vm:latest``)."""
    from ale.defaults import DEFAULT_TOOLS_IMAGE

    return ref in (DEFAULT_VM_IMAGE, DEFAULT_TOOLS_IMAGE, VM_REPO)


def resolve_vm_image(ref: str) -> VmImage:
    """``ale-vm:latest`` / ``ale-vm:<key12>`` / the default tools image (a run's default) /
    a folder holding a build; ``ImageMissing`` (saying how to build one) otherwise."""

    folder: Path | None = None
    if is_default_guest(ref):
        latest = vm_root() / "latest"
        if latest.is_file():
            folder = vm_root() / latest.read_text().strip()
    elif ref.startswith(f"{VM_REPO}:"):
        folder = vm_root() / ref.split(":", 1)[1]
    elif ref.startswith("/"):
        p = Path(ref)
        folder = p.parent if p.is_file() else p
    if folder is not None and is_default_guest(ref) and VmImage(folder).complete() \
            and VmImage(folder).manifest.get("agent_sha256") != agent_digest():
        # ale's default guest carries ale's guest agent: one older than this ale's is rebuilt, not booted
        raise ImageMissing(f"the VM guest {ref} ({folder}) holds an older guest agent than this ale's: "
                           "rebuild it with `ale image build --vm`")
    if folder is None or not VmImage(folder).complete():
        if ref.startswith("/") and Path(ref).exists():
            raise ImageMissing(f"{ref} is not a guest built by `ale image build --vm` (no guest.json, "
                               "kernel and initrd beside its base.qcow2); a foreign disk (ALE's published images: a "
                               "whole bootable qcow2 whose computer-server listens on port 5000) is given as its "
                               ".qcow2 file (docs/vm.md)")
        raise ImageMissing(f"no VM guest image {ref!r}: build it with `ale image build --vm`")
    return VmImage(folder)


def base_digest(path: str) -> str:
    """The base disk's sha256 as it is now: hashed once per (device, inode, size,
    mtime, ctime), which any write or chmod changes, and cached under ale's cache."""
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.realpath(path)}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0"
                         f"{st.st_mtime_ns}\0{st.st_ctime_ns}".encode()).hexdigest()[:32]
    memo = cache_dir() / "vm-digests" / key
    try:
        return memo.read_text().strip()
    except OSError:
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    digest = h.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        memo.write_text(digest)
    except OSError:
        pass
    return digest


def agent_digest() -> str:
    """The sha256 of ale's guest agent (``guest_agent.py``), which a guest's manifest records."""
    return hashlib.sha256((Path(__file__).parent / "guest_agent.py").read_bytes()).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _run(argv: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    r = subprocess.run(argv, capture_output=True, **kw)
    if r.returncode != 0:
        raise SandboxError(f"{what} failed (exit {r.returncode}): "
                           f"{' '.join(argv)}\n{r.stderr.decode(errors='replace')[-2000:]}")
    return r


def kernel_package() -> str:
    """The newest ``linux-image-6.1.0-N-amd64`` apt knows (after ``apt-get update`` when none)."""
    for attempt in range(2):
        r = subprocess.run(["apt-cache", "search", "--names-only", KERNEL_PATTERN], stdout=subprocess.PIPE, text=True)
        names = sorted((ln.split()[0] for ln in r.stdout.splitlines()
                        if re.match(KERNEL_PATTERN, ln.split()[0] if ln.split() else "")),
                       key=lambda n: int(n.split("-")[3]))
        if names:
            return names[-1]
        if attempt == 0:
            subprocess.run(["apt-get", "update", "-qq"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raise SandboxError("apt knows no linux-image-6.1.0-*-amd64 package (a Debian 12 apt source is needed)")


def _kernel(say: Say) -> Path:
    """The extracted kernel package (cached by its name)."""
    pkg = kernel_package()
    dest = vm_root() / "kernels" / pkg
    if (dest / "done").is_file():
        return dest
    say(f"downloading {pkg} (apt-get download)...")
    with tempfile.TemporaryDirectory(dir=vm_root()) as tmp:
        os.chmod(tmp, 0o755)
        _run(["apt-get", "download", pkg], "apt-get download", cwd=tmp)
        deb = next(Path(tmp).glob("*.deb"))
        say(f"extracting {deb.name}...")
        x = Path(tmp) / "x"
        _run(["dpkg-deb", "-x", str(deb), str(x)], "dpkg-deb -x")
        ver = next((x / "lib/modules").iterdir()).name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(next((x / "boot").glob("vmlinuz-*")), dest / "vmlinuz")
        for m in MODULES:
            src = x / "lib/modules" / ver / "kernel" / f"{m}.ko"
            out = dest / "modules" / f"{Path(m).name}.ko"
            out.parent.mkdir(parents=True, exist_ok=True)
            if src.is_file():
                shutil.copy2(src, out)
            elif (src.parent / f"{src.name}.xz").is_file():
                raise SandboxError(f"{pkg}: compressed modules are not supported ({m})")
        (dest / "version").write_text(ver + "\n")
        (dest / "done").write_text(pkg + "\n")
    return dest


def _busybox() -> Path:
    for p in ("/bin/busybox", "/usr/bin/busybox"):
        if os.path.isfile(p):
            out = subprocess.run(["file", "-L", p], stdout=subprocess.PIPE, text=True).stdout \
                if shutil.which("file") else "static"
            if "dynamically" not in out:
                return Path(p)
    raise SandboxError("no static busybox on the host: apt-get install busybox-static (scripts/setup.sh does)")


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries (directories: empty data;
    a character device's data: b"MAJOR:MINOR")."""
    out = io.BytesIO()
    ino = 1
    for name, mode, data in [*entries, ("TRAILER!!!", 0, b"")]:
        nb = name.encode() + b"\0"
        rdev = (0, 0)
        if stat.S_ISCHR(mode):
            major, minor = data.split(b":")
            rdev, data = (int(major), int(minor)), b""
        hdr = "070701" + "".join(f"{v:08x}" for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, *rdev, len(nb), 0))
        out.write(hdr.encode() + nb)
        out.write(b"\0" * ((4 - (110 + len(nb)) % 4) % 4))
        out.write(data)
        out.write(b"\0" * ((4 - len(data) % 4) % 4))
        ino += 1
    return out.getvalue()


def make_initrd(kernel: Path, dest: Path) -> None:
    bb = _busybox().read_bytes()
    mods = [Path(m).name for m in MODULES if (kernel / "modules" / f"{Path(m).name}.ko").is_file()]
    d, x, f = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755, stat.S_IFREG | 0o644
    entries: list[tuple[str, int, bytes]] = [("bin", d, b""), ("lib", d, b""), ("lib/modules", d, b""),
                                             ("dev", d, b""), ("dev/console", stat.S_IFCHR | 0o600, b"5:1"),
                                             ("proc", d, b""), ("sys", d, b""), ("newroot", d, b""),
                                             ("bin/busybox", x, bb), ("bin/sh", stat.S_IFLNK | 0o777, b"busybox"),
                                             ("init", x, INIT_SCRIPT.encode()),
                                             ("modules.list", f, "\n".join(mods).encode() + b"\n")]
    entries += [(f"lib/modules/{m}.ko", f, (kernel / "modules" / f"{m}.ko").read_bytes()) for m in mods]
    dest.write_bytes(gzip.compress(_cpio_newc(entries), compresslevel=6, mtime=0))


def _export_root(image: str, root: Path, say: Say) -> None:
    """The image's file tree into ``root`` (``docker export`` of a created container)."""
    import docker.errors

    from ale.sandbox.docker import connect

    client = connect()
    c = client.containers.create(image, command=["true"], entrypoint=[])
    try:
        say(f"exporting the root of {image}...")
        with tempfile.TemporaryFile() as tarf:
            for chunk in c.export():
                tarf.write(chunk)
            tarf.seek(0)
            with tarfile.open(fileobj=tarf) as t:
                t.extractall(root, numeric_owner=True, filter="fully_trusted")
    finally:
        with contextlib.suppress(docker.errors.APIError):
            c.remove(force=True)


def _prepare_root(root: Path, image: str) -> None:
    for need in ("usr/bin/python3",):
        if not (root / need).exists() and not (root / need).is_symlink():
            raise SandboxError(f"{image} has no /{need}: the guest agent (ale's init in the VM) is a Python program; "
                               "build the guest's root from an image that has python3 (the tools image does)")
    agent = (Path(__file__).parent / "guest_agent.py").read_text()
    init = root / GUEST_INIT.lstrip("/")
    init.write_text("#!/usr/bin/python3 -I\n" + agent)
    os.chmod(init, 0o700)
    for p in ("etc/hostname",):
        (root / p).write_text("ale-vm\n")
    (root / "etc/fstab").write_text("# ale: mounted by /sbin/ale-init\n")
    for d in ("dev", "proc", "sys", "run", "tmp", "sys/fs/cgroup"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    # Docker leaves these as its own bind targets (empty files); the guest writes its own.
    for p in ("etc/resolv.conf",):
        q = root / p
        if q.is_symlink() or q.exists():
            q.unlink()
        q.write_text("")
    hosts = root / "etc/hosts"
    hosts.write_text("127.0.0.1 localhost ale-vm\n::1 localhost\n")
    for tool in ("usr/bin/mount", "bin/mount"):
        if (root / tool).exists():
            break
    else:
        raise SandboxError(f"{image} has no mount(8) (/usr/bin/mount or /bin/mount): the guest agent mounts the "
                           "run's shares with it; install util-linux in that image")


def _du(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for n in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


def build_vm_image(cua_image: str | None = None, say: Say = print, *, root_image: str | None = None) -> VmImage:
    """Build (or find cached) the VM guest; returns it.

    ``root_image``: the guest's root is that Docker image instead of the cua image (a
    task's environment image, built on the tools image by ``ale.runs.software``): the
    same kernel, initrd and guest agent, the image's software. It needs ``python3`` and
    ``mount`` in the image (the guest agent is a Python program); it has no
    computer-server unless the image has cua's in ``/opt/cua``. Such a build does not
    become ``latest`` (the default guest stays the default)."""
    from ale.sandbox.cua.image import build_cua_image
    from ale.sandbox.docker import connect
    from ale.sandbox.image import _has_image, _sha

    t0 = time.monotonic()
    vm_root().mkdir(parents=True, exist_ok=True)
    for tool in ("qemu-img", "mkfs.ext4", "apt-get", "dpkg-deb"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}") \
                and not os.path.exists(f"/sbin/{tool}"):
            raise SandboxError(f"{tool} is missing: bash scripts/setup.sh installs it")
    client = connect()
    cua_ref = root_image or cua_image or build_cua_image(client, say=say)
    cua_id = _has_image(client, cua_ref)
    config = (client.api.inspect_image(cua_ref).get("Config") or {}) if cua_id else {}
    labels, env = config.get("Labels") or {}, [str(e) for e in config.get("Env") or []]
    if cua_id is None:
        raise ImageMissing(f"no image {cua_ref}" + (": it is the guest's root (root_image)" if root_image else ""))
    kernel = _kernel(say)
    agent_src = (Path(__file__).parent / "guest_agent.py").read_bytes()
    bb = _busybox()
    key = _sha(cua_id, (kernel / "done").read_text(), sha256_file(bb), agent_src, INIT_SCRIPT,
               "\n".join(MODULES), "v4")[:12]
    img = VmImage(vm_root() / key)
    with flock(vm_root() / f".{key}.lock"):  # two runs wanting the same guest: one builds, the other finds it
        if img.complete():
            say(f"VM guest {VM_REPO}:{key} is cached ({img.folder})")
            if root_image is None:
                (vm_root() / "latest").write_text(key + "\n")
            return img
        _build(img, key, cua_ref, cua_id, {"root_labels": dict(labels), "root_env": env}, kernel, bb, say, t0)
    if root_image is None:
        (vm_root() / "latest").write_text(key + "\n")
    say(f"VM guest {VM_REPO}:{key} built in {time.monotonic() - t0:.0f}s: {img.base} (sha256 {img.sha256[:12]}...)")
    return img


def flock(path: Path, *, wait: bool = True) -> Any:
    """An exclusive ``flock`` on ``path`` (made if missing), held until the returned file
    is closed; None when ``wait`` is False and another process holds it."""
    import fcntl

    f = open(path, "a+")  # noqa: SIM115 (held until the caller closes it)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        return None
    return f


def _build(img: VmImage, key: str, cua_ref: str, cua_id: str, of_root: dict[str, Any], kernel: Path, bb: Path,
           say: Say, t0: float) -> None:
    import docker.errors

    mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
    with tempfile.TemporaryDirectory(dir=vm_root()) as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        say("making the initrd (busybox, the virtio/9p/ext4 modules)...")
        make_initrd(kernel, work / "initrd.img")
        shutil.copy2(kernel / "vmlinuz", work / "vmlinuz")
        root = work / "root"
        root.mkdir()
        try:
            _export_root(cua_ref, root, say)
        except docker.errors.DockerException as e:
            raise SandboxError(f"cannot export {cua_ref}: {e}") from e
        _prepare_root(root, cua_ref)
        server, display = guest_server(root)
        size = _du(root)
        disk = max(2 << 30, int(size * 1.4) + (768 << 20))
        say(f"writing the root ({size >> 20} MiB) to an ext4 disk of {disk >> 20} MiB (mkfs.ext4 -d)...")
        raw = work / "root.ext4"
        with open(raw, "wb") as f:
            f.truncate(disk)
        _run([mkfs, "-q", "-F", "-L", "ale-root", "-E", "root_owner=0:0", "-d", str(root), str(raw)], "mkfs.ext4")
        shutil.rmtree(root)
        say("converting to qcow2...")
        _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "base.qcow2")], "qemu-img convert")
        raw.unlink()
        digest = sha256_file(work / "base.qcow2")
        (work / "base.qcow2.sha256").write_text(f"{digest}  base.qcow2\n")
        (work / GUEST_MANIFEST).write_text(json.dumps({
            "key": key, "ref": f"{VM_REPO}:{key}", "root_from": cua_ref, "root_image_id": cua_id, **of_root,
            "kernel_package": (kernel / "done").read_text().strip(),
            "kernel_version": (kernel / "version").read_text().strip(),
            "base_sha256": digest, "disk_bytes": disk, "init": GUEST_INIT, "server_argv": server, "display": display,
            "agent_sha256": agent_digest(), "candidate_uid": 1000, "built_s": round(time.monotonic() - t0, 1),
        }, indent=2) + "\n")
        for p in ("base.qcow2", "vmlinuz", "initrd.img", "base.qcow2.sha256", GUEST_MANIFEST):
            os.chmod(work / p, 0o444)
        dest = img.folder
        if dest.exists():
            shutil.rmtree(dest, ignore_errors=True)
        work.rename(dest)
        work.mkdir()  # TemporaryDirectory cleans up the name it made


def ensure_vm_images(refs: list[str], say: Say = print) -> None:
    """Build the guest for each ref that names ale's own and is missing (a path that
    does not hold a build raises ``ImageMissing``)."""
    for ref in dict.fromkeys(refs):
        try:
            resolve_vm_image(ref)
        except ImageMissing:
            if ref.startswith("/"):
                raise
            build_vm_image(say=say)
