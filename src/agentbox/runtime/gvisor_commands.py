"""Commands in a live gVisor-tier sandbox, with the default tier's contract for one-shot
commands (runtime.commands: capped output, stdin, timeouts, cancellation).

A one-shot command without a PTY goes to the sandbox's exec agent (its first process,
``isolation/gvisor_agent.c``; the host side: ``runtime.gvisor_agent_client``): one round
trip on a unix socket instead of a new ``runsc exec`` (a Go process, ~60 ms). Its
status is then the agent's word, which code in the sandbox could forge for its own
commands (as it can forge their output); the host checks every reply's framing. A PTY
command, a large stdin, background processes, and a sandbox whose agent does not answer
take the ``runsc exec`` path below, whose status is runsc's own.

Every command is one ``runsc exec`` whose process runs under the exec agent's wrapper
(``agent exec``, see ``isolation.gvisor.exec_process``): killing that process inside the
Sentry (``runsc kill --pid``) ends the command's PID namespace, so a timeout kills the
whole tree, ``setsid`` daemons included, while other commands run on. The exit status
is ``runsc exec``'s own (it waits for the process in the Sentry), read with waitpid on
the host: nothing the command prints can forge it.

A PTY is a host pty pair whose slave is runsc exec's stdio (see ``open_pty``). A
command that reads stdin without a PTY gets what ``stdin`` holds, then end-of-file (no
detection of a command waiting for input, which needs the default tier's cgroup view).
Background processes: ``runtime.gvisor_processes``; shell sessions work unchanged (each
call is one command).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentbox.errors import InvalidRequest, TierUnsupported
from agentbox.fsutil import required_text, stdin_bytes
from agentbox.isolation import gvisor
from agentbox.isolation.cgroups import SandboxCgroup
from agentbox.runtime import gvisor_agent_client as agent
from agentbox.runtime.commands import (
    FOREGROUND_LEAF,
    WORKSPACE,
    Cancellation,
    CommandRunner,
    normalise_argv,
)
from agentbox.runtime.gvisor_host import GvisorHost
from agentbox.runtime.host import BASE_PATH, LaunchPaths
from agentbox.runtime.output import BoundedCapture, CommandResult, OutputCallback, OutputSaver
from agentbox.runtime.requests import RunRequest, coerce

_PID_WAIT_S = 5.0  # runsc writes a command's pid file as it starts it
# The browser's first process in the sandbox (browser.launch): the DevTools pipe from
# stdio back onto fds 3 and 4, where --remote-debugging-pipe expects it.
PIPE_RELAY = 'exec 3<&0 4>&1 </dev/null >&2; exec "$@"'


def unsupported(feature: str) -> TierUnsupported:
    return TierUnsupported(
        f"{feature} is not available on the gvisor isolation tier yet; run a one-shot "
        "command instead, or create the sandbox with isolation namespaces",
        tier=gvisor.TIER,
        feature=feature,
    )


class GvisorCommandRunner(CommandRunner):
    host: GvisorHost
    uses_resident = False  # its exec agent is this tier's resident launcher

    def __init__(
        self,
        paths: LaunchPaths,
        host: GvisorHost,
        cgroup: SandboxCgroup,
        init_pid: int,
        sandbox_env: Mapping[str, str],
    ) -> None:
        super().__init__(paths, host, cgroup, init_pid, sandbox_env)

    def run(self, request: RunRequest | str | Sequence[str], **hooks: Any) -> CommandResult:
        request = coerce(RunRequest, request, hooks)
        # No input detection: its stdin is /dev/null unless stdin is given (see above).
        hooks["detect_input"] = False
        hooks["adopt"] = None
        stdin = request.stdin
        small = stdin is None or len(stdin_bytes(stdin)) <= agent.MAX_STDIN
        if not request.pty and small and self.host.agent_socket.exists():
            try:
                return self._run_by_agent(request, **hooks)
            except agent.AgentUnavailable:
                pass  # e.g. a sandbox restored from a checkpoint: runsc exec still works
        return super().run(request, **hooks)

    def _run_by_agent(
        self,
        request: RunRequest,
        *,
        on_output: OutputCallback | None = None,
        save: OutputSaver | None = None,
        save_max_bytes: int = 0,
        cancel: Cancellation | None = None,
        **_: object,
    ) -> CommandResult:
        """One round trip to the sandbox's exec agent (runtime.gvisor_agent_client)."""
        argv = normalise_argv(request.command)
        timeout, max_output_bytes, stdin = request.timeout, request.max_output_bytes, request.stdin
        env, cwd = request.env, request.cwd
        payload = agent.request(argv, self.environment(env), self._cwd(cwd),
                                None if stdin is None else stdin_bytes(stdin))  # fmt: skip
        call = agent.AgentCall(agent.connect(self.host.agent_socket))
        keep = save_max_bytes if save is not None else 0
        out = BoundedCapture(max_output_bytes, "stdout", on_output, keep)
        err = BoundedCapture(max_output_bytes, "stderr", on_output, keep)
        # The marker the idle watcher looks for while a foreground command runs.
        marker = self.spec_file(self.new_leaf())
        started = time.monotonic()
        try:
            marker.touch(mode=0o600)
            if cancel is not None:
                cancel.bind(call.kill)
            status, outcome = call.run(payload, timeout, out, err)
            elapsed = time.monotonic() - started
            return self._result(out, err, status, outcome == agent.TIMED_OUT, elapsed, save)
        finally:
            if cancel is not None:
                cancel.bind(None)
            call.sock.close()
            marker.unlink(missing_ok=True)
            out.close()
            err.close()

    def _cwd(self, cwd: str | None) -> str:
        """The command's absolute cwd, which must be a directory in the sandbox."""
        if cwd is not None:
            required_text(cwd, "cwd", f"pass a directory, e.g. {WORKSPACE}")
        where = posixpath.normpath(posixpath.join(WORKSPACE, cwd or WORKSPACE))
        if not self.host.is_dir_in_root(where):
            raise InvalidRequest(
                f"cwd {where} is not a directory in the sandbox; pass a cwd that exists "
                "in the sandbox (e.g. /workspace)"
            )
        return where

    def new_leaf(self, kind: str = "c") -> str:
        return kind + os.urandom(6).hex()  # names the command's files; no cgroup leaf

    def command_launch(
        self, argv: list[str], leaf: str, cwd: str | None, env: dict[str, str], pty: bool
    ) -> tuple[list[str], dict[str, str]]:
        where = self._cwd(cwd)
        process = gvisor.exec_process(
            args=argv, env=env, cwd=where, uid=self.host.host_uid, gid=self.host.host_gid,
            terminal=pty,
        )  # fmt: skip
        spec = self.spec_file(leaf)
        # Root-only: the environment may hold what the caller did not want in ps output.
        fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(process, f)
        launcher = self.host.runsc_argv(
            "exec",
            f"--process={spec}",
            f"--internal-pid-file={self.pid_file(leaf)}",
            self.host.container,
        )
        return launcher, {"PATH": BASE_PATH}

    def launcher_argv(self, argv: list[str], leaf: str, cwd: str | None, **_: object) -> list[str]:
        """The default tier's launcher would join the Sentry's *host* namespaces: outside
        gVisor. Whatever asks for it here is refused (the browser uses browser_launch)."""
        raise unsupported("a host-side launch into the sandbox (agentbox-nsexec enter)")

    def browser_launch(
        self, chromium: str, leaf: str, cwd: str, env: dict[str, str]
    ) -> dict[str, Any]:
        """A ``runsc exec`` whose stdio carries the DevTools pipe (``browser.launch``
        writes the process file, with Chromium's arguments, and moves the pipe); killed
        like any command (``kill_tree``: its PID namespace)."""
        process = gvisor.exec_process(
            args=["/bin/sh", "-c", PIPE_RELAY, "sh"], env=env, cwd=self._cwd(cwd),
            uid=self.host.host_uid, gid=self.host.host_gid,
        )  # fmt: skip
        runsc = self.host.runsc_argv(
            "exec",
            f"--process={self.spec_file(leaf)}",
            f"--internal-pid-file={self.pid_file(leaf)}",
            self.host.container,
        )
        return {
            "runsc_argv": runsc,
            "process": process,
            "process_file": str(self.spec_file(leaf)),
            "env": {"PATH": BASE_PATH},
            "own_sandbox": True,
        }

    def pid_file(self, leaf: str) -> str:
        """Where runsc writes the command's pid inside the Sentry (its wrapper)."""
        return str(self.host.exec_dir / f"{leaf}.pid")

    def spec_file(self, leaf: str) -> Path:
        return self.host.exec_dir / f"{leaf}.json"

    def read_pid(self, leaf: str) -> int | None:
        """The command's Sentry pid from its pid file; None until runsc has written it
        (the file exists, empty, a moment before it holds the pid)."""
        try:
            return int(Path(self.pid_file(leaf)).read_text().strip())
        except (OSError, ValueError):
            return None

    def signal_pid(self, pid: int, signal: str) -> bool:
        """Deliver ``signal`` (a name) to Sentry pid ``pid``; whether runsc did."""
        done = subprocess.run(
            self.host.runsc_argv("kill", f"--pid={pid}", self.host.container, signal),
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        return done.returncode == 0

    def kill_tree(self, leaf: str) -> None:
        """Kill the command's wrapper inside the Sentry: its PID namespace dies."""
        deadline = time.monotonic() + _PID_WAIT_S
        pid = self.read_pid(leaf)
        while pid is None and time.monotonic() < deadline:
            time.sleep(0.01)  # runsc is starting it: a few ms
            pid = self.read_pid(leaf)
        if pid is None:
            return  # never started: nothing to kill
        self.signal_pid(pid, "KILL")

    def kill_foreground(self) -> None:
        agent.kill_all(self.host.agent_socket)
        for pid_file in self.host.exec_dir.glob(f"{FOREGROUND_LEAF}*.pid"):
            self.kill_tree(pid_file.stem)

    def _finish_leaf(self, leaf: str, kill: bool) -> None:
        if kill:
            self.kill_tree(leaf)
        for suffix in (".json", ".pid"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.host.exec_dir / f"{leaf}{suffix}")

    def open_pty(self) -> tuple[int, int]:
        """A pty pair of the host's: runsc exec, given the slave as its stdio with
        ``terminal`` set, has the Sentry wrap it as the command's controlling terminal
        (the agent's ioctls reach gVisor's tty, which passes few on); the master is
        ours alone."""
        return os.openpty()
