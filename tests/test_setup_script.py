"""scripts/setup.sh as a fresh Debian machine meets it, with the system's tools stubbed.

The real script runs (bash) from a temp copy of ``scripts/`` and ``pyproject.toml``,
with a PATH of stub executables that log every call and simulate a machine on which
nothing is installed: ``dpkg -s`` fails until the ``apt-get`` stub has "installed" the
package, which puts stub binaries for the commands it provides on PATH; ``docker info``
fails until ``dockerd`` was started and lists runsc among the engine's runtimes only
when the daemon.json it read registered it. Only a few real tools are on PATH (bash,
python3 for daemon.json, coreutils), so nothing the host has installed is seen.
The engine's files (daemon.json, pid file, log), the static busybox and the harness
prefix go to the temp folder through setup.sh's ``ALE_*`` overrides.
A missing install step thus fails here, not on a user's machine (issue 27).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What setup.sh would write or signal on the real machine (comments aside).
HOST_PATHS = ["/etc/docker/daemon.json", "/var/run/docker.pid", "/var/log/ale-dockerd.log"]

PROVIDES = {  # Debian package -> the commands it puts on PATH
    "docker.io": "docker dockerd",
    "runsc": "runsc",
    "bubblewrap": "bwrap",
    "chromium": "chromium",
    "npm": "npm",
    "qemu-system-x86": "qemu-system-x86_64",
    "qemu-utils": "qemu-img",
    "busybox-static": "busybox",
    "e2fsprogs": "mkfs.ext4",
    "debootstrap": "debootstrap",
    "iproute2": "ip",
    "util-linux": "nsenter",
    "python3-venv": "",
}
PROMISED = ["docker.io", "runsc", "bubblewrap", "chromium", "npm", "qemu-system-x86",
            "qemu-utils", "busybox-static", "e2fsprogs", "debootstrap"]
HARNESSES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "gemini": "@google/gemini-cli"}
# The real tools setup.sh and the stubs use; the host's other commands stay out of sight.
REAL = ["bash", "sh", "cat", "grep", "seq", "sleep", "mkdir", "touch", "env", "dirname",
        "basename", "cp", "chmod", "rm", "cut", "printf", "true", "false"]

LOG = 'printf "%s\\n" "$(basename "$0") $*" >> "$STUB_LOG"\n'
STUBS = {
    # Tools always present on a Debian machine.
    "id": LOG + '[ "${1:-}" = -u ] && { echo "${STUB_UID:-0}"; exit 0; }\necho "uid=${STUB_UID:-0}"\n',
    "sudo": LOG + 'exec "$@"\n',
    "nohup": LOG + 'exec "$@"\n',
    "ldd": LOG + 'echo "	not a dynamic executable" >&2; exit 1\n',
    "dpkg": LOG + '[ "$1" = -s ] && grep -qx "$2" "$STUB_STATE/installed" 2>/dev/null\n',
    # The Candidate line comes first, the version table a moment later (as apt-cache
    # writes it): a `| grep -q` reader has gone by then, so the pipe fails as in issue 27.
    "apt-cache": LOG + """[ "$1 $2" = "policy runsc" ] || exit 0
printf 'runsc:\\n  Installed: (none)\\n  Candidate: 20230417.0-1\\n'
sleep 0.2
printf '  Version table:\\n     20230417.0-1 500\\n        500 http://deb.debian.org/debian bookworm/main amd64 Packages\\n'
""",
    "apt-get": LOG + """[ "$(id -u)" = 0 ] || { echo "E: are you root?" >&2; exit 100; }
[ "$1" = install ] || exit 0
shift
pkgs=()
for p in "$@"; do
  case "$p" in -*) continue;; esac
  # A package apt cannot install fails the whole transaction, as apt does.
  case " ${STUB_FAIL:-} " in *" $p "*) echo "E: Unable to locate package $p" >&2; exit 100;; esac
  pkgs+=("$p")
done
for p in "${pkgs[@]}"; do
  echo "$p" >> "$STUB_STATE/installed"
  for b in $(grep "^$p=" "$STUB_LIB/provides" | cut -d= -f2); do
    if [ -e "$STUB_LIB/$b" ]; then cp "$STUB_LIB/$b" "$STUB_SYSBIN/$b"; else cp "$STUB_LIB/tool" "$STUB_SYSBIN/$b"; fi
    chmod +x "$STUB_SYSBIN/$b"
  done
done
""",
}
LIB = {
    # Installed by apt-get (the stub), not there on a fresh machine.
    "tool": LOG,
    "dockerd": LOG + """conf=/etc/docker/daemon.json
while [ $# -gt 0 ]; do [ "$1" = --config-file ] && conf=$2; shift; done
echo $$ > "$ALE_DOCKER_PID_FILE"
if grep -q '"runsc"' "$conf" 2>/dev/null; then echo runsc > "$STUB_STATE/runtimes"; else : > "$STUB_STATE/runtimes"; fi
touch "$STUB_STATE/dockerd-running"
""",
    "docker": LOG + """[ -e "$STUB_STATE/dockerd-running" ] || { echo "Cannot connect to the Docker daemon" >&2; exit 1; }
[ "$1" = info ] || exit 0
if [ "${2:-}" = --format ]; then
  if grep -qx runsc "$STUB_STATE/runtimes"; then echo '{"runc":{"path":"runc"},"runsc":{"path":"runsc"}}'
  else echo '{"runc":{"path":"runc"}}'; fi
else echo "Server Version: 20.10.24"; fi
""",
    "npm": LOG + """prefix=; pkg=
while [ $# -gt 0 ]; do case "$1" in --prefix) prefix=$2; shift;; -*) ;; install) ;; *) pkg=$1;; esac; shift; done
case "$pkg" in
  @anthropic-ai/claude-code@*) name=claude;; @openai/codex@*) name=codex;; @google/gemini-cli@*) name=gemini;;
  *) echo "npm ERR! 404 $pkg" >&2; exit 1;;
esac
case " ${STUB_FAIL:-} " in *" $name "*) echo "npm ERR! network $pkg" >&2; exit 1;; esac
mkdir -p "$prefix/node_modules/.bin"
printf '#!/bin/sh\\necho %s\\n' "$name" > "$prefix/node_modules/.bin/$name"
chmod +x "$prefix/node_modules/.bin/$name"
""",
}


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


class Machine:
    """A fresh Debian machine in a temp folder; ``run()`` runs setup.sh on it."""

    def __init__(self, root: Path, setup: Path = REPO / "scripts" / "setup.sh") -> None:
        host_paths_overridable(setup.read_text())
        self.root = root
        self.tree = root / "repo"
        (self.tree / "scripts").mkdir(parents=True)
        shutil.copy(setup, self.tree / "scripts" / "setup.sh")
        shutil.copy(REPO / "pyproject.toml", self.tree / "pyproject.toml")
        venv = self.tree / ".venv" / "bin"
        venv.mkdir(parents=True)
        for name in ("python", "ale", "pip"):
            _script(venv / name, LOG)
        (self.tree / ".venv" / ".installed").touch()
        os.utime(self.tree / "pyproject.toml", (1, 1))  # .installed is newer
        self.stubs, self.lib, self.sysbin, self.real, self.state = (
            root / d for d in ("stubs", "lib", "sysbin", "real", "state"))
        for d in (self.stubs, self.lib, self.sysbin, self.real, self.state):
            d.mkdir()
        for name, body in STUBS.items():
            _script(self.stubs / name, body)
        for name, body in LIB.items():
            _script(self.lib / name, body)
        (self.lib / "provides").write_text("".join(f"{p}={b}\n" for p, bs in PROVIDES.items() for b in bs.split()))
        for name in REAL:
            found = shutil.which(name)
            assert found, f"this test needs {name} on the host"
            (self.real / name).symlink_to(found)
        py = Path("/usr/bin/python3")
        (self.real / "python3").symlink_to(py if py.exists() else Path(shutil.which("python3") or "python3"))
        self.log = root / "calls.log"
        self.daemon_json = root / "etc" / "docker" / "daemon.json"
        self.harnesses = root / "opt" / "ale-harnesses"

    def run(self, **env: str) -> subprocess.CompletedProcess[str]:
        self.log.write_text("")
        e = {
            "PATH": f"{self.stubs}:{self.sysbin}:{self.real}",
            "HOME": str(self.root), "LANG": "C.UTF-8",
            "STUB_LOG": str(self.log), "STUB_STATE": str(self.state),
            "STUB_LIB": str(self.lib), "STUB_SYSBIN": str(self.sysbin),
            "ALE_DOCKER_DAEMON_JSON": str(self.daemon_json),
            "ALE_DOCKER_PID_FILE": str(self.root / "docker.pid"),
            "ALE_DOCKERD_LOG": str(self.root / "log" / "ale-dockerd.log"),
            "ALE_BUSYBOX": str(self.sysbin / "busybox"),
            "ALE_HARNESS_PREFIX": str(self.harnesses),
            **env,
        }
        return subprocess.run(["bash", str(self.tree / "scripts" / "setup.sh")], env=e,
                              capture_output=True, text=True, timeout=60)

    def calls(self, tool: str) -> list[str]:
        return [c for c in self.log.read_text().splitlines() if c.split(" ", 1)[0] == tool]

    def installed(self) -> list[str]:
        f = self.state / "installed"
        return f.read_text().split() if f.exists() else []


def host_paths_overridable(script: str) -> None:
    """The stubs cannot stop setup.sh writing the host's engine files (id says root):
    each such path may appear only as the default of its ALE_* override."""
    for line in script.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for path in HOST_PATHS:
            if path in line and not re.search(r"\$\{ALE_[A-Z_]+:-" + re.escape(path) + r"\}", line):
                pytest.fail(f"setup.sh uses {path} without an ALE_* override, so this test would touch the host: {line.strip()}")


def out(r: subprocess.CompletedProcess[str]) -> str:
    return r.stdout + r.stderr


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def assert_complete(m: Machine, r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, out(r)
    assert set(PROMISED) <= set(m.installed()), (m.installed(), out(r))
    assert '"runsc"' in m.daemon_json.read_text()
    assert m.calls("dockerd"), "dockerd was never started"
    for name in HARNESSES:
        assert (m.harnesses / name / "node_modules" / ".bin" / name).exists(), out(r)
    assert m.calls("ale") == ["ale image build"]
    last = r.stderr.strip().splitlines()[-1]
    assert "ready" in last and "runsc" in last, last


def test_fresh_machine_installs_and_registers_everything(machine: Machine) -> None:
    r = machine.run()
    assert_complete(machine, r)
    assert any("runsc" in c for c in machine.calls("apt-get")), "runsc was never installed"
    assert "missing" not in out(r)


@pytest.mark.parametrize(("fail", "named", "fix"), [
    ("runsc", "gVisor (runsc)", "apt-get install runsc"),
    ("bubblewrap", "bubblewrap (bwrap)", "apt-get install bubblewrap"),
    ("chromium", "chromium", "apt-get install chromium"),
    ("qemu-system-x86", "qemu-system-x86_64", "apt-get install qemu-system-x86"),
    ("codex", "the codex CLI", "npm install --prefix"),
    ("debootstrap", "debootstrap", "apt-get install debootstrap"),
])
def test_a_failed_install_fails_setup_naming_it_and_its_fix(machine: Machine, fail: str, named: str, fix: str) -> None:
    r = machine.run(STUB_FAIL=fail)
    assert r.returncode != 0, out(r)
    text = out(r)
    assert "set-up is incomplete" in text
    missing = [line for line in text.splitlines() if line.startswith("  - ")]
    assert len(missing) == 1, missing  # the failed one only: the others still got installed
    assert named in missing[0] and fix in missing[0], missing
    assert "ready" not in text
    assert machine.calls("dockerd"), "one failed package must not cost the engine"


@pytest.mark.parametrize(("var", "skipped", "said"), [
    ("ALE_SKIP_GVISOR", ["runsc"], "gVisor skipped on purpose"),
    ("ALE_SKIP_CHROMIUM", ["chromium"], "chromium skipped on purpose"),
    ("ALE_SKIP_QEMU", ["qemu-system-x86", "qemu-utils", "busybox-static", "e2fsprogs"], "qemu provider's tools skipped on purpose"),
    ("ALE_SKIP_HARNESSES", [], "harness CLIs skipped on purpose"),
])
def test_an_opt_out_skips_its_component_and_still_succeeds(machine: Machine, var: str, skipped: list[str], said: str) -> None:
    r = machine.run(**{var: "1"})
    assert r.returncode == 0, out(r)
    assert said in out(r)
    assert not set(skipped) & set(machine.installed()), machine.installed()
    assert "ready" in r.stderr.strip().splitlines()[-1]
    if var == "ALE_SKIP_GVISOR":
        assert not machine.calls("apt-cache") and not machine.daemon_json.exists()
    if var == "ALE_SKIP_HARNESSES":
        assert not machine.calls("npm") and not machine.harnesses.exists()


def test_a_second_run_installs_nothing(machine: Machine) -> None:
    assert_complete(machine, machine.run())
    before = machine.installed()
    conf = machine.daemon_json.read_text()
    r = machine.run()
    assert r.returncode == 0, out(r)
    assert machine.installed() == before
    assert not [c for c in machine.calls("apt-get") if "install" in c.split()]
    assert not machine.calls("apt-get") and not machine.calls("npm") and not machine.calls("dockerd")
    assert machine.daemon_json.read_text() == conf
    assert "installing" not in out(r) and "starting dockerd" not in out(r)
    assert "ready" in r.stderr.strip().splitlines()[-1]


def test_a_running_engine_without_runsc_is_reloaded_not_restarted(machine: Machine) -> None:
    """An engine already runs (docker.io installed by hand, no runsc): setup installs runsc,
    registers it in daemon.json and sends the running dockerd SIGHUP, which rereads it."""
    m = machine
    for b in ("docker", "dockerd"):
        shutil.copy(m.lib / b, m.sysbin / b)
    (m.state / "installed").write_text("docker.io\n")
    (m.state / "runtimes").write_text("")
    (m.state / "dockerd-running").touch()
    reload = f'grep -q \'"runsc"\' "{m.daemon_json}" && echo runsc > "{m.state / "runtimes"}"; echo hup >> "{m.state / "hups"}"'
    engine = subprocess.Popen(["bash", "-c", f"trap '{reload}' HUP; for _ in $(seq 1 300); do sleep 0.1; done"])
    try:
        (m.root / "docker.pid").write_text(f"{engine.pid}\n")
        r = m.run()
    finally:
        engine.kill()
        engine.wait()
    assert r.returncode == 0, out(r)
    assert "registering runsc with the running dockerd (configuration reload)" in out(r)
    assert (m.state / "hups").read_text().split() == ["hup"]
    assert not m.calls("dockerd"), "the running engine was restarted"
    assert "runsc" in m.installed()
    assert "runsc" in r.stderr.strip().splitlines()[-1]
