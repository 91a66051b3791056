"""A *foreign* disk under the qemu provider: an operator's whole bootable qcow2 (ALE's
published Ubuntu disk, or ``foreign_disk``'s test disk) whose own boot loader and
kernel start cua's computer-server on guest port 5000, with no ale guest agent inside.

The machine (no ``-kernel``: the firmware boots the disk):

```
qemu-system-x86_64 -nodefaults -no-user-config -nographic -no-reboot -accel tcg -cpu max -m M -smp N
  -drive file=STATE/overlay.qcow2,if=virtio,format=qcow2        # backing file: the read-only disk
  -netdev user,id=net0,restrict=on,ipv6=off,hostfwd=tcp:127.0.0.1:PORT-:5000
  -device virtio-net-pci,netdev=net0,romfile=                    # no iPXE option ROM
  -serial file:STATE/console.log -qmp unix:STATE/qmp.sock,server=on,wait=off
  -pidfile STATE/qemu.pid -sandbox on,...
```

No DNS, no guestfwd, no other NIC, no 9p share (the guest could not mount one: nothing
of ale's runs in it). The session is computer-server's protocol over the forwarded
port (``CuaClient``), as the candidate the server runs as:

- ``start()``: boot, wait for ``/status``, then put the run's input in (and anything
  already in the workspace folder) through the server's file API, bounded
  (``COPY_MAX_FILES``/``COPY_MAX_BYTES``/``COPY_BOUND_S``); what the task's ``start()``
  then writes into the input goes in just before the probes that precede the agent;
- ``exec()``: ``run_command`` through the server, always as the server's user (a
  command asked as another user is run as that one and recorded in ``notes``);
- ``halt()`` (the end of the turn): the guest's workspace is copied out to the host's
  workspace folder through the server (bounded like the lifecycle's deliverables
  copy, regular files and folders only, names checked), the after-run probes are run
  through the server (kept for the lifecycle's after-probe exec), then QMP ``stop``
  pauses every vCPU: nothing of the candidate's runs after that. ``stop()`` quits.

What cannot be done without an agent in the guest, recorded: the candidate's
processes are not killed one by one (the whole VM is paused), and they still run while
the workspace is copied out and the after-run probes run (the pause comes after both);
the after-run probes run as the candidate through a server the candidate could have
replaced during its turn, so they are only as trustworthy as the candidate (the
probes before the agent ran against the disk's own server, and QEMU's side, read over
QMP and /proc, is the host's); the guest's copy of the input is the candidate's own
(the host's is hashed before and after, ``check_input_unchanged``), so its
read-only-ness is not a guest probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import posixpath
import shutil
import socket
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from ale.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT,
    LABEL_MANAGED,
    ExecResult,
    ImageMissing,
    SandboxError,
    SandboxGone,
    SandboxSpec,
    UnsupportedGuest,
)
from ale.sandbox.halt import STOP_BOUND_S, StopOutcome
from ale.sandbox.qemu.foreign_disk import FOREIGN_PORT
from ale.sandbox.qemu.monitor import MonitorError, qmp
from ale.sandbox.qemu.sandbox import QEMU_SECCOMP, QemuSandbox, _now, state_root
from ale.sandbox.qemu.shape import QEMU, cpu_model, machine_size

BOOT_TIMEOUT_S = 300.0  # the firmware, the guest's own boot and its computer-server's start, under TCG
COPY_MAX_FILES = 100_000
COPY_MAX_BYTES = 2 * 1024**3
COPY_BOUND_S = 120.0  # the input's copy in
# The end of the turn runs inside the lifecycle's stop step (``STOP_STEP_BOUND_S``, 60 s):
# the workspace's copy out and the after-run probes each get this much of it.
HALT_COPY_BOUND_S = 20.0
HALT_PROBE_BOUND_S = 15.0
FOREIGN_KIND = "foreign"


def is_foreign_disk(ref: str) -> bool:
    """``ref`` is a disk file that is not a guest of ``ale image build --vm`` (no
    ``guest.json`` beside it): a whole bootable disk of its own."""
    p = Path(ref.removeprefix("local:"))
    return ref.startswith(("/", "local:")) and p.is_file() and not (p.parent / "guest.json").is_file()


def disk_digest(path: Path) -> str:
    """The disk's sha256: its ``.sha256`` file beside it when there is one (the test
    disk's, a fetched disk's name), else hashed (memoised per inode)."""
    side = path.with_name(path.name + ".sha256")
    if side.is_file():
        return side.read_text().split()[0]
    stem = path.name.removesuffix(".qcow2")
    if len(stem) == 64 and all(c in "0123456789abcdef" for c in stem):  # <cache>/vm-disks/<sha256>.qcow2
        return stem
    from ale.sandbox.qemu.image import base_digest

    return base_digest(str(path))


def foreign_inspect(ref: str) -> dict[str, Any]:
    p = Path(ref.removeprefix("local:"))
    if not p.is_file():
        raise ImageMissing(f"no disk at {p}")
    r = subprocess.run(["qemu-img", "info", "--output=json", str(p)], capture_output=True, text=True)
    if r.returncode != 0:
        raise ImageMissing(f"{p} is not a disk image qemu-img can read: {r.stderr.strip()[-500:]}")
    info = json.loads(r.stdout)
    if info.get("format") != "qcow2":
        raise ImageMissing(f"{p} is a {info.get('format')} image: the qemu provider boots a qcow2 (qemu-img "
                           "convert -O qcow2)")
    if info.get("backing-filename"):
        raise ImageMissing(f"{p} has a backing file ({info['backing-filename']}): give the whole disk")
    digest = disk_digest(p)
    return {"Id": f"sha256:{digest}", "RepoTags": [ref], "base": str(p), "sha256": digest, "size": p.stat().st_size,
            "kind": FOREIGN_KIND, "virtual_size": info.get("virtual-size"), "server_port": FOREIGN_PORT,
            "kernel": None, "initrd": None, "manifest": {"kind": FOREIGN_KIND}}


def expectation_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """What a foreign disk's VM plans beyond ale's own guest (``VmExpectation`` fields,
    from the VM's record of its creation): restricted user-mode networking with the one
    forward to computer-server, no share (the input is copied in, the workspace out)."""
    return {"network": "user-restricted", "hostfwd_port": int(meta["hostfwd_port"]),
            "guest_port": int(meta["guest_port"]), "shares": {}, "input_transfer": "copy"}


def unsupported_guest(status: dict[str, Any]) -> str | None:
    """Why ale cannot prove a booted guest sealed, from its computer-server's ``/status``
    (None: a Linux guest). A Windows guest has no POSIX shell for the in-guest probes
    and no ``find`` for the workspace's copy out, so its run could only end invalid:
    it is stopped before the agent starts, with this reason, and not retried."""
    os_type = str(status.get("os_type") or "linux").lower()
    if os_type == "linux":
        return None
    return (f"its computer-server reports os_type {os_type!r}: ale's in-guest seal probes and the workspace's "
            "copy out are POSIX shell, so this guest's run cannot be proven sealed yet (nothing of the agent ran; "
            "docs/vm.md, Windows guests)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _safe_rel(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts) and "\0" not in name


# The guest's workspace as NUL-separated records "TYPE SIZE PATH" (find's %y: f, d, l, ...).
_LIST = "cd -- \"$1\" && find . -mindepth 1 -printf '%y %s %P\\0'"


class ForeignQemuSandbox(QemuSandbox):
    """One VM of a foreign disk (see the module's docstring)."""

    shares_host_filesystem = False

    def __init__(self, state: Path, policy: Any):
        super().__init__(state, policy)
        self._client: Any = None
        self._halted = False
        self._after_probe: tuple[tuple[str, ...], ExecResult] | None = None
        self.probes: list[str] | None = None  # the seal's probe command, set by ale.runs.vm_seal
        self.notes: list[str] = list(self.meta.get("notes") or [])
        self.copies: dict[str, Any] = {}
        self._sent: dict[str, tuple[int, int, int]] = {}  # host file -> (size, mtime, inode) as copied in
        self._input_again = False

    @property
    def port(self) -> int:
        return int(self.meta["hostfwd_port"])

    @classmethod
    def create_foreign(cls, spec: SandboxSpec, disk: dict[str, Any], accel: dict[str, Any]) -> ForeignQemuSandbox:
        vid = uuid.uuid4().hex[:12]
        state = state_root() / vid
        state_root().mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(state_root(), 0o700)
        state.mkdir(mode=0o700)
        try:
            overlay = state / "overlay.qcow2"
            r = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", disk["base"], "-F", "qcow2",
                                str(overlay)],
                               capture_output=True)
            if r.returncode != 0:
                raise SandboxError(f"qemu-img create failed: {r.stderr.decode(errors='replace')}")
            policy = spec.policy
            vcpus, mem_mb = machine_size(policy)
            port = free_port()
            argv = [QEMU, "-name", f"ale-{vid}", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
                    "-accel", accel["accel"], "-cpu", cpu_model(accel["accel"]), "-m", str(mem_mb), "-smp", str(vcpus),
                    "-drive", f"file={overlay},if=virtio,format=qcow2,id=root0",
                    "-netdev", f"user,id=net0,restrict=on,ipv6=off,hostfwd=tcp:127.0.0.1:{port}-:{FOREIGN_PORT}",
                    "-device", "virtio-net-pci,netdev=net0,romfile=",
                    "-serial", f"file:{state / 'console.log'}",
                    "-qmp", f"unix:{state / 'qmp.sock'},server=on,wait=off",
                    "-pidfile", str(state / "qemu.pid"),
                    "-sandbox", QEMU_SECCOMP]
            shares = [{"tag": None, "source": m.source, "target": m.target, "ro": m.read_only} for m in spec.mounts]
            meta = {
                "id": vid, "name": spec.name, "labels": {**spec.labels, LABEL_MANAGED: "1"}, "image": spec.image,
                "image_id": f"sha256:{disk['sha256']}", "base": disk["base"], "base_sha256": disk["sha256"],
                "kernel": None, "initrd": None, "overlay": str(overlay), "shares": [], "copies": shares,
                "guest_cfg": {}, "argv": argv, "accel": accel, "memory_mb": mem_mb, "vcpus": vcpus,
                "workdir": spec.workdir, "environment": dict(spec.environment), "created": _now(),
                "session": FOREIGN_KIND, "foreign": True, "hostfwd_port": port, "guest_port": FOREIGN_PORT,
                "control_socket": None, "qmp_socket": str(state / "qmp.sock"),
                "policy": policy.model_dump(mode="json"),
            }
            (state / "labels.json").write_text(json.dumps(meta, indent=2))
        except BaseException:
            shutil.rmtree(state, ignore_errors=True)
            raise
        return cls(state, spec.policy)

    def inspect(self) -> dict[str, Any]:
        out = super().inspect()
        vm = out.get("vm") or {}
        vm.update(foreign=True, hostfwd=f"tcp:127.0.0.1:{self.port}-:{FOREIGN_PORT}", copies=self.meta.get("copies"),
                  halted_by_harness=self._halted)
        if self._halted and (out.get("State") or {}).get("Status") == "paused":
            # paused by ale's own end of the turn (QMP stop), not stopped: QEMU still answers
            out["State"]["HaltedByHarness"] = True
        return out

    # -- life ------------------------------------------------------------------------
    async def start(self) -> None:
        from ale.sandbox.cua.client import CuaClient, CuaError

        if self.running():
            return
        t0 = time.monotonic()
        try:
            with open(self.state / "qemu.log", "ab") as log:
                self._proc = subprocess.Popen(self.meta["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True)
        except OSError as e:
            raise SandboxError(f"cannot start {QEMU}: {e}") from e
        (self.state / "started").write_text(_now())
        self.meta["started"] = _now()
        for _ in range(200):
            if self._proc.poll() is not None or (self.state / "qemu.pid").is_file():
                break
            await asyncio.sleep(0.05)
        if self._proc.poll() is not None:
            err = (self.state / "qemu.log").read_text(errors="replace")[-3000:]
            self._note_exit()
            raise SandboxError(f"{QEMU} exited at once ({self._proc.returncode}): {err}")
        launched = time.monotonic() - t0
        client = CuaClient(f"http://127.0.0.1:{self.port}")
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        status: dict[str, Any] | None = None
        while status is None:
            if not self.running():
                await client.aclose()
                raise SandboxError(f"VM {self.name} stopped while booting\nconsole:\n{self.console_tail()}")
            try:
                status = await client.status(timeout=3)
            except CuaError:
                if time.monotonic() > deadline:
                    await client.aclose()
                    raise SandboxError(f"VM {self.name}: its computer-server did not answer on 127.0.0.1:{self.port} "
                                       f"within {BOOT_TIMEOUT_S:.0f}s\nconsole:\n{self.console_tail()}") from None
                await asyncio.sleep(1.0)
        self._client = client
        self._cua = client
        unsupported = unsupported_guest(status)
        if unsupported is not None:
            raise UnsupportedGuest(f"VM {self.name}: {unsupported}")
        self.boot = {"launch_s": round(launched, 3), "ready_s": round(time.monotonic() - t0, 3), "status": status,
                     "accel": self.meta["accel"]["accel"], "ready": "computer-server /status over the hostfwd"}
        self.meta["boot"] = self.boot
        self.copies["in"] = await self._copy_in()
        self.meta["copies_done"] = self.copies
        with contextlib.suppress(OSError):
            (self.state / "labels.json").write_text(json.dumps(self.meta, indent=2))

    async def protocol(self) -> Any:
        if self._client is None or self._halted:
            raise SandboxGone(f"VM {self.name}: no computer-server session (the turn ended, or it never booted)")
        return self._client

    async def protocol_lost(self) -> None:
        """The server failed under a call: nothing here can restart it (no agent in the
        guest); the next call tries the same port again."""

    async def cua_session(self, *, ready_timeout: float = 180.0) -> Any:
        return await self.protocol()

    async def exec(self, argv: list[str], *, user: str | None = None, workdir: str | None = None,
                   timeout: float | None = None, stdin: bytes | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                   env: dict[str, str] | None = None) -> ExecResult:
        """Through the computer-server, as its user (the only one ale can reach here).
        After ``halt`` (the VM paused) the after-run probes' exec gets the result kept
        when they ran just before the pause; anything else is refused."""
        if self._halted:
            if self._after_probe is not None and tuple(argv) == self._after_probe[0]:
                r = self._after_probe[1]
                r.extra = {**(r.extra or {}), "ran": "through computer-server as its user, just before the QMP stop"}
                return r
            raise SandboxGone(f"VM {self.name} is paused: the candidate's turn ended (QMP stop)")
        if not self.running():
            raise SandboxGone(f"VM {self.name} is not running")
        if user is not None and user.split(":", 1)[0] not in (self.policy.user.split(":", 1)[0],):
            note = f"a command asked as {user} ran as the computer-server's user (no agent in the guest): {argv[:3]}"
            if note not in self.notes:
                self.notes.append(note)
        client = await self.protocol()
        if not self._input_again and tuple(argv) == tuple(self._probe_argv()):
            # the probes before the agent: the task's start() has run; what it wrote into
            # the input since the boot goes in now, before the input is sealed
            self._input_again = True
            self.copies["in_again"] = await self._copy_in(again=True)
        environment = {**self.meta["environment"], **(env or {})}
        environment.pop("PATH", None)
        return await client.run_command(list(argv), cwd=workdir or self.meta["workdir"], timeout=timeout, stdin=stdin,
                                        output_limit=output_limit, env=environment)

    # -- the input in, the workspace out -------------------------------------------------
    async def _copy_in(self, *, again: bool = False) -> dict[str, Any]:
        """Every mount's host folder into its guest folder (the input, and whatever the
        workspace already holds): regular files and folders, bounded. ``again``: the
        input only, the files that are new or changed since (what the task's ``start()``
        wrote into the input after the boot)."""
        client = self._client
        t0 = time.monotonic()
        files = size = 0
        skipped: list[str] = []
        for m in self.meta.get("copies") or []:
            if again and not m["ro"]:
                continue
            src, target = Path(m["source"]), m["target"]
            if again:
                await client.run_command(["chmod", "-R", "u+w", "--", target], timeout=60)
            await client.make_dir(target)
            for dirpath, dirs, names in os.walk(src):
                rel = os.path.relpath(dirpath, src)
                gdir = target if rel == "." else posixpath.join(target, rel)
                if rel != ".":
                    await client.make_dir(gdir)
                for n in sorted(names):
                    p = Path(dirpath) / n
                    st = p.lstat()
                    if not stat.S_ISREG(st.st_mode):
                        skipped.append(f"{p}: not a regular file")
                        continue
                    if self._sent.get(str(p)) == (st.st_size, st.st_mtime_ns, st.st_ino):
                        continue
                    if files >= COPY_MAX_FILES or size + st.st_size > COPY_MAX_BYTES \
                            or time.monotonic() - t0 > COPY_BOUND_S:
                        raise SandboxError(f"VM {self.name}: the input is larger than the copy's bounds "
                                           f"({COPY_MAX_FILES} files, {COPY_MAX_BYTES} bytes, {COPY_BOUND_S:.0f}s)")
                    await client.write_bytes(posixpath.join(gdir, n), p.read_bytes())
                    self._sent[str(p)] = (st.st_size, st.st_mtime_ns, st.st_ino)
                    files += 1
                    size += st.st_size
                dirs[:] = [d for d in dirs if not (Path(dirpath) / d).is_symlink()]
            if m["ro"]:  # a courtesy, not a seal: the candidate owns its copy
                await client.run_command(["chmod", "-R", "a-w", "--", target], timeout=60)
        return {"files": files, "bytes": size, "skipped": skipped, "seconds": round(time.monotonic() - t0, 3)}

    async def _copy_out(self, bound_s: float) -> dict[str, Any]:
        """The guest's workspace into the host's workspace folder, as the lifecycle's
        deliverables copy then reads it: regular files and folders (no links, devices or
        set-id bits), each name checked, at most ``COPY_MAX_FILES`` entries and
        ``COPY_MAX_BYTES`` bytes, within ``bound_s``."""
        client = self._client
        t0 = time.monotonic()
        out: dict[str, Any] = {"files": 0, "dirs": 0, "bytes": 0, "skipped": [], "complete": True}
        for m in self.meta.get("copies") or []:
            if m["ro"]:
                continue
            host, target = Path(m["source"]), m["target"]
            r = await client.run_command(["sh", "-c", _LIST, "list", target], timeout=max(5.0, bound_s / 4),
                                         output_limit=64 << 20)
            if r.exit_code != 0:
                out["complete"] = False
                out["skipped"].append(f"{target}: cannot list it (exit {r.exit_code}): {r.stderr[-300:]!r}")
                continue
            entries = [e for e in r.stdout.split(b"\0") if e]
            for raw in entries:
                try:
                    kind, sz, name = raw.decode().split(" ", 2)
                except ValueError:
                    out["skipped"].append(f"an entry not readable as UTF-8 or malformed: {raw[:200]!r}")
                    continue
                if not _safe_rel(name):
                    out["skipped"].append(f"{name!r}: not a plain relative name")
                    continue
                if out["files"] + out["dirs"] >= COPY_MAX_FILES or time.monotonic() - t0 > bound_s:
                    out["complete"] = False
                    out["skipped"].append(f"{name}: past the copy's bound ({COPY_MAX_FILES} entries, {bound_s:.0f}s)")
                    break
                dest = host / name
                if kind == "d":
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(dest, 0o755)
                    out["dirs"] += 1
                    continue
                if kind != "f":
                    out["skipped"].append(f"{name}: not a regular file or folder ({kind})")
                    continue
                if out["bytes"] + int(sz) > COPY_MAX_BYTES:
                    out["complete"] = False
                    out["skipped"].append(f"{name}: past the copy's byte bound ({COPY_MAX_BYTES})")
                    continue
                try:
                    data = await client.read_bytes(posixpath.join(target, name), limit=COPY_MAX_BYTES - out["bytes"])
                except (OSError, ValueError, SandboxError) as e:
                    out["skipped"].append(f"{name}: {type(e).__name__}: {e}"[:300])
                    continue
                try:
                    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                except OSError as e:
                    if e.errno in (errno.EEXIST, errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                        out["skipped"].append(f"{name}: {e.strerror}")
                        continue
                    raise
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                out["files"] += 1
                out["bytes"] += len(data)
        out["seconds"] = round(time.monotonic() - t0, 3)
        return out

    def _probe_argv(self) -> list[str]:
        """The seal's probe command (``ale.runs.vm_seal`` gives it, ``probes``): this VM
        recognises the probes before the agent by it, and runs it at the end of the turn."""
        return list(self.probes or [])

    async def halt(self, *, keep_uids: tuple[int, ...] = (), bound_s: float = STOP_BOUND_S) -> StopOutcome:
        """The end of the turn: the workspace copied out and the after-run probes run
        through computer-server (bounded), then QMP ``stop`` (every vCPU paused; QEMU
        stays up for the after capture; ``stop()`` quits it)."""
        started, t0 = _now(), time.monotonic()
        out = StopOutcome("qmp", started, bound_s=bound_s, cgroup=None)
        if not self.running():
            out.sandbox_stopped = True
            out.detail = "the VM was not running"
            return out
        details = []
        if self._client is not None and not self._halted:
            try:
                self.copies["out"] = await asyncio.wait_for(self._copy_out(HALT_COPY_BOUND_S), HALT_COPY_BOUND_S + 2)
                c = self.copies["out"]
                details.append(f"workspace copied out through computer-server ({c['files']} files, {c['bytes']} bytes, "
                               f"{len(c['skipped'])} skipped{'' if c['complete'] else ', INCOMPLETE'}"
                               + (f": {'; '.join(c['skipped'][:5])}" if c["skipped"] else "") + ")")
            except (TimeoutError, SandboxError, OSError) as e:
                self.copies["out"] = {"complete": False, "error": f"{type(e).__name__}: {e}"[:1000]}
                details.append(f"the workspace copy failed: {e}")
            argv = self._probe_argv()
            try:
                if not argv:
                    raise SandboxError("the seal gave no probe command")
                res = await asyncio.wait_for(self._client.run_command(argv, timeout=HALT_PROBE_BOUND_S),
                                             HALT_PROBE_BOUND_S + 2)
                self._after_probe = (tuple(argv), res)
                details.append("after-run probes ran as the server's user before the stop")
            except (TimeoutError, SandboxError) as e:
                details.append(f"the after-run probes failed: {e}")
        try:
            await asyncio.to_thread(qmp, self.qmp_path, "stop", timeout=5)
            out.frozen = True
            details.append("QMP stop: every vCPU paused")
        except MonitorError as e:
            details.append(f"QMP stop failed ({e}): quit")
            await self.stop()
        self._halted = True
        with contextlib.suppress(Exception):
            await self._client.aclose()
        out.detail = "; ".join(details) + "; no agent in the guest: its processes were not killed one by one"
        out.sandbox_stopped = not self.running()
        out.duration_s = round(time.monotonic() - t0, 4)
        out.within_bound = out.duration_s <= bound_s + HALT_COPY_BOUND_S + HALT_PROBE_BOUND_S + 10
        return out

    async def kill_user_processes(self) -> int:
        await self.halt()
        return -1

    async def kill_user_processes_then(self, argv: list[str] | None, *,
                                       timeout: float = 60) -> tuple[int, ExecResult | None]:
        await self.halt()
        return -1, None

    async def record(self) -> dict[str, Any]:
        return {"kind": FOREIGN_KIND, "transport": f"hostfwd tcp:127.0.0.1:{self.port} -> guest :{FOREIGN_PORT}",
                "boot": self.boot, "copies": self.copies, "notes": self.notes,
                "calls": self._client.calls if self._client is not None else 0}

    async def stop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
        self._client = None
        await super().stop()


__all__ = ["ForeignQemuSandbox", "expectation_fields", "foreign_inspect", "is_foreign_disk"]
