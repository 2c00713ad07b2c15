"""Host resources of one sandbox on the gVisor tier (``isolation: gvisor``).

The same disk, overlay root and cgroups as the default tier (``runtime.host``), run by
``runsc`` instead of bubblewrap. Differences, each for a reason:

* The sandbox's tree is assembled on the host: /workspace, /tmp, /var/tmp (from its
  disk), /usr (the host's, read-only, for templates that use it) and the init are bound
  into ``root/`` before runsc starts. runsc's Gofer serves that one tree (submounts
  included) and the files API (``runtime.files``) works on the very same tree, so the
  two cannot disagree; runsc runs with ``--file-access=shared`` so that the Sentry
  sees what the files API wrote.
* The agent's processes run as the sandbox's *host* uid (there is no user namespace
  between the Sentry's view and the disk), so files the agent and the files API create
  have the same owner. ``/etc/passwd`` and ``/etc/group`` in the writable layer name
  that uid ``user``.
* A networked sandbox's network namespace exists before runsc starts (a bind mount at
  ``netns``), is wired by the network plane, and is the one the OCI spec names.
* runsc's state lives in ``runsc/`` beside the bundle; destroy runs ``runsc delete
  --force`` and then removes the directory with everything else.

Layout added under ``$AGENTBOX_HOME/sandboxes/ID``::

    bundle/config.json   the OCI spec (root-only: it holds the sandbox's environment)
    runsc/               runsc --root (container state)
    netns                the network namespace, pinned by a bind mount (networked only)
    exec/                one process.json per running command (root-only)
    agent/               the exec agent's socket (agent.sock), bound at /.agentbox/exec
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import time
from pathlib import Path

from agentbox.errors import SandboxError
from agentbox.isolation import disk, gvisor, initfs, syscalls
from agentbox.isolation.cgroups import GROUP_PARENT
from agentbox.isolation.launcher import static_binary
from agentbox.runtime import gvisor_agent_client as agent_client
from agentbox.runtime.host import (
    BASE_PATH,
    INIT_PATH,
    READY_TIMEOUT_S,
    Launch,
    SandboxHost,
    base_env,
    process_start_time,
)
from agentbox.storage.inroot import InRoot

MS_BIND = 0x1000
MS_REMOUNT = 0x20
AGENT_DIR = ".agentbox"
CHECKPOINT_FILE = "checkpoint.img"  # what runsc checkpoint writes in --image-path
CHECKPOINT_TIMEOUT_S = 300.0
# A deadline for a loaded host, not a measure: the agent answers in milliseconds.
QUIESCE_TIMEOUT_S = 60.0
RESTORE_TIMEOUT_S = 60.0
QUIET_NAME = "agent-quiet"  # what the agent calls itself once its listener is closed


class GvisorHost(SandboxHost):
    def __init__(self, home: Path, sandbox_id: str, slot: int) -> None:
        super().__init__(home, sandbox_id, slot)
        self.bundle = self.dir / "bundle"
        self.state_root = self.dir / "runsc"
        self.netns = self.dir / "netns"
        self.exec_dir = self.dir / "exec"
        self.log = self.dir / "runsc.log"
        self.agent_dir = self.dir / "agent"
        self.agent_socket = self.agent_dir / agent_client.SOCKET_NAME
        # runsc names its control socket after the container, host-wide: the sandbox id.
        self.container = sandbox_id
        # A memory snapshot's checkpoint image: launch restores it instead of booting.
        self.memory_image: Path | None = None

    # network --------------------------------------------------------------------------
    def make_netns(self) -> Path:
        """A fresh network namespace pinned at ``netns`` (for the network plane to wire
        before runsc starts)."""
        self.netns.touch(mode=0o600)
        # lo comes up too: with --network=host the Sentry's loopback is this one's.
        done = subprocess.run(["unshare", f"--net={self.netns}", "ip", "link", "set", "lo", "up"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise SandboxError(f"could not make the sandbox's network namespace: {done.stderr}")
        return self.netns

    # users ----------------------------------------------------------------------------
    def _read_in_root(self, name: str) -> str:
        """A file of the sandbox's tree, resolved inside it (an imported image's symlink
        cannot send the host's own /etc/shadow our way)."""
        with InRoot(self.root, symlinks=False) as root:
            data = root.read(name, 1 << 20)
        return (data or b"").decode(errors="replace")

    def _name_user(self) -> None:
        """/etc/passwd and /etc/group in the upper layer, with ``user`` at the host ids
        the agent runs as on this tier (other entries kept as the template has them)."""
        files: dict[str, bytes] = {}
        for name, line in (
            ("passwd", f"user:x:{self.host_uid}:{self.host_gid}:user:/home/user:/bin/bash"),
            ("group", f"user:x:{self.host_gid}:"),
        ):
            kept = [
                entry
                for entry in self._read_in_root(f"etc/{name}").splitlines()
                if entry.split(":", 1)[0] != "user"
            ]
            files[name] = ("\n".join([*kept, line]) + "\n").encode()
        # Through the mounted overlay (a write into its upper directory behind its back
        # may go unseen), in an /etc resolved inside the root with no symlink followed.
        etc = self._open_in_root("etc", os.O_DIRECTORY)
        try:
            for name, data in files.items():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=etc)  # never follows a link
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(name, flags, 0o644, dir_fd=etc)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
        finally:
            os.close(etc)

    # mounts ---------------------------------------------------------------------------
    def _open_in_root(self, target: str, flags: int = os.O_PATH) -> int:
        """An O_PATH fd of ``target`` in the sandbox's tree, resolved inside it with no
        symlink followed (a template's ``workspace -> /etc`` must not aim a mount at the
        host's /etc)."""
        with InRoot(self.root, symlinks=False) as root:
            try:
                return root.open(target, flags)
            except OSError as e:
                raise SandboxError(f"the sandbox's /{target} cannot be a mount point: {e}") from e

    def _bind(self, source: Path, target: str, readonly: bool, nosuid: bool = False) -> None:
        """Bind ``source`` onto ``target`` of the sandbox's tree (see _open_in_root);
        read-only ones, and ``nosuid`` ones, are also nosuid,nodev."""
        fd = self._open_in_root(target)
        try:
            syscalls.mount(str(source), f"/proc/self/fd/{fd}", "none", MS_BIND)
        except OSError as e:
            raise SandboxError(f"could not bind the sandbox's /{target}: {e}") from e
        finally:
            os.close(fd)
        if not (readonly or nosuid):
            return
        fd = self._open_in_root(target)  # now the bind's top, which a remount must name
        try:  # a bind takes its flags only on a remount
            flags = MS_BIND | MS_REMOUNT | syscalls.MS_NOSUID | syscalls.MS_NODEV
            flags |= syscalls.MS_RDONLY if readonly else 0
            syscalls.mount("none", f"/proc/self/fd/{fd}", "none", flags)
        except OSError as e:
            raise SandboxError(f"could not set the flags of the sandbox's /{target}: {e}") from e
        finally:
            os.close(fd)

    def _make_in_root(self, parent: str, name: str, directory: bool) -> None:
        """An empty file or directory (a bind's mount point) in the upper layer."""
        fd = self._open_in_root(parent, os.O_DIRECTORY)
        try:
            if directory:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            else:
                flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                os.close(os.open(name, flags, 0o644, dir_fd=fd))
        except OSError as e:
            raise SandboxError(f"could not make the sandbox's /{parent}/{name}: {e}") from e
        finally:
            os.close(fd)

    def assemble(self, init: Path, host_usr: bool, agent: Path) -> None:
        """Bind the disk's directories, the host /usr, the init, the exec agent and its
        socket's directory into ``root/``."""
        self._name_user()
        self._make_in_root(AGENT_DIR, "agent", directory=False)
        self._make_in_root(AGENT_DIR, "exec", directory=True)
        self.agent_dir.mkdir(mode=0o755, exist_ok=True)
        binds = [
            (self.workspace, "workspace", False),
            (self.disk / "tmp", "tmp", False),
            (self.disk / "var-tmp", "var/tmp", False),
            (init, INIT_PATH.lstrip("/"), True),
            (agent, gvisor.AGENT_PATH.lstrip("/"), True),
            (self.agent_dir, agent_client.IN_SANDBOX_DIR.lstrip("/"), False),
        ]
        if host_usr:
            binds.append((Path("/usr"), "usr", True))
        for source, target, readonly in binds:
            self._bind(source, target, readonly)

    def bind_volumes(self) -> None:
        """Bind each named volume's ``data/`` (``volume_binds``, see agentbox.volumes) at
        its path in ``root/``, nosuid,nodev (read-only for a reader), like the tier's other
        binds: on the host, so the Gofer serves it and the files API sees the same tree.
        A volume still bound from before a stop is left as it is."""
        for bind in self.volume_binds:
            target = bind.path.lstrip("/")
            fd = self._open_in_root(target, os.O_PATH | os.O_DIRECTORY)
            try:
                here, source = os.fstat(fd), os.stat(bind.source)
            finally:
                os.close(fd)
            if (here.st_dev, here.st_ino) == (source.st_dev, source.st_ino):
                continue
            self._bind(bind.source, target, bind.readonly, nosuid=True)

    # launch ---------------------------------------------------------------------------
    def launch(self, launch: Launch) -> tuple[int, int]:
        """Start the sandbox under runsc, inside its cgroups; return the Sentry's host pid
        and start time (the sandbox lives exactly as long as that process). Its network
        namespace is wired before runsc starts (``make_netns``): ``launch.wire_netns`` is
        None."""
        paths, cgroup, limits = launch.paths, launch.cgroup, launch.limits
        host_usr, lifetime_s = launch.host_usr, launch.lifetime_s
        runsc = gvisor.find_runsc()
        if limits is None:
            raise SandboxError("the gvisor tier needs the sandbox's limits at launch")
        init = initfs.ensure(self.home, paths.nsexec)
        built = static_binary(paths.nsexec.parent, "gvisor_agent.c", "agentbox-gvisor-agent")
        agent = initfs.ensure(self.home, built)
        assembled = self.dir / "assembled"  # a start after a stop: the binds are there
        if not assembled.exists():
            self.assemble(init, host_usr, agent)
            assembled.touch()
        self.bind_volumes()
        # The agent (the sandbox user) makes its socket here, then the directory is
        # root's: nothing in the sandbox can swap the socket for one of its own.
        self.agent_socket.unlink(missing_ok=True)
        os.chown(self.agent_dir, self.host_uid, self.host_gid)
        networked = self.netns.exists()
        # The agent (the init's job, and commands) writes its readiness byte to fd 1:
        # runsc hands the container its own stdio, so that is our pipe.
        socket_in_sandbox = f"{agent_client.IN_SANDBOX_DIR}/{agent_client.SOCKET_NAME}"
        config = gvisor.bundle_config(
            root=self.root,
            args=[gvisor.AGENT_PATH, "1", str(int(lifetime_s)), socket_in_sandbox],
            env=base_env(self.hostname),
            uid=self.host_uid,
            gid=self.host_gid,
            hostname=self.hostname,
            netns=self.netns if networked else None,
            tmp=self.disk / "tmp",
            cgroups_path=f"/{GROUP_PARENT}/{self.id}",
            memory_bytes=limits.memory_bytes,
            pids=limits.pids,
            cpus=limits.cpus,
            # What a runsc exec of this tier has (exec_process): the agent makes each
            # command's PID namespace and empties its bounding set; the command has none.
            capabilities=gvisor.AGENT_CAPABILITIES,
        )
        self.bundle.mkdir(mode=0o700, exist_ok=True)
        (self.bundle / "config.json").write_text(json.dumps(config))
        self.exec_dir.mkdir(mode=0o700, exist_ok=True)
        pid_file = self.dir / "runsc.pid"
        pid_file.unlink(missing_ok=True)
        start_argv = ["run", "--detach"]
        if self.memory_image is not None:
            self._delete()  # a checkpointed container is still named in runsc's state
            start_argv = ["restore", "--detach", f"--image-path={self.memory_image}"]
        argv = runsc.argv(self.state_root, "host" if networked else "none", *start_argv,
                          f"--bundle={self.bundle}", f"--pid-file={pid_file}",
                          self.container)  # fmt: skip
        launcher = [str(paths.nsexec), "spawn",
                    *[arg for d in cgroup.dirs_for("init") for arg in ("--cgroup", d)],
                    "--uid", "0", "--gid", "0", "--", *argv]  # fmt: skip
        ready_r, ready_w = os.pipe()
        try:
            with self.log.open("wb") as log:
                # The launcher joins the cgroups (so the Sentry, the Gofer and every
                # ptrace stub count against the sandbox's limits) and detaches.
                subprocess.run(launcher, stdin=subprocess.DEVNULL, stdout=ready_w,
                               stderr=log, start_new_session=True,
                               env={"PATH": BASE_PATH}, check=False)  # fmt: skip
            os.close(ready_w)
            ready_w = -1
            if self.memory_image is None:
                self._wait_ready(ready_r)
            else:  # the restored agent said ready long ago: its listener shows it runs
                self._wait_relistening(pid_file)
            self._close_agent_dir()
        finally:
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError) as e:
            raise SandboxError(f"runsc did not say which process is the sandbox: {e}") from e
        start = process_start_time(pid)
        if start is None:
            raise SandboxError(f"the sandbox exited at once: {self._log_tail()}")
        return pid, start

    def _wait_ready(self, fd: int) -> None:
        # runsc's client exits once the container runs; its stderr (the log) says why not.
        import select

        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], deadline - time.monotonic())
            if not ready:
                break
            chunk = os.read(fd, 1)
            if chunk == b"r":
                return
            if not chunk:
                break
        raise SandboxError(f"runsc did not start the sandbox: {self._log_tail()}")

    def _wait_relistening(self, pid_file: Path) -> None:
        """After a restore: ask the agent to listen again (SIGHUP, once runsc knows the
        container) until its socket is there (a socket, not a link: see
        ``_close_agent_dir``)."""
        deadline = time.monotonic() + RESTORE_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._agent_socket_kind() == "socket":
                return
            if pid_file.exists():
                subprocess.run(self.runsc_argv("kill", self.container, "HUP"),
                               capture_output=True, timeout=30, check=False)  # fmt: skip
            time.sleep(0.02)
        raise SandboxError(f"runsc did not restore the sandbox: {self._log_tail()}")

    # checkpoint -----------------------------------------------------------------------
    def quiesce(self) -> None:
        """Close the exec agent's listener, whose host socket gVisor cannot checkpoint
        (the checkpoint would fail and end the sandbox), and wait until it is closed: the
        agent then takes the name QUIET_NAME, which ``runsc ps`` shows for PID 1. (A
        connect to its socket cannot tell: gVisor keeps the host socket listening until
        it drops the path's cached dentry, seconds to minutes after the close.) The agent
        cannot remove the socket's file (gVisor answers EPERM on it), so the host does,
        for the listener to come back."""
        done = subprocess.run(self.runsc_argv("kill", self.container, "USR2"),
                              capture_output=True, text=True, timeout=30,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            raise SandboxError(f"could not reach the sandbox's exec agent: {done.stderr}")
        deadline = time.monotonic() + QUIESCE_TIMEOUT_S
        while self.agent_name() != QUIET_NAME:
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"the sandbox's exec agent did not close its socket in "
                    f"{QUIESCE_TIMEOUT_S:.0f} s; the sandbox runs on, try the snapshot again"
                )
            time.sleep(0.01)
        self.agent_socket.unlink(missing_ok=True)

    def agent_name(self) -> str | None:
        """PID 1's name in the sandbox (the agent's), from ``runsc ps``'s table."""
        done = subprocess.run(self.runsc_argv("ps", self.container),
                              capture_output=True, text=True, timeout=30,
                              check=False)  # fmt: skip
        for line in done.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[1] == "1":
                return fields[-1]
        return None

    def relisten(self) -> None:
        """The agent's listener back after a quiesce that was not followed by a checkpoint."""
        os.chown(self.agent_dir, self.host_uid, self.host_gid)
        try:
            self._wait_relistening(self.dir / "runsc.pid")
        finally:
            self._close_agent_dir()

    def _close_agent_dir(self) -> None:
        """The agent's directory root's again once its socket is made, and the socket
        checked: while the directory was the sandbox user's, a process running in it
        (one a restore brought back) could have swapped the socket for a link to a host
        socket, which the host's connect would follow."""
        os.chown(self.agent_dir, 0, 0)
        if self._agent_socket_kind() == "other":
            self.agent_socket.unlink()
            raise SandboxError(
                "a process in the sandbox replaced its exec agent's socket; "
                "kill the sandbox and create a new one"
            )

    def _agent_socket_kind(self) -> str:
        """What the agent's socket path holds, links not followed: "socket", "missing"
        or "other"."""
        try:
            mode = os.lstat(self.agent_socket).st_mode
        except FileNotFoundError:
            return "missing"
        return "socket" if stat.S_ISSOCK(mode) else "other"

    def checkpoint(self, image_dir: Path) -> Path:
        """``runsc checkpoint`` into ``image_dir``: the sandbox stops (``--leave-running``
        hangs with Debian 12's runsc). Returns the image file."""
        try:
            done = subprocess.run(
                self.runsc_argv("checkpoint", f"--image-path={image_dir}", self.container),
                capture_output=True, text=True, timeout=CHECKPOINT_TIMEOUT_S, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SandboxError(f"runsc checkpoint hung for {CHECKPOINT_TIMEOUT_S:.0f} s") from None
        image = image_dir / CHECKPOINT_FILE
        if done.returncode != 0 or not image.is_file():
            tail = (done.stderr or done.stdout).strip()[-400:]
            raise SandboxError(f"runsc checkpoint failed (the sandbox has ended): {tail}")
        return image

    def _exists_in_root(self, name: str, flags: int = 0) -> bool:
        # Symlinks followed, but inside the root (usr may be a link in the template).
        with InRoot(self.root) as root:
            return root.exists(name, flags)

    def is_dir_in_root(self, path: str) -> bool:
        """Whether ``path`` (absolute, in the sandbox) is a directory there."""
        return self._exists_in_root(path.lstrip("/") or ".", os.O_DIRECTORY)

    def runsc_argv(self, *more: str) -> list[str]:
        """``runsc`` with this sandbox's global flags."""
        network = "host" if self.netns.exists() else "none"
        return gvisor.find_runsc().argv(self.state_root, network, *more)

    def processes_ended(self) -> None:
        """After a stop: runsc forgets the container (its state, the cgroups it made in
        other controllers), so the next launch can run one of the same name."""
        self._delete()
        for leftover in self.exec_dir.glob("*"):
            leftover.unlink(missing_ok=True)

    def _delete(self) -> None:
        if self.state_root.exists():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(self.runsc_argv("delete", "--force", self.container),
                               capture_output=True, timeout=30, check=False)  # fmt: skip

    # teardown -------------------------------------------------------------------------
    def teardown(self) -> None:
        """runsc's own cleanup first (its state, any process left), then the netns pin,
        then what the default tier removes. Idempotent."""
        self._delete()
        disk.unmount(self.netns)
        super().teardown()
