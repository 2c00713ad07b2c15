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
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from agentbox.cli.errors import fail, say
from agentbox.errors import AgentboxError

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
) -> NoReturn:
    """Run ``argv`` in the sandbox, output streamed through; exit with its code.
    ``say`` writes one line on stderr."""
    from agentbox.client.sandbox import _runtime as backend_for

    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    out = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}

    def passthrough(stream: str, chunk: bytes) -> None:
        out[stream].write(chunk)
        out[stream].flush()

    result = (
        backend_for(None)
        .commands(sandbox_id)
        .run(
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin or None,
            timeout=timeout,
            max_output_bytes=0,
            on_output=passthrough,
        )
    )
    if result.timed_out:
        say(f"agentbox: command timed out after {timeout}s and was killed")
        sys.exit(EXEC_TIMED_OUT)
    sys.exit(result.exit_code)


def run_plain(sandbox_id: str, argv: list[str]) -> NoReturn:
    """The plain form, with what click's ``sandbox exec`` adds around ``run``: an agentbox
    error is one line ``error[code]: message`` and exit 125; a closed stdout exits 1."""

    try:
        run(sandbox_id, argv, None, None, {}, say)
    except AgentboxError as e:
        fail(e, EXEC_FAILED)
    except BrokenPipeError:  # as click does: exit 1, and no second error at shutdown's flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
