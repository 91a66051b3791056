"""The qemu provider: one fresh VM per run, booted from a read-only base disk
(``ale image build --vm``) with a per-run qcow2 overlay that is deleted with it.

The machine: ``qemu-system-x86_64 -nodefaults -nographic -nic none``, direct kernel
boot, TCG unless KVM is proven (``kvm.py``), memory and vCPUs from the policy; QMP on
``STATE/qmp.sock``; the control channel (virtio-serial port ``org.ale.ctl``) on
``STATE/ctl.sock``; the run's mounts as virtio-9p shares (read-only ones with
``readonly=on``) mounted by the guest's init at the mounts' targets; nothing else
shared, no network device at all. ``STATE`` is a 0700 folder per VM under
``state_root()`` holding ``labels.json``, ``qemu.pid``, the overlay and the console
log: ``remove_managed`` (``ale cleanup``) finds ale's VMs there.

Commands run through ale's root guest agent (``guest_agent.py``), never through
anything the candidate can reach. ``halt`` asks the agent to freeze and kill the
candidate's cgroup and every process of its uid; when the agent does not answer
within the bound, QMP ``stop`` pauses the whole VM, then it is quit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ale.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT,
    LABEL_MANAGED,
    EngineUnreachable,
    ExecResult,
    ImageMissing,
    SandboxError,
    SandboxGone,
    SandboxSpec,
)
from ale.sandbox.halt import STOP_BOUND_S, StopOutcome
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.qemu.channel import Channel, Relay, channel_for, drop_channel
from ale.sandbox.qemu.image import VmImage
from ale.sandbox.qemu.monitor import MonitorError, capture, qmp
from ale.sandbox.qemu.shape import QEMU, cpu_model, machine_size
from ale.sandbox.qemu.warm import WarmState

BOOT_TIMEOUT_S = 180.0
# Over a command's own timeout: the agent's kill and the answer.
HOST_GRACE_S = 15.0
SERVER_PORT = 8000


def state_root() -> Path:
    """Where each VM's state folder lives (short: unix socket paths are capped at 107 bytes)."""
    return Path(os.environ.get("ALE_QEMU_STATE_DIR") or f"/var/tmp/ale-qemu-{os.getuid()}")


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _pid_alive(pid: int, state: Path) -> bool:
    """``pid`` is a live qemu of this state folder (not a recycled pid)."""
    if pid <= 0:
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if st.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return str(state).encode() in cmd


def _image_env(image: VmImage) -> dict[str, str]:
    """The guest root's own environment (its image's ``Env``, as a container of it would
    start with), under what the run's spec sets."""
    out: dict[str, str] = {}
    for item in image.manifest.get("root_env") or []:
        k, sep, v = str(item).partition("=")
        if sep and k:
            out[k] = v
    return out


def _parse_user(user: str) -> tuple[int, int, list[int]]:
    """``uid[:gid]`` or a name (the host's passwd, which the guest's matches for root)."""
    name, _, group = user.partition(":")
    if name.isdigit():
        uid = int(name)
        gid = int(group) if group.isdigit() else uid
        return uid, gid, [gid]
    if name == "root":
        return 0, 0, [0]
    try:
        pw = pwd.getpwnam(name)
        return pw.pw_uid, int(group) if group.isdigit() else pw.pw_gid, [pw.pw_gid]
    except KeyError as e:
        raise SandboxError(f"unknown user {user!r} (the qemu provider takes uid:gid)") from e


# QEMU's own seccomp filter on every VM: no obsolete syscalls, no privilege raising, no
# new processes, no resource control calls from the emulator.
QEMU_SECCOMP = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

class QemuSandbox:
    """One VM (see the module's docstring)."""

    shares_host_filesystem = True

    def __init__(self, state: Path, policy: IsolationPolicy):
        self.state = state
        self.policy = policy
        try:
            self.meta: dict[str, Any] = json.loads((state / "labels.json").read_text())
        except (OSError, ValueError) as e:
            raise SandboxGone(f"no VM at {state}: {e}") from e
        self.name: str = self.meta["name"]
        self.id: str = self.meta["id"]
        self._proc: subprocess.Popen[bytes] | None = None
        self._relay: Relay | None = None
        self._cua: Any = None
        self.boot: dict[str, Any] = {}

    # -- paths --------------------------------------------------------------------
    @property
    def qmp_path(self) -> str:
        return str(self.state / "qmp.sock")

    @property
    def ctl_path(self) -> str:
        return str(self.state / "ctl.sock")

    @property
    def cua_path(self) -> str:
        return str(self.state / "cua.sock")

    @property
    def overlay(self) -> Path:
        return self.state / "overlay.qcow2"

    def pid(self) -> int:
        try:
            return int((self.state / "qemu.pid").read_text().strip())
        except (OSError, ValueError):
            return 0

    def running(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            return False
        return _pid_alive(self.pid(), self.state)

    # -- creation -----------------------------------------------------------------
    @classmethod
    def create(cls, spec: SandboxSpec, image: VmImage, accel: dict[str, Any], session: str = "exec", *,
               warm: WarmState | None = None, template: bool = False) -> QemuSandbox:
        """A VM for ``spec``, not started. ``warm``: restored from that booted state
        (``ale.sandbox.qemu.warm``) instead of booted, its overlay on the state's disk,
        this run's part sent on start; ``template``: the boot that such a state is
        saved from (no run's part)."""
        vid = uuid.uuid4().hex[:12]
        state = state_root() / vid
        state_root().mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(state_root(), 0o700)
        state.mkdir(mode=0o700)
        try:
            backing = str(warm.disk) if warm is not None else str(image.base)
            r = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", backing, "-F", "qcow2",
                                str(state / "overlay.qcow2")], capture_output=True)
            if r.returncode != 0:
                raise SandboxError(f"qemu-img create failed: {r.stderr.decode(errors='replace')}")
            policy = spec.policy
            uid, gid, _groups = _parse_user(policy.user)
            vcpus, mem_mb = machine_size(policy)
            shares = []
            for i, m in enumerate(spec.mounts):
                shares.append({"tag": f"ale{i}", "source": m.source, "target": m.target, "ro": m.read_only})
            tmp = next((t for t in policy.tmpfs if t.path == "/tmp"), None)
            cfg = {
                "shares": [{"tag": s["tag"], "target": s["target"], "ro": s["ro"]} for s in shares],
                "uid": uid, "gid": gid, "pids_limit": policy.pids_limit, "memory_bytes": policy.memory_bytes,
                "tmp_options": (tmp.options + ",mode=1777") if tmp is not None else "nosuid,nodev,mode=1777,size=64m",
                "hostname": "ale-vm", "root_ro": policy.read_only_rootfs,
                "server_argv": image.manifest.get("server_argv"), "home": spec.environment.get("HOME", "/tmp"),
                "screen": (image.manifest.get("display") or {}).get("screen"),
            }
            boot_cfg = {"warm": True} if template or warm is not None else cfg  # a warm run's part comes on start
            append = ("console=ttyS0 root=/dev/vda rw panic=-1 quiet loglevel=3 no_timer_check "
                      f"ale.cfg={base64.b64encode(json.dumps(boot_cfg, separators=(',', ':')).encode()).decode()}")
            argv = [QEMU, "-name", f"ale-{vid}", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
                    "-accel", accel["accel"], "-cpu", cpu_model(accel["accel"]), "-m", str(mem_mb), "-smp", str(vcpus),
                    "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", append,
                    "-drive", f"file={state / 'overlay.qcow2'},if=virtio,format=qcow2,id=root0",
                    "-nic", "none",
                    "-serial", f"file:{state / 'console.log'}",
                    "-qmp", f"unix:{state / 'qmp.sock'},server=on,wait=off",
                    "-device", "virtio-serial-pci,id=vser0",
                    "-chardev", f"socket,id=ctl,path={state / 'ctl.sock'},server=on,wait=off",
                    "-device", "virtserialport,bus=vser0.0,chardev=ctl,name=org.ale.ctl",
                    "-pidfile", str(state / "qemu.pid"),
                    "-sandbox", QEMU_SECCOMP]
            for s in shares:
                fs = f"local,id=fs_{s['tag']},path={s['source']},security_model=passthrough"
                if s["ro"]:
                    fs += ",readonly=on"
                argv += ["-fsdev", fs, "-device", f"virtio-9p-pci,fsdev=fs_{s['tag']},mount_tag={s['tag']}"]
            if warm is not None:  # the machine is the saved one's: same devices, its state streamed in on start
                argv += ["-incoming", f"unix:{state / 'in.sock'}"]
            meta = {
                "id": vid, "name": spec.name, "labels": {**spec.labels, LABEL_MANAGED: "1"}, "image": spec.image,
                "image_id": f"sha256:{image.sha256}", "base": str(image.base), "base_sha256": image.sha256,
                "kernel": str(image.kernel), "initrd": str(image.initrd), "overlay": str(state / "overlay.qcow2"),
                "shares": shares, "guest_cfg": cfg, "argv": argv, "accel": accel, "memory_mb": mem_mb, "vcpus": vcpus,
                "workdir": spec.workdir, "environment": {**_image_env(image), **spec.environment}, "created": _now(),
                "session": session, "control_socket": str(state / "ctl.sock"), "qmp_socket": str(state / "qmp.sock"),
                "policy": policy.model_dump(mode="json"),
                **({"warm": warm.record()} if warm is not None else {}), **({"template": True} if template else {}),
            }
            (state / "labels.json").write_text(json.dumps(meta, indent=2))
        except BaseException:
            shutil.rmtree(state, ignore_errors=True)
            raise
        return cls(state, spec.policy)

    # -- inspect ------------------------------------------------------------------
    def _status(self) -> dict[str, Any]:
        stopped = self.state / "stopped.json"
        pid = self.pid()
        alive = self.running()
        st: dict[str, Any] = {"Pid": pid if alive else 0, "StartedAt": self.meta.get("started"), "OOMKilled": False}
        if alive:
            qs: Any = None
            with contextlib.suppress(MonitorError):
                qs = qmp(self.qmp_path, "query-status", timeout=3)
            paused = isinstance(qs, dict) and qs.get("status") not in (None, "running")
            st.update(Status="paused" if paused else "running", Running=not paused, Paused=paused, ExitCode=0)
        elif (self.state / "started").exists():
            doc: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(stopped.read_text())
            st.update(Status="exited", Running=False, Paused=False, ExitCode=doc.get("exit_code", -1),
                      FinishedAt=doc.get("finished_at"))
        else:
            st.update(Status="created", Running=False, Paused=False, ExitCode=0)
        return st

    def inspect(self) -> dict[str, Any]:
        if not (self.state / "labels.json").is_file():
            raise SandboxGone(f"VM {self.name} no longer exists")
        self._note_exit()
        meta = self.meta
        pid = self.pid()
        status = self._status()
        out: dict[str, Any] = {
            "Id": self.id, "Name": self.name, "Provider": "qemu", "Image": meta["image_id"],
            "Config": {"Labels": meta["labels"], "Image": meta["image"], "WorkingDir": meta["workdir"],
                       "Env": [f"{k}={v}" for k, v in meta["environment"].items()]},
            "State": status,
            "vm": {
                "base": meta["base"], "base_sha256": meta["base_sha256"], "overlay": meta["overlay"],
                "overlay_exists": self.overlay.is_file(), "kernel": meta["kernel"], "initrd": meta["initrd"],
                "shares": meta["shares"], "accel": meta["accel"], "memory_mb": meta["memory_mb"],
                "vcpus": meta["vcpus"],
                "control_socket": meta["control_socket"], "qmp_socket": meta["qmp_socket"], "argv": meta["argv"],
                "guest_cfg": meta["guest_cfg"], "boot": self.boot or meta.get("boot"),
            },
        }
        if status["Status"] in ("running", "paused"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                out["vm"]["process"] = {"pid": pid, "cmdline": [a.decode(errors="replace") for a in cmdline if a],
                                        "uid": os.stat(f"/proc/{pid}").st_uid}
            except OSError:
                out["vm"]["process"] = None
            try:
                out["vm"]["qmp"] = capture(self.qmp_path, timeout=5)
            except MonitorError as e:
                if not self.running():
                    return self.inspect()
                raise SandboxError(f"QMP of {self.name} failed: {e}") from e
        return out

    # -- life -----------------------------------------------------------------------
    async def start(self) -> None:
        if self.running():
            return
        t0 = time.monotonic()
        argv = self.meta["argv"]
        try:
            with open(self.state / "qemu.log", "ab") as log:
                self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True)
        except OSError as e:
            raise EngineUnreachable(f"cannot start {QEMU}: {e}") from e
        (self.state / "started").write_text(_now())
        self.meta["started"] = _now()
        # QEMU writes its pid file once the machine is set up; the sockets exist then
        for _ in range(200):
            if self._proc.poll() is not None:
                break
            if (self.state / "qemu.pid").is_file() and os.path.exists(self.ctl_path):
                break
            await asyncio.sleep(0.05)
        if self._proc.poll() is not None:
            err = (self.state / "qemu.log").read_text(errors="replace")[-3000:]
            self._note_exit()
            raise SandboxError(f"{QEMU} exited at once ({self._proc.returncode}): {err}")
        launched = time.monotonic() - t0
        warm = self.meta.get("warm")
        try:
            if warm:
                from ale.sandbox.qemu.warm import restore

                await restore(self, warm)
            ch = await channel_for(self.ctl_path)
            pong = await ch.wait_ready(BOOT_TIMEOUT_S, alive=self.running)
            if warm:
                await self._configure(ch)
        except SandboxError as e:
            console = self.console_tail()
            raise SandboxError(f"VM {self.name} did not become ready: {e}\nconsole:\n{console}") from e
        self.boot = {"launch_s": round(launched, 3), "ready_s": round(time.monotonic() - t0, 3),
                     "guest_boot_id": pong.get("boot_id"), "accel": self.meta["accel"]["accel"],
                     "mode": "restored" if warm else "booted", **({"from": warm} if warm else {})}
        self.meta["boot"] = self.boot
        with contextlib.suppress(OSError):
            (self.state / "labels.json").write_text(json.dumps(self.meta, indent=2))

    async def _configure(self, ch: Channel) -> None:
        """A restored VM's part of the run: the clock, fresh entropy, then its shares,
        /tmp, limits and computer-server (the guest agent's ``configure``)."""
        h, _ = await ch.request({"op": "configure", "cfg": self.meta["guest_cfg"], "time_ns": time.time_ns()},
                                os.urandom(64), timeout=60)
        if h.get("error"):
            raise SandboxError(f"the restored guest could not take the run's configuration: {h['error']}")

    def console_tail(self, n: int = 3000) -> str:
        try:
            return (self.state / "console.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _note_exit(self) -> None:
        """Reap our own qemu child and record when and how it ended (once)."""
        if self._proc is not None and self._proc.poll() is not None and not (self.state / "stopped.json").exists():
            with contextlib.suppress(OSError):
                (self.state / "stopped.json").write_text(json.dumps({"exit_code": self._proc.returncode,
                                                                     "finished_at": _now()}))

    async def _channel(self) -> Channel:
        if not (self.state / "labels.json").is_file():
            raise SandboxGone(f"VM {self.name} no longer exists")
        if not self.running():
            raise SandboxGone(f"VM {self.name} is not running")
        return await channel_for(self.ctl_path)

    async def exec(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        uid, gid, groups = _parse_user(user or self.policy.user)
        environment = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       **self.meta["environment"], **(env or {})}
        req = {"op": "exec", "argv": list(argv), "uid": uid, "gid": gid, "groups": groups,
               "cwd": workdir or self.meta["workdir"], "env": environment, "timeout": timeout, "limit": output_limit}
        t0 = time.monotonic()
        ch = await self._channel()
        try:
            h, payload = await ch.request(req, stdin or b"", timeout=(timeout + HOST_GRACE_S) if timeout else None)
        except TimeoutError:
            if not self.running():
                raise SandboxGone(f"VM {self.name} stopped during the command") from None
            return ExecResult(-1, timed_out=True, duration_s=time.monotonic() - t0,
                              extra={"error": "the guest agent did not answer"})
        except SandboxGone:
            raise
        except SandboxError:
            if not self.running():
                raise SandboxGone(f"VM {self.name} stopped during the command") from None
            raise
        n = int(h.get("out_len", 0))
        return ExecResult(
            exit_code=int(h.get("code", -1)), stdout=payload[:n], stderr=payload[n:],
            timed_out=bool(h.get("timed_out")),
            stdout_truncated=bool(h.get("stdout_truncated")), stderr_truncated=bool(h.get("stderr_truncated")),
            duration_s=time.monotonic() - t0,
        )

    async def halt(self, *, keep_uids: tuple[int, ...] = (), bound_s: float = STOP_BOUND_S) -> StopOutcome:
        """The candidate's turn ends from outside its reach: ale's root agent freezes
        and kills the candidate's cgroup and every task of its uid; if the agent does
        not answer within the bound, QMP ``stop`` pauses the whole VM (then it is quit)."""
        started, t0 = _now(), time.monotonic()
        uid, _gid, _ = _parse_user(self.policy.user)
        out = StopOutcome("vm-agent-cgroup", started, bound_s=bound_s, cgroup="/sys/fs/cgroup/candidate")
        if not self.running():
            out.sandbox_stopped = True
            out.detail = "the VM was not running"
            return out
        try:
            ch = await self._channel()
            h, _ = await ch.request({"op": "halt", "uid": uid, "keep_uids": list(keep_uids),
                                     "bound": max(1.0, bound_s - 3)},
                                    timeout=bound_s - 1)
            out.frozen = bool(h.get("frozen"))
            out.killed = int(h.get("killed", 0))
            out.dying = int(h.get("dying", 0))
            out.survivors = list(h.get("survivors") or [])
            out.detail = f"guest agent: {h.get('duration_s')}s in the guest"
        except (TimeoutError, SandboxError) as e:
            out.method = "qmp"
            out.detail = f"the guest agent did not answer ({type(e).__name__}: {e}); QMP stop, then quit"
            with contextlib.suppress(MonitorError):
                await asyncio.to_thread(qmp, self.qmp_path, "stop", timeout=3)
                out.frozen = True
            await self.stop()
        out.sandbox_stopped = not self.running()
        out.duration_s = round(time.monotonic() - t0, 4)
        out.within_bound = out.duration_s <= bound_s
        self._cua = None
        return out

    async def kill_user_processes(self) -> int:
        out = await self.halt()
        return -1 if out.sandbox_stopped or out.method == "qmp" else len(out.survivors)

    async def kill_user_processes_then(self, argv: list[str] | None, *,
                                       timeout: float = 60) -> tuple[int, ExecResult | None]:
        out = await self.halt()
        if out.sandbox_stopped or out.method == "qmp":
            return -1, None
        left = len(out.survivors)
        if argv is None:
            return left, None
        return left, await self.exec(argv, timeout=timeout)

    # -- the candidate's session: cua's computer-server ------------------------------
    async def cua_session(self, *, ready_timeout: float = 180.0) -> Any:
        """A ``CuaClient`` on the guest's computer-server (started as the candidate by
        the guest's init), through the control channel. Not named ``protocol``: the
        tool box would then route every call through it; here the agent's tools run
        through ale's root agent as the candidate (``exec``)."""
        from ale.sandbox.cua.client import CuaClient

        if self._cua is not None:
            return self._cua
        ch = await self._channel()
        if self._relay is None or self._relay.channel is not ch:
            if self._relay is not None:
                await self._relay.close()
            self._relay = await Relay(ch, self.cua_path, SERVER_PORT).start()
        cua = CuaClient(uds=self.cua_path)
        await cua.wait_ready(ready_timeout, interval=1.0)
        self._cua = cua
        return cua

    async def start_server(self) -> None:
        """Start computer-server again as the candidate (the end-of-turn kill ends it:
        it is a candidate process), detached, in the candidate's cgroup."""
        argv = self.meta["guest_cfg"].get("server_argv")
        if not argv:
            raise SandboxError(f"VM {self.name}: its guest has no computer-server")
        import shlex

        screen = self.meta["guest_cfg"].get("screen")
        # as the guest agent's server_env
        env = f"CUA_SCREEN={shlex.quote(screen)}" if screen else "PYNPUT_BACKEND=dummy"
        await self.exec(["sh", "-c", f"{env} setsid {shlex.join(argv)} >>/tmp/.ale-cua-server.log 2>&1 "
                                     "</dev/null &"], timeout=30)

    @property
    def screen(self) -> str | None:
        """The guest's screen (``WxHxD``, Xvfb as the candidate, driven through
        computer-server), or None: a guest built without Xvfb has no display."""
        screen = self.meta["guest_cfg"].get("screen")
        return str(screen) if screen else None

    async def stop(self) -> None:
        if self._relay is not None:
            with contextlib.suppress(Exception):
                await self._relay.close()
            self._relay = None
        self._cua = None
        drop_channel(self.ctl_path)
        pid = self.pid()
        if _pid_alive(pid, self.state):
            with contextlib.suppress(MonitorError):
                await asyncio.to_thread(qmp, self.qmp_path, "quit", timeout=2)
            for _ in range(40):
                if not _pid_alive(pid, self.state):
                    break
                await asyncio.sleep(0.05)
            if _pid_alive(pid, self.state):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                if self._proc is not None:
                    self._proc.poll()
                if not _pid_alive(pid, self.state):
                    break
                await asyncio.sleep(0.05)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self._proc.wait, 5)
        if (self.state / "started").exists() and not (self.state / "stopped.json").exists() and self.state.is_dir():
            code = self._proc.returncode if self._proc is not None else None
            with contextlib.suppress(OSError):
                (self.state / "stopped.json").write_text(json.dumps({"exit_code": code if code is not None else -1,
                                                                      "finished_at": _now(), "by": "ale"}))

    async def remove(self) -> None:
        await self.stop()
        shutil.rmtree(self.state, ignore_errors=True)


class QemuCuaSandbox(QemuSandbox):
    """A VM whose candidate session is cua's computer-server protocol
    (``ALE_QEMU_SESSION=cua``): the tool box's calls (shell, files) go through the
    guest's computer-server, run as the candidate, as ``CuaSandbox``'s do; ale's own
    work (probes, the stop, task set-up's commands) stays on the root agent's exec."""

    def __init__(self, state: Path, policy: IsolationPolicy):
        super().__init__(state, policy)
        self._server_dead = False
        self._retired_calls = 0
        self.starts: list[dict[str, Any]] = []

    async def protocol(self) -> Any:
        if self._cua is not None:
            return self._cua
        t0 = time.monotonic()
        if self._server_dead:
            await self.start_server()
            self._server_dead = False
        cua = await self.cua_session()
        self.starts.append({"ready_s": round(time.monotonic() - t0, 3)})
        return cua

    async def protocol_lost(self) -> None:
        await self._drop_cua()
        self._server_dead = True
        await self.exec(["sh", "-c", "pkill -9 -f 'm computer[_]server' || true"], user="0:0", timeout=30)

    async def _drop_cua(self) -> None:
        if self._cua is not None:
            self._retired_calls += self._cua.calls
            with contextlib.suppress(Exception):
                await self._cua.aclose()
        self._cua = None

    async def halt(self, *, keep_uids: tuple[int, ...] = (), bound_s: float = STOP_BOUND_S) -> StopOutcome:
        await self._drop_cua()
        out = await super().halt(keep_uids=keep_uids, bound_s=bound_s)
        self._server_dead = True
        return out

    async def record(self) -> dict[str, Any]:
        return {"server_argv": self.meta["guest_cfg"].get("server_argv"), "port_inside": SERVER_PORT,
                "server_user": self.policy.user, "starts": self.starts, "transport": "virtio-serial relay",
                "relay_connections": self._relay.opened if self._relay is not None else 0,
                "calls": self._retired_calls + (self._cua.calls if self._cua is not None else 0)}


__all__ = ["ImageMissing", "QemuCuaSandbox", "QemuSandbox", "state_root"]
