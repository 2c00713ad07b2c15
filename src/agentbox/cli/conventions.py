"""What every command module follows: JSON output, one error line on stderr, the backend.
Apart from ``cli/main.py``, which loads the command modules by name when one runs: they
import this, never main."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import click

from agentbox import hints
from agentbox.errors import AgentboxError

if TYPE_CHECKING:  # the backend loads when a command needs one: `--help` never does
    from agentbox.client.interfaces import Backend

F = TypeVar("F", bound=Callable[..., Any])


def _print_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def handle_errors(exit_code: int = 1) -> Callable[[F], F]:
    """Turn AgentboxError into one readable line on stderr and a non-zero exit."""

    def decorate(func: F) -> F:
        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except AgentboxError as e:
                click.echo(f"error[{e.code}]: {hints.render(e, 'cli')}", err=True)
                sys.exit(exit_code)

        return wrapper  # type: ignore[return-value]

    return decorate


def _runtime() -> Backend:
    """Through a gateway when AGENTBOX_URL is set, else in-process (as root)."""
    from agentbox.client.sandbox import _runtime as backend_for

    return backend_for(None)
