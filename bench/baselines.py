"""Baselines measured beside agentbox in the same run.

* ``bare_true``: ``subprocess.run(["true"])`` — the floor for spawning anything from Python.
* ``PlainBwrap``: bubblewrap with agentbox's namespace/mount shape (copied from
  ``SandboxHost.bwrap_argv``): the same ``--unshare-*`` set, a small read-only rootfs
  directory as ``/``, the host ``/usr`` read-only, ``/proc``, ``/dev``, tmpfs ``/tmp``,
  ``/var/tmp`` and ``/dev/shm``, a bound ``/workspace`` and the same compiled seccomp filter, started as an
  unprivileged host uid. What it lacks on purpose is everything agentbox adds around it:
  the disk image, the overlay root, cgroups, the state database and the readiness handshake.
  ``run_true_with_veth`` gives it a veth pair as well: the floor for a networked create.
* ``NsenterTarget``: a long-lived plain bwrap sandbox, entered with ``nsenter`` (all
  namespaces, root, cwd, uid/gid) to run one command: the exec-path floor without the
  cgroup leaf and seccomp that agentbox's launcher adds.
* ``Podman``: ``podman run --rm`` and ``podman exec`` on a template's rootfs tree, when
  podman is installed (``scripts/install.sh --bench``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

from agentbox.isolation import seccomp
from agentbox.runtime.host import BASE_PATH, SANDBOX_GID, SANDBOX_UID
from common import now_ns

# Host uid/gid the plain bwrap baseline runs as: unprivileged, and outside agentbox's
# range (2_000_000 + slot, slot < 4096), so it never shares an id with a sandbox.
BASELINE_UID = 2_999_000
BASELINE_GID = 2_999_000
_ENV = {"PATH": BASE_PATH}


def bare_true() -> int:
    """Nanoseconds for ``subprocess.run(["true"])``."""
    t0 = now_ns()
    done = subprocess.run(["true"], check=False)
    elapsed = now_ns() - t0
    if done.returncode != 0:
        raise RuntimeError(f"true exited {done.returncode}")
    return elapsed


def podman_path() -> str | None:
    """podman, when installed (``scripts/install.sh --bench`` installs it)."""
    return shutil.which("podman")


def template_rootfs(home: Path, name: str = "default") -> Path:
    """The rootfs tree of template ``name`` in ``home``: what its sandboxes' overlay has
    below, and what the podman rows run on."""
    from agentbox.runtime.runtime import Runtime

    return Runtime(home).templates.get(name).rootfs


class Podman:
    """``podman run --rm`` and ``podman exec`` on a rootfs tree, network none, as a
    container runtime does agentbox's job.

    The tree is used as agentbox uses a template: an overlay on top (``--rootfs DIR:O``,
    so nothing is written into it) and, when the template binds the host's ``/usr``, the
    same bind read-only. Two settings of this host, not of the comparison: Debian 12's crun
    (1.8) refuses hybrid cgroups ("drop all controllers from cgroupv2"), so runc runs the
    containers when it is installed (``scripts/install.sh --bench`` installs both); and
    root here lacks CAP_SYS_RESOURCE, so podman's default rlimits (above this process's
    hard limits) are refused: lower ones are passed.
    """

    def __init__(self, podman: str, rootfs: Path, host_usr: bool = True) -> None:
        self.podman = podman
        self.base = [podman, *(["--runtime", "runc"] if shutil.which("runc") else [])]
        self.options = [
            "--network=none",
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=32768:32768",
            *(["--volume=/usr:/usr:ro"] if host_usr else []),
            "--rootfs",
            f"{rootfs}:O",
        ]
        self.container: str | None = None

    def run_argv(self, *command: str) -> list[str]:
        return [*self.base, "run", "--rm", *self.options, *command]

    def run_true(self) -> int:
        """Nanoseconds for ``podman run --rm ... true`` from spawn to exit."""
        return _timed(self.run_argv("true"), "podman run")

    def start(self) -> str:
        """A long-lived container (``sleep infinity``) for ``exec_argv``; its id."""
        done = subprocess.run(
            [*self.base, "run", "-d", *self.options, "sleep", "infinity"],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"podman run -d exited {done.returncode}: {done.stderr[-300:]!r}")
        self.container = done.stdout.decode().strip()
        return self.container

    def exec_argv(self, *command: str) -> list[str]:
        assert self.container is not None, "start() first"
        return [*self.base, "exec", self.container, *command]

    def close(self) -> None:
        """Remove the container ``start`` made (at once: no stop timeout)."""
        if self.container is not None:
            subprocess.run([*self.base, "rm", "-f", "-t", "0", self.container],
                           capture_output=True, check=False)  # fmt: skip
            self.container = None


def _timed(argv: list[str], what: str) -> int:
    t0 = now_ns()
    done = subprocess.run(argv, capture_output=True, check=False)
    elapsed = now_ns() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited {done.returncode}: {done.stderr[-300:]!r}")
    return elapsed


class PlainBwrap:
    """bubblewrap with agentbox's argv shape, minus agentbox's own machinery."""

    def __init__(self, workdir: Path, seccomp_cache: Path) -> None:
        self.workdir = workdir
        self.rootfs = workdir / "rootfs"
        self.workspace = workdir / "workspace"
        self.seccomp = seccomp.compiled_filter_path(seccomp_cache)
        self._build_rootfs()

    def _build_rootfs(self) -> None:
        """A few empty mount points and the usr-merge symlinks: / of the baseline sandbox."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o711)
        for name in ("usr", "proc", "dev", "tmp", "var/tmp", "workspace", "etc", "home/user"):
            (self.rootfs / name).mkdir(parents=True, exist_ok=True)
        for name in ("bin", "sbin", "lib", "lib64"):
            link = self.rootfs / name
            if not link.is_symlink():
                link.symlink_to(f"usr/{name}")
        self.rootfs.chmod(0o755)
        self.workspace.mkdir(exist_ok=True)
        os.chown(self.workspace, BASELINE_UID, BASELINE_GID)

    def argv(
        self,
        seccomp_fd: int,
        command: list[str],
        info_fd: int | None = None,
        block_fd: int | None = None,
    ) -> list[str]:
        argv = [
            "bwrap",
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_GID),
            "--hostname",
            "baseline",
            "--disable-userns",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--as-pid-1",
            "--ro-bind",
            str(self.rootfs),
            "/",
            "--ro-bind",
            "/usr",
            "/usr",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "1777",
            "--size",
            str(32 << 20),
            "--tmpfs",
            "/dev/shm",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            "/var/tmp",
            "--bind",
            str(self.workspace),
            "/workspace",
            "--seccomp",
            str(seccomp_fd),
            "--chdir",
            "/workspace",
            "--clearenv",
            "--setenv",
            "PATH",
            BASE_PATH,
        ]
        if info_fd is not None:
            argv += ["--info-fd", str(info_fd), "--die-with-parent"]
        if block_fd is not None:
            argv += ["--block-fd", str(block_fd)]
        return [*argv, "--", *command]

    def popen(
        self, command: list[str], info_fd: int | None = None, block_fd: int | None = None
    ) -> tuple[subprocess.Popen[bytes], int]:
        """Start bwrap as the unprivileged baseline uid; returns it and the seccomp fd."""
        # bwrap read()s the filter from the fd's offset, so every launch needs a fresh fd.
        seccomp_fd = os.open(self.seccomp, os.O_RDONLY)
        fds = tuple(fd for fd in (seccomp_fd, info_fd, block_fd) if fd is not None)
        try:
            proc = subprocess.Popen(
                self.argv(seccomp_fd, command, info_fd, block_fd),
                stdin=subprocess.DEVNULL,
                pass_fds=fds,
                env=_ENV,
                user=BASELINE_UID,
                group=BASELINE_GID,
                extra_groups=[],
            )
        except BaseException:
            os.close(seccomp_fd)
            raise
        return proc, seccomp_fd

    def run_true(self) -> int:
        """Nanoseconds from spawning bwrap to its exit after running ``true`` inside."""
        t0 = now_ns()
        proc, seccomp_fd = self.popen(["true"])
        try:
            code = proc.wait()
        finally:
            os.close(seccomp_fd)
        elapsed = now_ns() - t0
        if code != 0:
            raise RuntimeError(f"plain bwrap exited {code}; is bubblewrap usable unprivileged?")
        return elapsed

    def run_true_with_veth(self, ifname: str) -> int:
        """Nanoseconds from spawning bwrap to its exit after running ``true``, with a veth
        pair set up into its network namespace first, as a plain script would do it
        (``ip``, then ``nsenter … ip``; bwrap waits on ``--block-fd`` meanwhile). No
        default route: no namespace of a test gets one, so the baseline does one step less
        than a sandbox."""
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        t0 = now_ns()
        try:
            proc, seccomp_fd = self.popen(["true"], info_fd=info_w, block_fd=block_r)
        finally:
            os.close(info_w)
            os.close(block_r)
        try:
            pid = NsenterTarget._child_pid(info_r)
            _ip_batch(["ip", "-batch", "-"],
                      f"link add {ifname} type veth peer name eth0 netns {pid}\n"
                      f"addr add 10.251.0.0/31 dev {ifname}\nlink set {ifname} up\n")  # fmt: skip
            _ip_batch(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-batch", "-"],
                      "addr add 10.251.0.1/31 dev eth0\nlink set eth0 up\n")  # fmt: skip
            os.write(block_w, b"go")
            code = proc.wait()
        finally:
            os.close(info_r)
            os.close(block_w)
            os.close(seccomp_fd)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        elapsed = now_ns() - t0
        # The namespace dies asynchronously (the kernel's netns cleanup work), taking the
        # veth with it some time later: gone now, so the next round can name it again.
        subprocess.run(["ip", "link", "del", ifname], capture_output=True, check=False)
        if code != 0:
            raise RuntimeError(f"plain bwrap with a veth exited {code}")
        return elapsed


def _ip_batch(argv: list[str], commands: str) -> None:
    done = subprocess.run(argv, input=commands, text=True, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {done.stderr.strip()}")


class NsenterTarget:
    """A live plain-bwrap sandbox (``sleep`` as its pid 1) to ``nsenter`` into."""

    def __init__(self, bwrap: PlainBwrap) -> None:
        info_r, info_w = os.pipe()
        try:
            self.proc, seccomp_fd = bwrap.popen(["sleep", "infinity"], info_fd=info_w)
            os.close(seccomp_fd)
        finally:
            os.close(info_w)
        try:
            self.pid = self._child_pid(info_r)
            self._wait_exec(self.pid, "sleep")
        except BaseException:
            self.close()
            raise
        finally:
            os.close(info_r)
        self.argv = [
            "nsenter",
            "--target",
            str(self.pid),
            "--all",
            "--root",
            "--wd",
            "--setuid",
            str(SANDBOX_UID),
            "--setgid",
            str(SANDBOX_GID),
            "true",
        ]

    @staticmethod
    def _child_pid(fd: int) -> int:
        buf = b""
        while True:
            ready, _, _ = select.select([fd], [], [], 10.0)
            if not ready:
                raise RuntimeError("bwrap did not report its child pid")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"bwrap exited before reporting its child pid: {buf!r}")
            buf += chunk
            with contextlib.suppress(ValueError):
                return int(json.loads(buf)["child-pid"])

    @staticmethod
    def _wait_exec(pid: int, comm: str) -> None:
        """bwrap reports the pid before the child has finished its setup (the nested user
        namespace of --disable-userns): entering earlier finds the wrong namespaces."""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
                    return
            time.sleep(0.001)
        raise RuntimeError(f"the baseline sandbox's pid 1 never became {comm}")

    def run_true(self) -> int:
        t0 = now_ns()
        done = subprocess.run(self.argv, env=_ENV, check=False)
        elapsed = now_ns() - t0
        if done.returncode != 0:
            raise RuntimeError(f"nsenter exited {done.returncode}")
        return elapsed

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, AttributeError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
