"""The CLI's one error style: ``error[code]: message`` on stderr, the hint spelled as a
command to run (``hints.render(e, "cli")``), then a non-zero exit status.

Every command reports an ``AgentboxError`` through ``reports_errors`` (a decorator) or
``fail``; nothing else prints errors. Importable without click: the plain ``sandbox exec``
form (``cli.execute``) uses it too.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from typing import NoReturn, ParamSpec, TypeVar

from agentbox.errors import AgentboxError

P = ParamSpec("P")
R = TypeVar("R")
_ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")  # what click.echo strips when not a terminal


def error_line(e: AgentboxError) -> str:
    from agentbox import hints  # only on the error path: the plain exec stays light

    return f"error[{e.code}]: {hints.render(e, 'cli')}"


def say(line: str) -> None:
    """``line`` on stderr, as click.echo(err=True) writes it (no colour unless a terminal)."""
    text = line if sys.stderr.isatty() else _ANSI.sub("", line)
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def fail(e: AgentboxError, exit_code: int = 1) -> NoReturn:
    """Report ``e`` in the one style and exit with ``exit_code``."""
    say(error_line(e))
    sys.exit(exit_code)


def reports_errors(exit_code: int = 1) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A command whose AgentboxError is reported by ``fail`` (exit ``exit_code``)."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return func(*args, **kwargs)
            except AgentboxError as e:
                fail(e, exit_code)

        wrapper.reports_errors = exit_code  # type: ignore[attr-defined]  # tests find it
        return wrapper

    return decorate
