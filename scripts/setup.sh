#!/usr/bin/env bash
# Install what ale needs on a Debian machine and make sure a Docker engine runs.
# Idempotent: a second call only checks. Used by `make demo`, `make test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

# Where this machine's engine keeps its state; a test points these into a temp folder.
DAEMON_JSON=${ALE_DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
DOCKER_PID_FILE=${ALE_DOCKER_PID_FILE:-/var/run/docker.pid}
DOCKERD_LOG=${ALE_DOCKERD_LOG:-/var/log/ale-dockerd.log}
BUSYBOX=${ALE_BUSYBOX:-/bin/busybox}

apt_ready=0
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_ready = 0 ]; then as_root apt-get update -qq; apt_ready=1; fi
  say "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# 1. Debian packages: the Docker engine, debootstrap (base images without a
#    registry), chromium (the HTML report's browser test), python venv.
if command -v apt-get >/dev/null; then
  pkgs=(debootstrap python3-venv bubblewrap iproute2 util-linux)  # bubblewrap: confined harnesses; ip, nsenter: the Ray cluster test
  # The qemu provider (docs/vm.md): QEMU, qemu-img, a static busybox for the guest's
  # initrd, mkfs.ext4 -d for its root disk; syslinux, mtools, dosfstools, fdisk for the
  # foreign-style test disk (ale image build --vm --foreign-test); ALE_SKIP_QEMU=1 skips them.
  [ "${ALE_SKIP_QEMU:-0}" = 1 ] || pkgs+=(qemu-system-x86 qemu-utils busybox-static e2fsprogs syslinux syslinux-common mtools dosfstools fdisk)
  command -v dockerd >/dev/null || pkgs+=(docker.io)
  [ "${ALE_SKIP_CHROMIUM:-0}" = 1 ] || pkgs+=(chromium)
  # npm: the desktop image fetches its pinned Tailwind build with `npm pack` when it is first
  # built (by `ale exp run`/`ale run` for a GUI task, `make demo` included).
  command -v npm >/dev/null || pkgs+=(npm)
  # One package apt cannot install fails the whole batch: then each alone, so the engine
  # is not lost with (say) chromium, and the check at the end names what is missing.
  apt_install "${pkgs[@]}" || for p in "${pkgs[@]}"; do
    apt_install "$p" || say "could not install $p (not root?); continuing"
  done
fi

# 1b. gVisor (runsc), the sandbox tier under a user-space kernel (docs/operator-runbook.md),
#     where Debian ships it; ALE_SKIP_GVISOR=1 skips it. It is registered in the default
#     engine's /etc/docker/daemon.json, read when dockerd starts below, or reloaded by
#     SIGHUP into a running one (running containers stay; no restart). --network=none:
#     sandboxes are offline, and Debian's runsc mistakes Docker's empty network namespace
#     for the host's on kernels >= 6; --oci-seccomp: Docker's seccomp profile inside gVisor.
RUNSC_ARGS='["--network=none", "--oci-seccomp"]'
register_runsc() {
  command -v runsc >/dev/null && [ "$(id -u)" = 0 ] && [ -z "${DOCKER_HOST:-}" ] || return 0
  mkdir -p "$(dirname "$DAEMON_JSON")"
  python3 - "$(command -v runsc)" "$RUNSC_ARGS" "$DAEMON_JSON" <<'PY' || { say "could not register runsc in $DAEMON_JSON"; return 0; }
import json, os, sys
path, args, f = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
conf = json.load(open(f)) if os.path.exists(f) and os.path.getsize(f) else {}
want = {"path": path, "runtimeArgs": args}
if conf.get("runtimes", {}).get("runsc") != want:
    conf.setdefault("runtimes", {})["runsc"] = want
    tmp = f + ".ale-tmp"
    with open(tmp, "w") as out:
        json.dump(conf, out, indent=2)
    os.replace(tmp, f)
PY
}
if [ "${ALE_SKIP_GVISOR:-0}" != 1 ] && command -v apt-get >/dev/null; then
  if ! command -v runsc >/dev/null && apt-cache policy runsc 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; then
    apt_install runsc || say "could not install runsc (not root?)"
  fi
  register_runsc
fi

# 2. A running Docker engine.
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
    say "starting dockerd"
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    nohup dockerd ${ALE_DOCKER_DAEMON_JSON:+--config-file "$DAEMON_JSON"} >"$DOCKERD_LOG" 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
  docker info >/dev/null 2>&1 || { say "no Docker engine is reachable; start one (dockerd) and retry"; exit 1; }
fi
# 2b. A running engine that lacks runsc reloads its configuration (SIGHUP: no restart).
if command -v runsc >/dev/null && [ "${ALE_SKIP_GVISOR:-0}" != 1 ] && [ -z "${DOCKER_HOST:-}" ] \
   && ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
  pid=$(cat "$DOCKER_PID_FILE" 2>/dev/null || true)
  if [ "$(id -u)" = 0 ] && [ -n "$pid" ] && grep -q '"runsc"' "$DAEMON_JSON" 2>/dev/null; then
    say "registering runsc with the running dockerd (configuration reload)"
    kill -HUP "$pid"
    for _ in $(seq 1 10); do docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' && break; sleep 1; done
  fi
  docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' \
    || say "the Docker engine has no runsc runtime; gVisor runs are refused and their tests skipped (see docs/operator-runbook.md)"
fi

# 3. The Python environment.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import ale, pytest" >/dev/null 2>&1 || [ pyproject.toml -nt .venv/.installed ]; then
  say "installing ale into .venv"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
  touch .venv/.installed
fi

# 3b. The external harness CLIs the gateway tests drive offline (docs/agents.md names
#     the checked versions); skipped with ALE_SKIP_HARNESSES=1 or without npm.
HARNESSES=${ALE_HARNESS_PREFIX:-/opt/ale-harnesses}
if [ "${ALE_SKIP_HARNESSES:-0}" != 1 ] && command -v npm >/dev/null; then
  for spec in claude=@anthropic-ai/claude-code@2.1.197 codex=@openai/codex@0.171.0 gemini=@google/gemini-cli@0.61.0; do
    name=${spec%%=*}; pkg=${spec#*=}
    if [ ! -x "$HARNESSES/$name/node_modules/.bin/$name" ]; then
      say "installing $pkg into $HARNESSES/$name"
      as_root mkdir -p "$HARNESSES/$name" && as_root npm install -s --prefix "$HARNESSES/$name" "$pkg" >/dev/null \
        || say "could not install $pkg; the tests that drive it are skipped"
    fi
  done
fi

# 4. The sandbox image (content-cached: quick when nothing changed).
.venv/bin/ale image build

# 5. Every component promised above is there, or setup fails naming it and its fix.
#    (A pipe into `grep -q` is avoided on purpose: under pipefail grep's early exit
#    fails the pipe, which is how runsc was once skipped without a word.)
missing=()
need() { missing+=("$1 -- fix: $2"); }
has_runtime() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep "\"$1\"" >/dev/null; }
docker info >/dev/null 2>&1 || need "a running Docker engine" "start dockerd as root, then: bash scripts/setup.sh"
command -v bwrap >/dev/null || need "bubblewrap (bwrap)" "apt-get install bubblewrap"
command -v debootstrap >/dev/null || need "debootstrap (base images without a registry)" "apt-get install debootstrap"
command -v ip >/dev/null || need "ip (the Ray cluster test's namespaces)" "apt-get install iproute2"
command -v nsenter >/dev/null || need "nsenter (the Ray cluster test's namespaces)" "apt-get install util-linux"
if [ "${ALE_SKIP_GVISOR:-0}" = 1 ]; then say "gVisor skipped on purpose (ALE_SKIP_GVISOR=1)"
else
  command -v runsc >/dev/null || need "gVisor (runsc)" "apt-get install runsc, or ALE_SKIP_GVISOR=1 to go without it"
  command -v runsc >/dev/null && ! has_runtime runsc \
    && need "runsc registered in the Docker engine" "add it to $DAEMON_JSON 'runtimes' (as scripts/setup.sh does as root) and reload dockerd (kill -HUP)"
fi
if [ "${ALE_SKIP_CHROMIUM:-0}" = 1 ]; then say "chromium skipped on purpose (ALE_SKIP_CHROMIUM=1)"
else command -v chromium >/dev/null || need "chromium" "apt-get install chromium, or ALE_SKIP_CHROMIUM=1"; fi
if [ "${ALE_SKIP_HARNESSES:-0}" = 1 ]; then say "harness CLIs skipped on purpose (ALE_SKIP_HARNESSES=1)"
else
  command -v npm >/dev/null || need "npm" "apt-get install npm"
  for name in claude codex gemini; do
    [ -x "$HARNESSES/$name/node_modules/.bin/$name" ] || need "the $name CLI in $HARNESSES/$name" "npm install --prefix $HARNESSES/$name (versions: scripts/setup.sh), or ALE_SKIP_HARNESSES=1"
  done
fi
if [ "${ALE_SKIP_QEMU:-0}" = 1 ]; then say "the qemu provider's tools skipped on purpose (ALE_SKIP_QEMU=1)"
else
  command -v qemu-system-x86_64 >/dev/null || need "qemu-system-x86_64" "apt-get install qemu-system-x86, or ALE_SKIP_QEMU=1"
  command -v qemu-img >/dev/null || need "qemu-img" "apt-get install qemu-utils, or ALE_SKIP_QEMU=1"
  [ -x "$BUSYBOX" ] && ! ldd "$BUSYBOX" >/dev/null 2>&1 || need "a static busybox (the VM guest's initrd)" "apt-get install busybox-static, or ALE_SKIP_QEMU=1"
  command -v mkfs.ext4 >/dev/null || [ -x /usr/sbin/mkfs.ext4 ] || [ -x /sbin/mkfs.ext4 ] || need "mkfs.ext4" "apt-get install e2fsprogs, or ALE_SKIP_QEMU=1"
fi
if [ ${#missing[@]} -gt 0 ]; then
  say "set-up is incomplete; missing:"
  for m in "${missing[@]}"; do printf '  - %s\n' "$m" >&2; done
  exit 1
fi
say "ready: engine runtimes $(docker info --format '{{json .Runtimes}}' | python3 -c 'import json,sys; print(",".join(sorted(json.load(sys.stdin))))')"
