"""``agentbox sandbox exec``: its work, importable without click.

The console script (``agentbox.cli.entry``) runs the plain form, ``agentbox sandbox exec
ID -- ARGV...`` with no option, straight from ``sys.argv``: importing click and building
the command tree is a third of such a call's start-up, the call itself a few
milliseconds. Any other form (an option, ``--help``, no ``--``) goes through click, whose
``sandbox exec`` runs the same ``run`` below.
"""

from __future__ import annotations

import os
import sys

from agentbox.cli.script import ensure_site

TYPE_CHECKING = False  # typing, re and the error tree: a tenth of a plain exec's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import NoReturn

EXEC_FAILED = 125
EXEC_TIMED_OUT = 124


def plain_form(args: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(ID, ARGV)`` if ``args`` (sys.argv without the program) is ``sandbox exec ID --
    ARGV...`` exactly, else None (click parses it)."""
    if len(args) < 5 or list(args[:2]) != ["sandbox", "exec"] or args[3] != "--":
        return None
    if args[2].startswith("-"):
        return None  # an option where the id goes: click's message says what is wrong
    return args[2], list(args[4:])


def run(
    sandbox_id: str,
    argv: list[str],
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str],
    say: Callable[[str], None],
    stdin: bytes | None = None,
) -> NoReturn:
    """Run ``argv`` in the sandbox, output streamed through; exit with its code.
    ``say`` writes one line on stderr."""
    from agentbox.client.sandbox import _runtime as backend_for
    from agentbox.runtime.requests import RunRequest

    if stdin is None:
        stdin = _stdin()
    out = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}

    def passthrough(stream: str, chunk: bytes) -> None:
        out[stream].write(chunk)
        out[stream].flush()

    result = (
        backend_for(None)
        .commands(sandbox_id)
        .run(
            RunRequest(
                argv, cwd=cwd, env=env, stdin=stdin or None, timeout=timeout, max_output_bytes=0
            ),
            on_output=passthrough,
        )
    )
    if result.timed_out:
        say(f"agentbox: command timed out after {timeout}s and was killed")
        sys.exit(EXEC_TIMED_OUT)
    sys.exit(result.exit_code)


def run_plain(sandbox_id: str, argv: list[str]) -> NoReturn:
    """The plain form, with what click's ``sandbox exec`` adds around ``run``: an agentbox
    error is one line ``error[code]: message`` and exit 125; a closed stdout exits 1.
    A running sandbox of the default tier takes the light path (``runtime.quick_exec``);
    any other goes through the runtime."""
    try:
        stdin = _stdin()
        _run_quick(sandbox_id, argv, stdin)
        ensure_site()  # the full path imports third-party packages
        run(sandbox_id, argv, None, None, {}, _say, stdin)
    except BrokenPipeError:  # as click does: exit 1, and no second error at shutdown's flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as e:
        # Imported only on the error path: the error tree brings typing and dataclasses.
        ensure_site()
        from agentbox.cli.errors import fail
        from agentbox.errors import AgentboxError

        if not isinstance(e, AgentboxError):
            raise
        fail(e, EXEC_FAILED)


def _run_quick(sandbox_id: str, argv: list[str], stdin: bytes | None) -> None:
    """Run through ``runtime.quick_exec`` and exit with the command's code, or return when
    the sandbox needs the full path (nothing has started then)."""
    from agentbox.runtime import quick_exec

    prepared = quick_exec.prepare(sandbox_id, argv, "c" + os.urandom(6).hex())
    if prepared is None:
        return
    streams = {1: sys.stdout.buffer, 2: sys.stderr.buffer}

    def write(fd: int, chunk: bytes) -> None:
        streams[fd].write(chunk)
        streams[fd].flush()

    try:
        status, stderr_head = quick_exec.run(prepared, stdin, write)
    except BrokenPipeError:
        raise
    except OSError as e:  # could not start it (e.g. E2BIG): as the full path says it
        ensure_site()
        from agentbox.runtime.commands import launch_error

        raise launch_error(e) from None
    if status == 125:  # the launcher's own failure, said the way the full path says it
        ensure_site()
        from agentbox.runtime.commands import launch_failure

        failure = launch_failure(status, stderr_head)
        if failure is not None:
            raise failure
    sys.exit(128 - status if status < 0 else status)


def _stdin() -> bytes | None:
    """Piped input, read whole (a terminal is not read: the command gets /dev/null)."""
    if sys.stdin is None or sys.stdin.isatty():
        return None
    return sys.stdin.buffer.read() or None


def _say(line: str) -> None:
    """One line on stderr, without colour codes unless stderr is a terminal (as click.echo)."""
    if not sys.stderr.isatty():
        import re

        line = re.sub(r"\033\[[;?0-9]*[a-zA-Z]", "", line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
