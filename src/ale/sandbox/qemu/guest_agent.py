"""ale's guest agent: PID 1 of an ``ale image build --vm`` guest and the root
program that serves the host's control channel. Copied into the guest's root as
``/sbin/ale-init``; it runs on the guest's own Python (nothing of ale is installed
there), so it imports only the standard library.

As PID 1 (``init``): mounts /proc, /sys, /dev, /tmp, the cgroup2 tree; mounts the
run's shares (virtio-9p, tags and targets from ``ale.cfg=`` on the kernel command
line, base64 JSON); makes the candidate's cgroup (``/sys/fs/cgroup/candidate``, its
pids and memory limits); starts computer-server as the candidate in that cgroup (with
its own Xvfb when the guest has a screen: ``server_env``); forks the agent; prints ``ALE-READY`` on the console; then
only reaps, ignoring every catchable signal (nothing the candidate runs can signal it:
another uid).

The agent (root) opens the virtio-serial port named ``org.ale.ctl`` (``/dev/vportNpM``,
0600 root: no candidate process can open it) and answers the host (``wire.py``'s
framing):

- ``ping`` → ``pong``;
- ``exec`` (argv, uid, gid, groups, cwd, env, timeout, limit; payload: stdin) → ``exit``
  (code, timed_out, truncation flags, stdout and stderr lengths; payload: stdout +
  stderr). Each command runs in its own cgroup (under the candidate's for a candidate
  uid), in a new session; on timeout ``cgroup.kill`` ends the command and every
  descendant, those that called setsid included;
- ``halt`` (keep_uids, bound) → ``halted``: freezes the candidate's cgroup, kills it
  (``cgroup.kill``) and every process of any uid but root's and the kept ones, thaws,
  waits (bounded);
- ``open`` (port) / ``data`` / ``eof`` / ``close``: a TCP stream to guest 127.0.0.1:port
  (the host's route to computer-server).
"""

import base64
import contextlib
import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_NO_NEW_PRIVS = 38
CANDIDATE_NOFILE = 65536  # RLIMIT_NOFILE, soft and hard, of every process started as a non-root user

MAGIC = b"ALE\x01"
HEAD = struct.Struct(">4sII")
PORT_NAME = "org.ale.ctl"
CG = "/sys/fs/cgroup"
CAND = CG + "/candidate"
ROOTCMD = CG + "/ale"
CFG_PATH = "/run/ale-cfg.json"


def log(msg):
    try:
        with open("/dev/console", "w") as c:
            c.write(f"[ale-init] {msg}\n")
    except OSError:
        pass


def sh(*argv):
    r = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        log(f"{' '.join(argv)}: exit {r.returncode}: {r.stdout.decode(errors='replace').strip()}")
    return r.returncode


def readf(path):
    with open(path) as f:
        return f.read()


def write(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError as e:
        log(f"write {path} {text!r}: {e}")
        return False


# -- PID 1 ------------------------------------------------------------------------
def read_cfg():
    cmdline = readf("/proc/cmdline").split()
    for a in cmdline:
        if a.startswith("ale.cfg="):
            return json.loads(base64.b64decode(a[len("ale.cfg="):]))
    return {}


def base_setup():
    """What every run's guest has, whatever the run: the kernel's file systems, /run."""
    for what, where, fstype, opts in (("proc", "/proc", "proc", "nosuid,nodev,noexec"),
                                      ("sysfs", "/sys", "sysfs", "nosuid,nodev,noexec"),
                                      ("devtmpfs", "/dev", "devtmpfs", "nosuid,mode=0755"),
                                      ("cgroup2", CG, "cgroup2", "nosuid,nodev,noexec")):
        if not os.path.ismount(where):
            os.makedirs(where, exist_ok=True)
            sh("mount", "-t", fstype, "-o", opts, what, where)
    os.makedirs("/dev/pts", exist_ok=True)
    sh("mount", "-t", "devpts", "-o", "nosuid,noexec,gid=5,mode=620,ptmxmode=000", "devpts", "/dev/pts")
    os.makedirs("/dev/shm", exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", "nosuid,nodev,mode=1777,size=64m", "tmpfs", "/dev/shm")
    sh("mount", "-t", "tmpfs", "-o", "nosuid,nodev,mode=0755,size=16m", "tmpfs", "/run")
    sh("mount", "-o", "remount,rw", "/")
    loopback_up()


def run_setup(cfg):
    """This run's part: its /tmp, shares, hostname, the candidate's cgroup and limits.
    At boot (``ale.cfg=``), or on ``configure`` in a VM restored from a booted state."""
    with open(CFG_PATH, "w") as f:
        json.dump(cfg, f)
    os.chmod(CFG_PATH, 0o600)
    tmp = cfg.get("tmp_options") or "nosuid,nodev,mode=1777,size=1g"
    sh("mount", "-t", "tmpfs", "-o", tmp, "tmpfs", "/tmp")
    os.chmod("/tmp", 0o1777)
    socket.sethostname(cfg.get("hostname") or "ale-vm")
    for s in cfg.get("shares") or []:
        os.makedirs(s["target"], exist_ok=True)
        # cache=mmap, not cache=none: v9fs without a cache refuses a writable shared
        # mmap (EINVAL), which numpy.memmap, tifffile.memmap, LMDB and SQLite's WAL
        # (its -shm file) need, on a bind mount as in a container. Reads and writes
        # stay uncached (as with none); mapped pages are written back when the mapping
        # closes, as at a process's exit.
        opts = "trans=virtio,version=9p2000.L,msize=524288,cache=mmap"
        if s.get("ro"):
            opts += ",ro"
        sh("mount", "-t", "9p", "-o", opts, s["tag"], s["target"])
    if cfg.get("root_ro"):
        sh("mount", "-o", "remount,ro", "/")
    # cgroups: the candidate's (limits), the agent's own commands'
    write(CG + "/cgroup.subtree_control", "+pids +memory +cpu")
    for d in (CAND, ROOTCMD):
        os.makedirs(d, exist_ok=True)
        write(d + "/cgroup.subtree_control", "+pids +memory")
    if cfg.get("pids_limit"):
        write(CAND + "/pids.max", str(cfg["pids_limit"]))
    if cfg.get("memory_bytes"):
        write(CAND + "/memory.max", str(cfg["memory_bytes"]))
        write(CAND + "/memory.swap.max", "0")


def init():
    base_setup()
    cfg = read_cfg()
    warm = bool(cfg.get("warm"))
    if not warm:
        run_setup(cfg)
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                signal.signal(s, signal.SIG_IGN)
    agent_pid = spawn_agent()
    server_pid = 0 if warm else spawn_server(cfg)
    log("ALE-WARM" if warm else "ALE-READY")  # warm: saved now, configured by each run restored from it
    while True:
        try:
            pid, _st = os.wait()
        except ChildProcessError:
            time.sleep(0.5)
            continue
        if pid == agent_pid:
            log("agent exited; restarting it")
            time.sleep(0.2)
            agent_pid = spawn_agent()
        elif pid == server_pid:
            server_pid = 0


def reseed(entropy):
    """Credit the host's bytes to the kernel's pool (RNDADDENTROPY) and reseed its CRNG
    now (RNDRESEEDCRNG): a plain write to /dev/urandom is mixed in but not used until
    the next periodic reseed, so clones would hand out the same random bytes till then."""
    import fcntl

    fd = os.open("/dev/urandom", os.O_WRONLY)
    try:
        fcntl.ioctl(fd, 0x40085203, struct.pack("ii", len(entropy) * 8, len(entropy)) + entropy)
        fcntl.ioctl(fd, 0x5207)
    except OSError as e:
        log(f"reseeding the CRNG: {e}")
    finally:
        os.close(fd)


def configure(h, payload):
    """A VM restored from a booted state: the clock, fresh entropy (every clone starts
    from the same random state), then this run's setup and its computer-server."""
    t = h.get("time_ns")
    if isinstance(t, int):
        ts = struct.pack("qq", t // 1_000_000_000, t % 1_000_000_000)
        if _LIBC.clock_settime(0, ctypes.c_char_p(ts)) != 0:
            log(f"clock_settime: errno {ctypes.get_errno()}")
    if payload:
        reseed(payload)
    cfg = h.get("cfg") or {}
    run_setup(cfg)
    server = spawn_server(cfg)
    if server:
        threading.Thread(target=os.waitpid, args=(server, 0), daemon=True).start()


def loopback_up():
    """``ip link set lo up`` without iproute2 (SIOCGIFFLAGS / SIOCSIFFLAGS): the guest's
    only interface; the kernel gives it 127.0.0.1 (computer-server listens there)."""
    import fcntl

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            got = fcntl.ioctl(s, 0x8913, struct.pack("16sH14s", b"lo", 0, b""))
            flags = struct.unpack("16sH", got[:18])[1]
            fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))
    except OSError as e:
        log(f"cannot bring lo up: {e}")


def spawn_agent():
    pid = os.fork()
    if pid == 0:
        try:
            for s in signal.valid_signals():
                if s not in (signal.SIGKILL, signal.SIGSTOP):
                    with contextlib.suppress(OSError, ValueError, RuntimeError):
                        signal.signal(s, signal.SIG_DFL)
            Agent().serve()
        finally:
            os._exit(1)
    return pid


def server_env(cfg):
    """computer-server's environment: with a screen (``cfg["screen"]``, a guest whose root
    has Xvfb), ``CUA_SCREEN`` for its entrypoint, which starts Xvfb as the same user and
    sets DISPLAY; without one, pynput's dummy backend."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": cfg.get("home", "/tmp"), "LANG": "C.UTF-8"}
    if cfg.get("screen"):
        env["CUA_SCREEN"] = str(cfg["screen"])
    else:
        env["PYNPUT_BACKEND"] = "dummy"
    return env


def spawn_server(cfg):
    """computer-server (and its Xvfb, when the guest has a screen) as the candidate, in
    the candidate's cgroup, when the image has it."""
    argv = cfg.get("server_argv")
    if not argv or not os.path.exists(argv[0]):
        return 0
    uid, gid = cfg.get("uid", 1000), cfg.get("gid", 1000)
    env = server_env(cfg)
    with open("/tmp/.ale-cua-server.log", "ab") as logf:
        os.fchown(logf.fileno(), uid, gid)  # the server's own log: a restart as the candidate appends to it
        return Agent.spawn(argv, uid, gid, [gid], "/", env, CAND + "/server", stdout=logf).pid


# -- the agent ---------------------------------------------------------------------
def find_port():
    for d in sorted(os.listdir("/sys/class/virtio-ports")) if os.path.isdir("/sys/class/virtio-ports") else []:
        try:
            name = readf(f"/sys/class/virtio-ports/{d}/name").strip()
        except OSError:
            continue
        if name == PORT_NAME:
            return "/dev/" + d
    return None


class Agent:
    def __init__(self):
        self.wlock = threading.Lock()
        self.port = None
        self.fd = -1
        self.tcp = {}
        self.seq = 0
        self.cfg = {}
        with contextlib.suppress(OSError, ValueError):
            self.cfg = json.loads(readf(CFG_PATH))

    def send(self, header, payload=b""):
        h = json.dumps(header, separators=(",", ":")).encode()
        msg = HEAD.pack(MAGIC, len(h), len(payload)) + h + payload
        with self.wlock:
            view = memoryview(msg)
            while view:
                try:
                    n = os.write(self.fd, view)
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                except OSError:
                    return  # the host is not connected: it asks again
                view = view[n:]

    def serve(self):
        for _ in range(600):
            self.port = find_port()
            if self.port:
                break
            time.sleep(0.1)
        if not self.port:
            log("no control port")
            time.sleep(5)
            return
        self.fd = os.open(self.port, os.O_RDWR)
        buf = bytearray()
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                time.sleep(0.05)  # the host is not connected
                continue
            buf += data
            while len(buf) >= HEAD.size:
                magic, hl, pl = HEAD.unpack_from(buf)
                if magic != MAGIC:
                    i = buf.find(MAGIC, 1)
                    del buf[: i if i > 0 else max(0, len(buf) - 3)]
                    continue
                end = HEAD.size + hl + pl
                if len(buf) < end:
                    break
                try:
                    header = json.loads(bytes(buf[HEAD.size: HEAD.size + hl]))
                except ValueError:
                    header = None
                payload = bytes(buf[HEAD.size + hl: end])
                del buf[:end]
                if isinstance(header, dict):
                    self.dispatch(header, payload)

    def dispatch(self, h, payload):
        op, ch = h.get("op"), h.get("ch", 0)
        if op == "ping":
            self.send({"op": "pong", "ch": ch, "boot_id": readf("/proc/sys/kernel/random/boot_id").strip()})
        elif op == "configure":
            if os.path.exists(CFG_PATH):  # once per VM: a second configure is refused
                self.send({"op": "configured", "ch": ch, "error": "already configured"})
                return
            try:
                configure(h, payload)
                self.cfg = h.get("cfg") or {}
                self.send({"op": "configured", "ch": ch})
            except Exception as e:  # noqa: BLE001 (the host needs the reason)
                self.send({"op": "configured", "ch": ch, "error": f"{type(e).__name__}: {e}"})
        elif op == "exec":
            threading.Thread(target=self.exec_, args=(h, payload), daemon=True).start()
        elif op == "halt":
            threading.Thread(target=self.halt, args=(h,), daemon=True).start()
        elif op == "open":
            threading.Thread(target=self.tcp_open, args=(ch, int(h.get("port", 8000))), daemon=True).start()
        elif op == "data":
            s = self.tcp.get(ch)
            if s is not None:
                try:
                    s.sendall(payload)
                except OSError:
                    self.tcp_close(ch)
        elif op == "eof":
            s = self.tcp.get(ch)
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_WR)
        elif op == "close":
            self.tcp_close(ch, tell=False)

    # -- exec ---------------------------------------------------------------------
    @staticmethod
    def spawn(argv, uid, gid, groups, cwd, env, cgroup, stdin=None, stdout=None, stderr=None):
        os.makedirs(cgroup, exist_ok=True)
        procs = os.open(cgroup + "/cgroup.procs", os.O_WRONLY)

        def pre():
            os.write(procs, b"0")
            os.setsid()
            if uid != 0:
                # As a container's --security-opt no-new-privileges and --ulimit core=0:
                # no setuid file or file capability raises the candidate, and no core
                # file of its process image is written.
                import resource

                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                # Open files as a container has them, not the kernel's 1024 for init's
                # children (a test runner or a language server opens more).
                resource.setrlimit(resource.RLIMIT_NOFILE, (CANDIDATE_NOFILE, CANDIDATE_NOFILE))
                if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            os.umask(0o022)

        try:
            p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin or subprocess.DEVNULL, stdout=stdout,
                                 stderr=(stderr if stderr is not None
                                         else subprocess.STDOUT if stdout is not None else None),
                                 preexec_fn=pre, close_fds=True)
        finally:
            os.close(procs)
        return p

    def exec_(self, h, stdin):
        ch = h["ch"]
        t0 = time.monotonic()
        uid, gid = int(h.get("uid", 0)), int(h.get("gid", 0))
        groups = [int(g) for g in h.get("groups", [gid])]
        limit = int(h.get("limit", 1 << 20))
        timeout = h.get("timeout")
        self.seq += 1
        base = CAND if uid == int(self.cfg.get("uid", 1000)) else ROOTCMD
        cgroup = f"{base}/c{os.getpid()}-{self.seq}-{ch}"
        env = h.get("env") or {}
        cwd = h.get("cwd") or "/"
        out = {"op": "exit", "ch": ch, "code": -1, "timed_out": False, "stdout_truncated": False,
               "stderr_truncated": False, "out_len": 0, "err_len": 0}
        try:
            p = self.spawn(h["argv"], uid, gid, groups, cwd, env, cgroup, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            err = f"ale-agent: cannot run {h.get('argv')!r}: {e}\n".encode()
            code = 126 if isinstance(e, PermissionError) else 127
            out.update(code=code, err_len=len(err))
            self.send(out, err)
            self._rmdir_later(cgroup)
            return
        bufs = {"out": bytearray(), "err": bytearray()}
        trunc = {"out": False, "err": False}

        def pump(name, f):
            try:
                while True:
                    d = os.read(f.fileno(), 65536)
                    if not d:
                        break
                    b = bufs[name]
                    room = limit - len(b)
                    if room > 0:
                        b += d[:room]
                    if len(d) > max(room, 0):
                        trunc[name] = True
            except (OSError, ValueError):
                pass

        readers = [threading.Thread(target=pump, args=(n, f), daemon=True)
                   for n, f in (("out", p.stdout), ("err", p.stderr))]
        for r in readers:
            r.start()

        def feed():
            try:
                if stdin:
                    p.stdin.write(stdin)
                p.stdin.close()
            except (OSError, ValueError):
                pass

        threading.Thread(target=feed, daemon=True).start()
        timed_out = False
        try:
            p.wait(timeout=float(timeout) if timeout else None)
        except subprocess.TimeoutExpired:
            timed_out = True
            write(cgroup + "/cgroup.kill", "1")
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        # a background child holding the pipes open does not delay the answer
        for r in readers:
            r.join(0.3 if not timed_out else 1.0)
        if timed_out:
            for _ in range(100):
                if not self._populated(cgroup):
                    break
                write(cgroup + "/cgroup.kill", "1")
                time.sleep(0.02)
        code = p.returncode if p.returncode is not None else -1
        if code < 0:
            code = 128 - code
        so, se = bytes(bufs["out"]), bytes(bufs["err"])
        out.update(code=code, timed_out=timed_out, stdout_truncated=trunc["out"], stderr_truncated=trunc["err"],
                   out_len=len(so), err_len=len(se), duration_s=round(time.monotonic() - t0, 4))
        self.send(out, so + se)
        for f in (p.stdout, p.stderr):
            with contextlib.suppress(OSError):
                f.close()
        self._rmdir_later(cgroup)

    @staticmethod
    def _populated(cgroup):
        try:
            return "populated 1" in readf(cgroup + "/cgroup.events")
        except OSError:
            return False

    def _rmdir_later(self, cgroup):
        def rm():
            for _ in range(3600):
                try:
                    os.rmdir(cgroup)
                    return
                except FileNotFoundError:
                    return
                except OSError:
                    time.sleep(1)
        threading.Thread(target=rm, daemon=True).start()

    # -- halt ---------------------------------------------------------------------
    def halt(self, h):
        t0 = time.monotonic()
        keep = {int(u) for u in h.get("keep_uids", [])}
        bound = float(h.get("bound", 10.0))
        deadline = t0 + bound
        res = {"op": "halted", "ch": h["ch"], "frozen": False, "killed": 0, "survivors": [], "dying": 0}
        write(CAND + "/cgroup.freeze", "1")
        while time.monotonic() < min(deadline, t0 + 2):
            if "frozen 1" in readf(CAND + "/cgroup.events"):
                res["frozen"] = True
                break
            time.sleep(0.005)
        victims = set(self._cgroup_pids(CAND)) | set(self._user_pids(keep))
        victims = {p for p in victims if self._uid(p) not in keep}
        res["killed"] = len(victims)
        write(CAND + "/cgroup.kill", "1")
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        write(CAND + "/cgroup.freeze", "0")
        while True:
            alive = [p for p in set(self._user_pids(keep)) | set(self._cgroup_pids(CAND))
                     if self._state(p) not in (None, "Z", "X")]
            alive = [p for p in alive if self._uid(p) not in keep]
            for p in alive:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
            if not alive:
                break
            if time.monotonic() > deadline:
                dying = [p for p in alive if self._state(p) == "D"]
                res["dying"] = len(dying)
                res["survivors"] = [f"{p}:{self._uid(p)}:{self._state(p)}:{self._name(p)}" for p in alive
                                    if p not in dying]
                break
            time.sleep(0.01)
        res["duration_s"] = round(time.monotonic() - t0, 4)
        self.send(res)

    @staticmethod
    def _cgroup_pids(cg):
        pids = []
        for d, _dirs, files in os.walk(cg):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    pids += [int(x) for x in readf(d + "/cgroup.procs").split()]
        return pids

    @staticmethod
    def _status(pid):
        try:
            return readf(f"/proc/{pid}/status")
        except OSError:
            return ""

    def _uid(self, pid):
        for ln in self._status(pid).splitlines():
            if ln.startswith("Uid:"):
                return int(ln.split()[1])
        return None

    def _state(self, pid):
        for ln in self._status(pid).splitlines():
            if ln.startswith("State:"):
                return ln.split()[1]
        return None

    def _name(self, pid):
        for ln in self._status(pid).splitlines():
            if ln.startswith("Name:"):
                return ln.split(None, 1)[1] if len(ln.split()) > 1 else ""
        return ""

    def _user_pids(self, keep):
        """Every process of a uid but root's (ale's init, agent and the kernel's threads)
        and the kept ones: the candidate's, and any other user's it may have become."""
        out = []
        for p in os.listdir("/proc"):
            if p.isdigit() and int(p) != 1:
                u = self._uid(int(p))
                if u not in (None, 0) and u not in keep:
                    out.append(int(p))
        return out

    # -- tunnel -------------------------------------------------------------------
    def tcp_open(self, ch, port):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.settimeout(None)
        except OSError as e:
            self.send({"op": "close", "ch": ch, "error": str(e)})
            return
        self.tcp[ch] = s
        self.send({"op": "opened", "ch": ch})
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                self.send({"op": "data", "ch": ch}, d)
        except OSError:
            pass
        self.send({"op": "eof", "ch": ch})

    def tcp_close(self, ch, tell=True):
        s = self.tcp.pop(ch, None)
        if s is not None:
            with contextlib.suppress(OSError):
                s.close()
        if tell:
            self.send({"op": "close", "ch": ch})


if __name__ == "__main__":
    if os.getpid() == 1 or "--init" in sys.argv:
        init()
    else:
        Agent().serve()
