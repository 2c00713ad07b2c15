"""Host resources of one sandbox: its directories, disk, overlay root and first process.

``SandboxHost`` knows *where* things are and how to build and tear them down; the
lifecycle rules (state, expiry, listing) live in ``runtime.runtime``.

Directory layout under ``$AGENTBOX_HOME/sandboxes/ID``::

    disk.img          sparse ext4 image (the sandbox's disk quota)
    disk/             its mount: upper/ work/ (overlay), workspace/, tmp/, procs/ (host only)
    root/             overlay mount: template (read-only) + disk/upper
    bwrap.log         bubblewrap's stderr, for error messages
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox.errors import SandboxError
from agentbox.isolation import disk, diskpool, initfs, locales, syscalls
from agentbox.isolation.cgroups import Limits, SandboxCgroup

# Re-exported (``X as X``): what starts a command lives in enter_argv, light enough for
# the CLI's quick exec path; these names were always imported from here.
from agentbox.runtime.enter_argv import BASE_PATH as BASE_PATH
from agentbox.runtime.enter_argv import SANDBOX_GID as SANDBOX_GID
from agentbox.runtime.enter_argv import SANDBOX_UID as SANDBOX_UID
from agentbox.runtime.enter_argv import base_env as base_env

# Host uid/gid of sandbox N: UID_BASE + N, outside the usual subuid ranges.
UID_BASE = 2_000_000
INIT_PATH = "/.agentbox/init"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
MOUNT_POINTS = ("proc", "dev", "tmp", "var/tmp", "workspace", "usr", ".agentbox")
READY_TIMEOUT_S = 15.0


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: with the pid, identifies a process across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses: split after the last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19])


def wait_exited(pid: int | None, start_time: int | None, timeout: float = 10.0) -> None:
    """Return once the process has finished exiting (a zombie, or reaped), or at
    ``timeout``. An emptied cgroup is not that yet: the kernel takes a task out of its
    cgroup before it marks it exited, and in between its namespaces are gone while a
    pidfd, and /proc's state, still show it alive (a caller that trusted them then
    would try to enter a sandbox that has no namespaces left)."""
    if pid is None:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if process_start_time(pid) == start_time:  # not a later process on that pid
            select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)


LAYOUT_KEY = "1"  # change with lay_out_disk: formatted images are cached per layout


def lay_out_disk(root: Path) -> None:
    """A sandbox disk's directories and modes (owners are set per sandbox): the overlay's
    upper and work, /workspace, /tmp, /var/tmp, the agent's home in the upper layer, and
    procs/ (host-only records of background processes)."""
    for name, mode in (("upper", 0o755), ("work", 0o755), ("workspace", 0o755),
                       ("tmp", 0o1777), ("var-tmp", 0o1777), ("procs", 0o700)):  # fmt: skip
        (root / name).mkdir(exist_ok=True)
        (root / name).chmod(mode)
    (root / "upper" / "home" / "user").mkdir(parents=True, exist_ok=True)


def release_home_mounts(home: Path) -> None:
    """Unmount what a home keeps mounted on the host beside its sandboxes: the disk pool,
    the init tmpfs and named volumes. For throwing a home away: sandboxes still in it
    lose their disks."""
    diskpool.release(home)
    initfs.release(home)
    volumes = home / "volumes" / "mnt"  # named volumes: their images (data) stay
    for mountpoint in sorted(volumes.iterdir()) if volumes.is_dir() else []:
        disk.unmount(mountpoint)


@dataclass(frozen=True)
class LaunchPaths:
    """The launcher binary (isolation/launcher.py) and the compiled seccomp filter."""

    nsexec: Path
    seccomp: Path


@dataclass(frozen=True)
class Launch:
    """What starting a sandbox's first process takes, on any tier: its cgroup (already
    enforcing ``limits``, which other tiers pass on), whether the host's /usr is bound,
    its memory in bytes and the seconds it may live."""

    paths: LaunchPaths
    cgroup: SandboxCgroup
    host_usr: bool
    memory_bytes: int
    lifetime_s: float
    limits: Limits | None = None
    # Called with the first process's pid as soon as it exists (the namespaces tier).
    wire_netns: Callable[[int], None] | None = None
    # Mounts the sandbox's disk and root (a first start): the namespaces tier runs it
    # while the launcher it started already joins the cgroups (see ``SandboxHost.launch``).
    prepare: Callable[[], None] | None = None


class SandboxHost:
    def __init__(self, home: Path, sandbox_id: str, slot: int) -> None:
        self.id = sandbox_id
        self.slot = slot
        # Absolute: the launcher binds these paths into a view of its own (see launch) and
        # bubblewrap resolves them there from /, not from our working directory.
        home = Path(os.path.abspath(home))
        self.home = home
        self.dir = home / "sandboxes" / sandbox_id
        legacy = self.dir / "disk.img"  # sandboxes created before the disk pool
        self.image = legacy if legacy.exists() else diskpool.pool_dir(home) / f"{sandbox_id}.img"
        self.disk = self.dir / "disk"
        self.root = self.dir / "root"
        self.workspace = self.disk / "workspace"
        self.procs = self.disk / "procs"
        self.log = self.dir / "bwrap.log"
        self.paused_marker = self.dir / "paused"  # exists while the sandbox is paused
        self.activity_marker = self.dir / "activity"  # its mtime: the last activity seen
        self.host_uid = UID_BASE + slot
        self.host_gid = UID_BASE + slot
        self.hostname = sandbox_id
        # Named volumes to bind at the next launch (agentbox.volumes.service.Bind); the
        # runtime sets them from the volume records before it launches.
        self.volume_binds: list[Any] = []
        self._dir_made = False  # by make_dir, through this object

    # build ----------------------------------------------------------------------------
    def make_dir(self) -> None:
        """The sandbox's host directory, new (a leftover of the same id is refused)."""
        self.dir.mkdir(parents=True, exist_ok=False)
        self.dir.chmod(0o711)  # bwrap runs as the sandbox uid: it may traverse, not list
        self._dir_made = True

    def prepare_filesystem(
        self,
        template_root: Path,
        disk_bytes: int,
        disk_cache: Path | None = None,
        trust: Mapping[str, bytes] | None = None,
        clone_of: SandboxHost | None = None,
        populate: Callable[[Path], None] | None = None,
    ) -> None:
        """Disk image, its layout, and the overlay root. Undone by ``teardown``.

        ``trust``: files for the sandbox's ``/etc/agentbox/`` (the egress CA certificate
        and bundle of a sandbox with credentials), written into the fresh upper layer
        before the overlay exists, so nothing in the template can redirect them."""
        if not self._dir_made:
            self.make_dir()
        if clone_of is None:
            disk.make_filesystem(self.image, disk_bytes, disk_cache, lay_out_disk, LAYOUT_KEY)
        else:
            with diskpool.frozen(clone_of.disk):  # a consistent instant of the source
                disk.clone_file(clone_of.image, self.image)
        disk.mount_disk(self.image, self.disk)
        self.disk.chmod(0o711)
        if clone_of is not None:
            self._adopt(clone_of)
        if populate is not None:  # a restore: the disk's files, before anything uses them
            populate(self.disk)
        if clone_of is not None or populate is not None or disk_cache is None:
            lay_out_disk(self.disk)  # a fresh image from the cache has it all already
        # What the agent may write: its workspace, /tmp, and its home (in the upper layer).
        home = self.disk / "upper" / "home" / "user"
        for path in (self.workspace, self.disk / "tmp", self.disk / "var-tmp", home):
            os.chown(path, self.host_uid, self.host_gid)
        if trust:
            self._write_trust(trust)
        self.root.mkdir()
        # The layers by descriptor: the options show in the sandbox's mountinfo, and host
        # paths there would tell the agent where the home is (and commas or colons in a
        # path would break the option string).
        layers = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                  for path in (template_root, self.disk / "upper", self.disk / "work")]  # fmt: skip
        lower, upper, work = (f"/proc/self/fd/{fd}" for fd in layers)
        try:
            syscalls.mount(
                "agentbox",
                str(self.root),
                "overlay",
                syscalls.MS_NOSUID | syscalls.MS_NODEV,
                f"lowerdir={lower},upperdir={upper},workdir={work}",
            )
        except OSError as e:
            raise SandboxError(f"could not mount the sandbox root overlay: {e}") from e
        finally:
            for fd in layers:
                os.close(fd)
        # Mount points: bwrap runs unprivileged and cannot create them in a root-owned
        # tree, and an imported image may lack them (they land in the upper layer). Looked
        # up in the template first: a mkdir through the overlay costs ~50 µs even when
        # the directory exists, and the default template has them all.
        for mountpoint in MOUNT_POINTS:
            if not (template_root / mountpoint).is_dir():
                (self.root / mountpoint).mkdir(parents=True, exist_ok=True)
        if not (template_root / INIT_PATH.lstrip("/")).is_file():
            (self.root / INIT_PATH.lstrip("/")).touch()

    def _adopt(self, source: SandboxHost) -> None:
        """Make a cloned disk this sandbox's: files the source's user owned (stored under
        its host ids) become this sandbox's user's; the source's host-side records of
        processes and overlay scratch go. Nothing runs on the clone yet, so the walk
        cannot be raced; it never follows a symlink."""
        for scratch in (self.disk / "procs", self.disk / "work"):
            if scratch.is_symlink() or not scratch.is_dir():
                raise SandboxError(f"the source sandbox's {scratch.name}/ is not a directory")
            _remove_tree(scratch)
        for root, dirs, files in os.walk(self.disk):
            for name in (*dirs, *files):
                path = os.path.join(root, name)
                st = os.lstat(path)
                uid = self.host_uid if st.st_uid == source.host_uid else -1
                gid = self.host_gid if st.st_gid == source.host_gid else -1
                if uid != -1 or gid != -1:
                    os.lchown(path, uid, gid)

    def _write_trust(self, files: Mapping[str, bytes]) -> None:
        etc = self.disk / "upper" / "etc"
        target = etc / "agentbox"
        for directory in (etc, target):
            if directory.is_symlink():  # only a cloned disk could hold one
                raise SandboxError(f"{directory.name} in the sandbox's upper layer is a symlink")
            directory.mkdir(mode=0o755, exist_ok=True)
            directory.chmod(0o755)
        for name in files:
            (target / name).unlink(missing_ok=True)  # a clone's; unlink never follows
        for name, data in files.items():
            if "/" in name or name in ("", ".", ".."):
                raise SandboxError(f"bad trust file name {name!r}")
            fd = os.open(target / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(target / name, 0o644)

    def bwrap_argv(
        self,
        host_usr: bool,
        seccomp_fd: int,
        info_fd: int,
        shm_bytes: int,
        init: Path,
        boot_id_fd: int,
        locale_dir: Path | None = None,
    ) -> list[str]:
        """``locale_dir``: bound at /usr/lib/locale over the host's (isolation.locales)."""
        namespaces = ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
        namespaces += ["--unshare-uts", "--unshare-cgroup"]
        hardening = [
            "--disable-userns",  # nested user namespaces refused (also by seccomp)
            "--new-session",  # no controlling tty to inject into (TIOCSTI)
            "--cap-drop", "ALL",
            "--as-pid-1",  # our init reaps orphans and cannot be killed from inside
        ]  # fmt: skip
        mounts: list[tuple[str, ...]] = [("--bind", str(self.root), "/")]
        if host_usr:
            mounts.append(("--ro-bind", "/usr", "/usr"))
            if locale_dir is not None:
                mounts.append(("--ro-bind", str(locale_dir), str(locales.HOST_LOCALES)))
        mounts += [
            ("--proc", "/proc"),
            # Each start is a boot: a boot id of its own (never the host's, which would
            # tell sandboxes they share a host); a pause keeps it, a stop/start does not.
            ("--ro-bind-data", str(boot_id_fd), BOOT_ID_PATH),
            ("--dev", "/dev"),
            ("--perms", "1777", "--size", str(shm_bytes), "--tmpfs", "/dev/shm"),
            ("--bind", str(self.disk / "tmp"), "/tmp"),
            ("--bind", str(self.disk / "var-tmp"), "/var/tmp"),
            ("--bind", str(self.workspace), "/workspace"),
            ("--ro-bind", str(init), INIT_PATH),  # from the init tmpfs (isolation/initfs)
        ]
        # Volumes last: their paths lie outside everything above (volumes.spec). bwrap
        # binds nosuid,nodev, as the volume's own host mount is.
        mounts += [("--ro-bind" if b.readonly else "--bind", str(b.source), b.path)
                   for b in self.volume_binds]  # fmt: skip
        return [
            "bwrap",
            *namespaces,
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
            "--hostname", self.hostname,
            *hardening,
            *(arg for mount in mounts for arg in mount),
            "--seccomp", str(seccomp_fd),
            "--info-fd", str(info_fd),
            "--chdir", "/workspace",
            "--clearenv",
        ]  # fmt: skip

    def launch(self, launch: Launch) -> tuple[int, int]:
        """Start the sandbox's first process; return its host pid and start time.
        (``limits``: what ``cgroup`` already enforces; other tiers pass them on.)

        With ``prepare`` (a first start), the launcher is started first and waits on a
        pipe: its process starts while ``prepare`` mounts the disk and root, and it goes
        on (the cgroup joins, its view of the sandbox's directory, bubblewrap) only once
        they are there. The joins wait for what is left of the RCU grace period the
        create started beforehand (isolation/cgroupwarm.py).
        ``wire_netns(pid)`` runs as soon as the first process exists (its network
        namespace does), while bubblewrap goes on setting up its mounts: the veth is made
        meanwhile instead of after the sandbox is ready."""
        paths, cgroup, host_usr = launch.paths, launch.cgroup, launch.host_usr
        memory_bytes, lifetime_s = launch.memory_bytes, launch.lifetime_s
        init = initfs.ensure(self.home, paths.nsexec)  # a stat, once it is there
        if launch.prepare is not None and not self._dir_made:
            self.make_dir()  # for the log, before the launcher writes to it
        seccomp_fd = os.open(paths.seccomp, os.O_RDONLY)
        boot_id_fd = os.memfd_create("boot_id", os.MFD_CLOEXEC)
        os.write(boot_id_fd, f"{_random_uuid()}\n".encode())
        os.lseek(boot_id_fd, 0, os.SEEK_SET)
        info_r, info_w = os.pipe()
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe() if launch.prepare is not None else (-1, -1)
        child_fds = [seccomp_fd, info_w, ready_w, boot_id_fd] + ([go_r] if go_r >= 0 else [])
        shm = max(memory_bytes // 2, 1 << 20)
        # On the init tmpfs beside the init: the launcher's view shows it already.
        locale_dir = locales.ensure(self.home, init.parent) if host_usr else None
        argv = self.bwrap_argv(host_usr, seccomp_fd, info_w, shm, init, boot_id_fd, locale_dir)
        argv += ["--", INIT_PATH, "init", str(ready_w), str(int(lifetime_s))]
        launcher = [
            str(paths.nsexec),
            "spawn",
            *[arg for d in cgroup.dirs_for("init") for arg in ("--cgroup", d)],
            *[arg for view in self.launch_views(init) for arg in ("--view", str(view))],
            *(["--wait-fd", str(go_r)] if go_r >= 0 else []),
            "--uid",
            str(self.host_uid),
            "--gid",
            str(self.host_gid),
            "--",
            *argv,
        ]
        parent_fds = [info_r, ready_r] + ([go_w] if go_w >= 0 else [])
        try:
            try:
                with self.log.open("wb") as log:
                    # The launcher detaches (its parent half exits at once), so the
                    # sandbox outlives this process and leaves no zombie for it to reap.
                    started = subprocess.Popen(
                        launcher,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        pass_fds=child_fds,
                        start_new_session=True,
                        env={"PATH": BASE_PATH},
                    )
            finally:
                for fd in child_fds:
                    os.close(fd)
            try:
                if launch.prepare is not None:
                    launch.prepare()
                    os.write(go_w, b"g")
            finally:
                if go_w >= 0:  # unsent, the launcher exits: nothing starts half-made
                    parent_fds.remove(go_w)
                    os.close(go_w)
                try:
                    returncode = started.wait(READY_TIMEOUT_S)
                except subprocess.TimeoutExpired:  # a fork of ours may hold the go pipe
                    started.kill()
                    returncode = started.wait()
            if returncode != 0:
                raise SandboxError(f"could not launch the sandbox: {self._log_tail()}")
            info = self._read_info(info_r)
            if launch.wire_netns is not None:
                launch.wire_netns(int(info["child-pid"]))
            self._wait_ready(ready_r)
        finally:
            for fd in parent_fds:
                os.close(fd)
        pid = int(info["child-pid"])
        start = process_start_time(pid)
        if start is None:
            raise SandboxError(f"the sandbox's first process exited at once: {self._log_tail()}")
        return pid, start

    def launch_views(self, init: Path) -> tuple[Path, ...]:
        """What the launcher shows bubblewrap besides the host's system directories: this
        sandbox's directory and the init tmpfs. bubblewrap's start costs O(the mounts it
        sees) (it copies its mount namespace and parses mountinfo for each bind); in this
        view it sees a dozen, not the disk and root of every other live sandbox, so a
        create costs the same with hundreds alive as with none."""
        return (self.dir, init.parent, *(b.view for b in self.volume_binds))

    def _read_info(self, fd: int) -> dict[str, int]:
        buf = b""
        deadline = time.monotonic() + READY_TIMEOUT_S
        decoder = json.JSONDecoder()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], deadline - time.monotonic())
            if not ready:
                break
            chunk = os.read(fd, 4096)
            if not chunk:  # every writer closed: bwrap died before reporting
                break
            buf += chunk
            try:
                info, _ = decoder.raw_decode(buf.decode())
                return dict(info)
            except ValueError:
                continue
        raise SandboxError(f"bubblewrap did not start the sandbox: {self._log_tail()}")

    def _wait_ready(self, fd: int) -> None:
        ready, _, _ = select.select([fd], [], [], READY_TIMEOUT_S)
        if ready and os.read(fd, 1) == b"r":
            return
        raise SandboxError(f"the sandbox did not become ready: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace").strip()
        except FileNotFoundError:
            text = ""
        return text[-2000:] or "no output (see agentbox doctor)"

    def processes_ended(self) -> None:
        """Every process of the sandbox was killed (a stop); the disk stays for a new
        launch. Nothing to forget on this tier."""

    # teardown -------------------------------------------------------------------------
    def teardown(self) -> None:
        """Unmount and delete everything on the host side. Idempotent."""
        disk.unmount(self.root)
        disk.unmount(self.disk)  # AUTOCLEAR frees the loop device
        self.image.unlink(missing_ok=True)
        if self.dir.exists():
            _remove_tree(self.dir)


def _remove_tree(path: Path) -> None:
    """``rm -rf path``. A torn-down sandbox's directory holds a few files and two empty
    mount points: removed here with no import; anything deeper takes shutil.rmtree
    (imported then: shutil brings bz2 and lzma, a share of a one-shot script's start)."""
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        os.rmdir(entry.path)
                    else:
                        os.unlink(entry.path)
                except FileNotFoundError:
                    pass  # removed meanwhile (a concurrent destroy): what we wanted
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:  # a directory with something in it: the general case
        import shutil

        shutil.rmtree(path, onerror=_ignore_missing)


def _ignore_missing(func: object, path: str, exc_info: object) -> None:
    exc = exc_info[1] if isinstance(exc_info, tuple) else None
    if isinstance(exc, FileNotFoundError):
        return
    if isinstance(exc, BaseException):
        raise exc


def _random_uuid() -> str:
    """A random (version 4) UUID, as ``uuid.uuid4()`` formats it: that module imports
    ``platform`` and costs a one-shot SDK script a few ms for one value."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
