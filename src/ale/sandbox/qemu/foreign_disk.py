"""``ale image build --vm --foreign-test``: a small *foreign-style* test disk, built
here from Debian packages (no registry), shaped like ALE's published Ubuntu disk: a
whole bootable qcow2 (MBR partition table, a boot loader, a kernel of its own) whose
init starts cua's computer-server on guest ``0.0.0.0:5000`` as a non-root user, with
no ale guest agent inside. It exists to test the foreign-disk path
(``ale.sandbox.qemu.foreign``) on a machine where ALE's real disks cannot be fetched.

The disk (raw, then ``qemu-img convert -O qcow2``):

- sector 0: syslinux's ``mbr.bin`` (Debian's ``syslinux-common``), which boots the
  active partition;
- partition 1 (FAT16, 64 MiB, active): ``syslinux --install`` (Debian's ``syslinux``,
  through ``mtools``: no mount, no loop device), ``syslinux.cfg``, the kernel and an
  initrd (busybox, the virtio/ext4/virtio-net modules, an ``/init`` that mounts
  ``/dev/vda2`` and ``switch_root``s to ``/sbin/foreign-init``);
- partition 2 (ext4, ``mkfs.ext4 -d`` at its offset): the cua-compatible image's root
  (``ale image build --cua``: Debian 13, computer-server in ``/opt/cua``, the user
  ``agent`` 1000) plus ``/sbin/foreign-init`` (a shell init: mounts, the address by
  DHCP from QEMU's user-net as ALE's Ubuntu disks take it, so 10.0.2.15/24 and, under
  restrict=on, no router, ``/input`` and ``/workspace`` owned by 1000,
  computer-server started as uid 1000 on ``0.0.0.0:5000``, then a reaper).

Cached by content under ``<cache>/vm/foreign-test/<key12>/`` (``disk.qcow2``,
``disk.qcow2.sha256``, ``foreign.json``); the key covers the cua image's id, the
kernel package, busybox, syslinux's MBR and the scripts.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from ale.sandbox.base import ImageMissing, SandboxError
from ale.sandbox.image import Say
from ale.sandbox.qemu import image as vmimage

FOREIGN_PORT = 5000
# Beyond the guest's MODULES: the network device (virtio_net needs net_failover, failover).
NET_MODULES = ("net/core/failover", "drivers/net/net_failover", "drivers/net/virtio_net")
SYSLINUX_MBR = Path("/usr/lib/syslinux/mbr/mbr.bin")
BOOT_MIB = 64
FOREIGN_INITRD_INIT = vmimage.initrd_init("/dev/vda2", "/sbin/foreign-init", "foreign-initrd")
FOREIGN_INIT = """#!/bin/sh
# PID 1 of ale's foreign-style test disk: what an operator's image would do at boot.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
BB=/usr/local/bin/busybox
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /tmp
mount -t tmpfs -o nosuid,nodev,mode=0755 tmpfs /run
hostname foreign-test
$BB ip link set lo up
$BB ip link set eth0 up
# The address by DHCP from QEMU's user-net, as ALE's Ubuntu disks take it: 10.0.2.15/24
# (under restrict=on QEMU's DHCP offers no router and no DNS).
$BB udhcpc -i eth0 -s /sbin/foreign-dhcp -q -n -t 5 -T 1 || echo "[foreign-init] no DHCP lease"
mkdir -p /input /workspace
chown 1000:1000 /input /workspace
echo "[foreign-init] starting computer-server on 0.0.0.0:%(port)d as uid 1000"
cd /home/agent
env -i PATH=$PATH HOME=/home/agent LANG=C.UTF-8 USER=agent PYNPUT_BACKEND=dummy PYTHONDONTWRITEBYTECODE=1 \\
  setpriv --reuid=1000 --regid=1000 --init-groups --no-new-privs \\
  /opt/cua/bin/python -m computer_server --host 0.0.0.0 --port %(port)d </dev/null >/dev/console 2>&1 &
exec /opt/cua/bin/python -I -c 'import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)
'
""".replace("%(port)d", str(FOREIGN_PORT))
FOREIGN_DHCP = """#!/bin/sh
# busybox udhcpc's event script: the lease's address, its router as the default route.
BB=/usr/local/bin/busybox
case "$1" in
  deconfig) $BB ip addr flush dev "$interface"; $BB ip link set "$interface" up ;;
  bound|renew)
    $BB ip addr flush dev "$interface"
    $BB ip addr add "$ip/${mask:-24}" dev "$interface"
    for r in $router; do $BB ip route add default via "$r" dev "$interface"; break; done
    : > /etc/resolv.conf
    for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done ;;
esac
"""
SYSLINUX_CFG = """DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL /vmlinuz
  INITRD /initrd.img
  APPEND console=ttyS0 root=/dev/vda2 rw panic=-1 quiet loglevel=3 no_timer_check
"""
TOOLS = ("qemu-img", "mkfs.ext4", "mkfs.vfat", "syslinux", "mcopy", "sfdisk", "apt-get", "dpkg-deb")


def foreign_root() -> Path:
    return vmimage.vm_root() / "foreign-test"


def _which(tool: str) -> str | None:
    return shutil.which(tool) or next((p for p in (f"/usr/sbin/{tool}", f"/sbin/{tool}") if os.path.exists(p)), None)


def _net_modules(kernel: Path, say: Say) -> Path:
    """The network modules of the guest's kernel package (``apt-get download`` again,
    cached beside the extracted kernel)."""
    dest = kernel / "netmodules"
    if (dest / "done").is_file():
        return dest
    pkg = (kernel / "done").read_text().strip()
    say(f"downloading {pkg} for its network modules (apt-get download)...")
    with tempfile.TemporaryDirectory(dir=vmimage.vm_root()) as tmp:
        vmimage._run(["apt-get", "download", pkg], "apt-get download", cwd=tmp)
        deb = next(Path(tmp).glob("*.deb"))
        x = Path(tmp) / "x"
        vmimage._run(["dpkg-deb", "-x", str(deb), str(x)], "dpkg-deb -x")
        ver = (kernel / "version").read_text().strip()
        dest.mkdir(parents=True, exist_ok=True)
        for m in NET_MODULES:
            src = x / "lib/modules" / ver / "kernel" / f"{m}.ko"
            if not src.is_file():
                raise SandboxError(f"{pkg}: no module {m}.ko")
            shutil.copy2(src, dest / f"{Path(m).name}.ko")
        (dest / "done").write_text(pkg + "\n")
    return dest


def _initrd(kernel: Path, net: Path, dest: Path) -> None:
    import gzip

    bb = vmimage._busybox().read_bytes()
    mods = [(Path(m).name, kernel / "modules" / f"{Path(m).name}.ko") for m in vmimage.MODULES]
    mods = [(n, p) for n, p in mods if p.is_file()] + [(Path(m).name, net / f"{Path(m).name}.ko") for m in NET_MODULES]
    d, x, f = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755, stat.S_IFREG | 0o644
    entries: list[tuple[str, int, bytes]] = [
        ("bin", d, b""), ("lib", d, b""), ("lib/modules", d, b""), ("dev", d, b""),
        ("dev/console", stat.S_IFCHR | 0o600, b"5:1"), ("proc", d, b""), ("sys", d, b""), ("newroot", d, b""),
        ("bin/busybox", x, bb), ("bin/sh", stat.S_IFLNK | 0o777, b"busybox"),
        ("init", x, FOREIGN_INITRD_INIT.encode()), ("modules.list", f, "\n".join(n for n, _ in mods).encode() + b"\n")]
    entries += [(f"lib/modules/{n}.ko", f, p.read_bytes()) for n, p in mods]
    dest.write_bytes(gzip.compress(vmimage._cpio_newc(entries), compresslevel=6, mtime=0))


def _prepare_root(root: Path) -> None:
    init = root / "sbin/foreign-init"
    init.write_text(FOREIGN_INIT)
    os.chmod(init, 0o755)
    dhcp = root / "sbin/foreign-dhcp"
    dhcp.write_text(FOREIGN_DHCP)
    os.chmod(dhcp, 0o755)
    bb = root / "usr/local/bin/busybox"
    bb.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(vmimage._busybox(), bb)
    os.chmod(bb, 0o755)
    (root / "etc/hostname").write_text("foreign-test\n")
    (root / "etc/fstab").write_text("# mounted by /sbin/foreign-init\n")
    for d in ("dev", "proc", "sys", "run", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    q = root / "etc/resolv.conf"
    if q.is_symlink() or q.exists():
        q.unlink()
    q.write_text("")
    (root / "etc/hosts").write_text("127.0.0.1 localhost foreign-test\n::1 localhost\n")


def foreign_key(cua_id: str, kernel: Path) -> str:
    from ale.sandbox.image import _sha

    return _sha(cua_id, (kernel / "done").read_text(), vmimage.sha256_file(vmimage._busybox()),
                SYSLINUX_MBR.read_bytes() if SYSLINUX_MBR.is_file() else b"", FOREIGN_INITRD_INIT, FOREIGN_INIT,
                FOREIGN_DHCP,
                SYSLINUX_CFG, "\n".join((*vmimage.MODULES, *NET_MODULES)), "foreign-v1")[:12]


def find_foreign_test_disk() -> Path | None:
    """The newest built test disk (``<cache>/vm/foreign-test/latest``), or None."""
    latest = foreign_root() / "latest"
    if not latest.is_file():
        return None
    disk = foreign_root() / latest.read_text().strip() / "disk.qcow2"
    return disk if disk.is_file() and (disk.parent / "disk.qcow2.sha256").is_file() else None


def build_foreign_test_disk(cua_image: str | None = None, say: Say = print) -> Path:
    """Build (or find cached) the foreign-style test disk; returns its ``disk.qcow2``."""
    import docker.errors

    from ale.sandbox.cua.image import build_cua_image
    from ale.sandbox.docker import connect
    from ale.sandbox.image import _has_image

    t0 = time.monotonic()
    missing = [t for t in TOOLS if _which(t) is None]
    if missing or not SYSLINUX_MBR.is_file():
        raise SandboxError(f"missing {', '.join(missing) or SYSLINUX_MBR}: apt-get install syslinux syslinux-common "
                           "mtools dosfstools fdisk (bash scripts/setup.sh does)")
    vmimage.vm_root().mkdir(parents=True, exist_ok=True)
    client = connect()
    cua_ref = cua_image or build_cua_image(client, say=say)
    cua_id = _has_image(client, cua_ref)
    if cua_id is None:
        raise ImageMissing(f"no image {cua_ref}")
    kernel = vmimage._kernel(say)
    net = _net_modules(kernel, say)
    key = foreign_key(cua_id, kernel)
    folder = foreign_root() / key
    disk = folder / "disk.qcow2"
    if disk.is_file() and (folder / "disk.qcow2.sha256").is_file():
        say(f"foreign test disk {key} is cached ({disk})")
        (foreign_root() / "latest").write_text(key + "\n")
        return disk
    foreign_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=foreign_root()) as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        root = work / "root"
        root.mkdir()
        try:
            vmimage._export_root(cua_ref, root, say)
        except docker.errors.DockerException as e:
            raise SandboxError(f"cannot export {cua_ref}: {e}") from e
        _prepare_root(root)
        size = vmimage._du(root)
        root_bytes = max(2 << 30, int(size * 1.4) + (768 << 20)) // (1 << 20) * (1 << 20)
        # the boot partition: FAT16 with syslinux, the kernel, the initrd, the config
        fat = work / "boot.fat"
        with open(fat, "wb") as f:
            f.truncate(BOOT_MIB << 20)
        vmimage._run([_which("mkfs.vfat") or "mkfs.vfat", "-F", "16", "-n", "BOOT", str(fat)], "mkfs.vfat")
        _initrd(kernel, net, work / "initrd.img")
        (work / "syslinux.cfg").write_text(SYSLINUX_CFG)
        env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
        for name in ("syslinux.cfg", "initrd.img"):
            vmimage._run(["mcopy", "-i", str(fat), str(work / name), f"::/{name}"], "mcopy", env=env)
        vmimage._run(["mcopy", "-i", str(fat), str(kernel / "vmlinuz"), "::/vmlinuz"], "mcopy", env=env)
        say("installing syslinux on the boot partition...")
        vmimage._run(["syslinux", "--install", str(fat)], "syslinux --install", env=env)
        # the whole disk: MBR, the boot partition (active), the root partition
        start1 = 2048
        sectors1 = (BOOT_MIB << 20) // 512
        start2 = start1 + sectors1
        sectors2 = root_bytes // 512
        raw = work / "disk.raw"
        with open(raw, "wb") as f:
            f.truncate((start2 + sectors2) * 512)
        vmimage._run([_which("sfdisk") or "sfdisk", "-q", str(raw)], "sfdisk",
                     input=(f"label: dos\nstart={start1}, size={sectors1}, type=6, bootable\n"
                            f"start={start2}, size={sectors2}, type=83\n").encode())
        with open(raw, "r+b") as f:
            f.seek(0)
            f.write(SYSLINUX_MBR.read_bytes()[:440])  # the boot code only: the partition table stays
            f.seek(start1 * 512)
            with open(fat, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)
        fat.unlink()
        say(f"writing the root ({size >> 20} MiB) to an ext4 partition of {root_bytes >> 20} MiB (mkfs.ext4 -d)...")
        vmimage._run([_which("mkfs.ext4") or "mkfs.ext4", "-q", "-F", "-L", "foreign-root", "-E",
                      f"root_owner=0:0,offset={start2 * 512}", "-d", str(root), str(raw), f"{root_bytes >> 10}k"],
                     "mkfs.ext4")
        shutil.rmtree(root)
        say("converting to qcow2...")
        vmimage._run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "disk.qcow2")], "qemu-img convert")
        raw.unlink()
        for p in ("initrd.img", "syslinux.cfg"):
            (work / p).unlink()
        digest = vmimage.sha256_file(work / "disk.qcow2")
        (work / "disk.qcow2.sha256").write_text(f"{digest}  disk.qcow2\n")
        (work / "foreign.json").write_text(json.dumps({
            "key": key, "kind": "foreign-test", "root_from": cua_ref, "root_image_id": cua_id,
            "kernel_package": (kernel / "done").read_text().strip(),
            "boot_loader": "syslinux (mbr.bin, FAT16 partition 1)",
            "server": {"port": FOREIGN_PORT, "host": "0.0.0.0", "uid": 1000},
            "sha256": digest, "built_s": round(time.monotonic() - t0, 1),
        }, indent=2) + "\n")
        for p in ("disk.qcow2", "disk.qcow2.sha256", "foreign.json"):
            os.chmod(work / p, 0o444)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        work.rename(folder)
        work.mkdir()
    (foreign_root() / "latest").write_text(key + "\n")
    say(f"foreign test disk {key} built in {time.monotonic() - t0:.0f}s: {disk}")
    return disk


__all__ = ["FOREIGN_PORT", "build_foreign_test_disk", "find_foreign_test_disk", "foreign_root"]
