"""Background processes in a gVisor-tier sandbox: the default tier's handles and files
(``runtime.processes``: ``disk/procs/ID`` with stdout, stderr, a stdin FIFO, meta.json and
``exit``), run by ``runsc exec`` under a detached host-side waiter.

The waiter (``setsid -f sh``, host root, outside the sandbox) runs ``runsc exec``, which
waits for the command in the Sentry, and writes its status to ``exit``: nothing in the
sandbox can forge it, and it outlives the process that started it. As for one-shot
commands on this tier, the command is the init of a PID namespace of its own (see
``isolation.gvisor.exec_process``): SIGKILL (``runsc kill`` of its wrapper) ends its
whole tree; the wrapper passes other signals to the command. On a terminal, runsc exec
runs with a host pty as its stdio (the default tier's relay holds the master and records
the exit). No detection of a process waiting for input (``waiting_for_input`` stays
false).
"""

from __future__ import annotations

import json
import os
import signal as signals
import time
from pathlib import Path

from agentbox.isolation import syscalls
from agentbox.runtime.commands import LiveCommand
from agentbox.runtime.gvisor_commands import GvisorCommandRunner, unsupported
from agentbox.runtime.processes import (
    ProcessInfo,
    ProcessTable,
    _alive,
    _read_exit,
    _signal_number,
    await_recorded_end,
    run_detached,
)

# Runs runsc exec, drops its files, then writes the status like the default tier's
# launcher does: a number and a newline, atomically. $0: the exit file; $1, $2: runsc's
# process spec and pid file. `1<>` writes into the blocks reserved for the status at
# launch, without O_TRUNC freeing them: the Sentry writes the command's output as host
# root, so a flood takes even root's reserve, and a new block for the status would fail.
_WAITER = (
    'rc=0; spec=$1; pid=$2; shift 2; "$@" || rc=$?; rm -f "$spec" "$pid"; '
    'printf "%s\\n" "$rc" 1<>"$0.tmp" && mv "$0.tmp" "$0"'
)
# With stdin: the waiter holds the FIFO's write end (fd 3) while the command runs, and
# closes it on SIGUSR1 (close_stdin): the command then reads EOF once it read what was
# sent. The command runs in the background so that `wait` returns for the trap; $3: the
# FIFO. Its pid goes to exit.holder once the trap is set (a SIGUSR1 before would kill it).
_HOLDING_WAITER = (
    'rc=0; spec=$1; pid=$2; fifo=$3; shift 3; exec 3>"$fifo" 4<&0; '
    "trap 'exec 3>&-' USR1; echo $$ > \"$0.holder\"; "
    '"$@" <&4 3>&- 4<&- & child=$!; exec 4<&-; '
    'while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done; '
    'rm -f "$spec" "$pid"; printf "%s\\n" "$rc" 1<>"$0.tmp" && mv "$0.tmp" "$0"'
)
_EXIT_RESERVE = 4096  # one block for the status
_STARTED_S = 10.0


class GvisorProcessTable(ProcessTable):
    runner: GvisorCommandRunner

    def _terminal_launcher(
        self, argv: list[str], leaf: str, cwd: str | None, environment: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        # runsc exec with the host pty as its stdio: the Sentry makes it the command's
        # terminal, as for a one-shot PTY command (GvisorCommandRunner.open_pty).
        return self.runner.command_launch(argv, leaf, cwd, environment, True)

    def _discard_leaf(self, leaf: str) -> None:
        pass  # runsc's own cgroups, not a leaf of ours: nothing was made

    def _until_started(self, pdir: Path, leaf: str) -> None:
        # Until runsc has started it (its pid in the pid file, not only the file) or it has
        # ended: a signal sent before would find nothing to kill.
        deadline = time.monotonic() + _STARTED_S
        while time.monotonic() < deadline and self.runner.read_pid(leaf) is None:
            if _read_exit(pdir / "exit") is not None:
                break
            time.sleep(0.005)
        # runsc has read the process spec (it holds the environment): not kept around.
        self.runner.spec_file(leaf).unlink(missing_ok=True)

    def resize(self, process_id: str, cols: int, rows: int) -> None:
        """The size is set on the host's pty, which the Sentry reads but does not watch:
        the command's wrapper is told (SIGWINCH) and signals the foreground program."""
        super().resize(process_id, cols, rows)
        self.signal(process_id, "SIGWINCH")

    def _stdin_holder(self, pdir: Path, meta: dict[str, object]) -> int | None:
        """The waiter holding the FIFO's write end (``_HOLDING_WAITER``): root's, and
        started for this process's exit file."""
        try:
            pid = int((pdir / "exit.holder").read_text())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            owner = os.stat(f"/proc/{pid}").st_uid
        except (OSError, ValueError):
            return None
        return pid if owner == 0 and os.fsencode(pdir / "exit") in argv else None

    def _launch(
        self, pdir: Path, argv: list[str], environment: dict[str, str], leaf: str,
        cwd: str | None, stdin: bool,
    ) -> float:  # fmt: skip
        pdir.mkdir(mode=0o700)
        started = time.time()
        meta = {"argv": argv, "started_at": started, "leaf": leaf, "cwd": cwd}
        if stdin:
            meta["stdin"] = "held"  # the waiter holds the write end: close_stdin works
        (pdir / "meta.json").write_text(json.dumps(meta))
        launcher, host_env = self.runner.command_launch(argv, leaf, cwd, environment, False)
        _reserve_exit_file(pdir / "exit.tmp")
        files = [str(self.runner.spec_file(leaf)), self.runner.pid_file(leaf)]
        exit_file = str(pdir / "exit")
        if stdin:
            fifo = pdir / "stdin"
            os.mkfifo(fifo, 0o600)
            # The read end (non-blocking open: no writer yet), blocking for the command;
            # the waiter opens the write end and holds it until close_stdin.
            stdin_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.set_blocking(stdin_fd, True)
            script, files = _HOLDING_WAITER, [*files, str(fifo)]
        else:
            stdin_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            script = _WAITER
        waiter = ["setsid", "-f", "sh", "-c", script, exit_file, *files, *launcher]
        run_detached(waiter, host_env, pdir, stdin_fd, "the waiter failed to start")
        return started

    def get(self, process_id: str) -> ProcessInfo:
        pdir = self._dir(process_id)
        meta = json.loads((pdir / "meta.json").read_text())
        code = _read_exit(pdir / "exit")
        terminal = bool(meta.get("terminal"))
        # A terminal's exit is recorded by the relay of the daemon that started it: with
        # that daemon gone, the terminal closed (the session got SIGHUP) and no exit comes.
        running = code is None and (not terminal or _alive(meta.get("relay_pid")))
        return ProcessInfo(
            process_id, meta["argv"], meta["started_at"], running, code, terminal=terminal
        )

    def adopt(self, live: LiveCommand) -> str:
        raise unsupported("adopting a command waiting for input")

    def signal(self, process_id: str, sig: int | str = "SIGTERM") -> bool:
        """SIGKILL ends the command's whole tree; another signal goes to the command
        through its wrapper (``gvisor_agent.c``, ``exec``), whose pid runsc wrote before
        ``start`` returned: a signal sent at once finds it (or ends it before the command
        runs, with that signal's status)."""
        pdir = self._dir(process_id)
        signum = _signal_number(sig)
        meta = json.loads((pdir / "meta.json").read_text())
        if _read_exit(pdir / "exit") is not None:
            return False
        leaf = str(meta["leaf"])
        if signum == signals.SIGKILL:
            self.runner.kill_tree(leaf)
            await_recorded_end(pdir, meta)
            return True
        wrapper = self.runner.read_pid(leaf)
        if wrapper is None:
            return False
        return self.runner.signal_pid(wrapper, signals.Signals(signum).name)


def _reserve_exit_file(path: Path) -> None:
    """An empty status file whose block is already the file's (see ``_WAITER``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        syscalls.reserve_blocks(fd, _EXIT_RESERVE)
    finally:
        os.close(fd)
