"""What the commands share below ``cli.main`` (which loads them lazily; importing it back
made an import circle): the backend a command talks to, and how results are printed."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # the backend loads when a command needs one: `--help` never does
    from agentbox.client.interfaces import Backend

T = TypeVar("T")


def backend(*, discover: bool = True) -> Backend:
    """The gateway AGENTBOX_URL names, else the home's gateway when one serves its socket
    (``discover``), else the runtime in-process (as root): ``agentbox.endpoint``."""
    from agentbox.client.sandbox import _runtime as backend_for

    return backend_for(None, discover=discover)


def print_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def print_listing(
    items: Sequence[T],
    as_json: bool,
    line: Callable[[T], str],
    *,
    to_json: Callable[[T], Any] = lambda item: item,
    empty: str = "",
    header: str = "",
) -> None:
    """A list as a JSON array (``--json``), or a line per item under ``header``; none:
    ``empty`` on stderr (a note for a person, not data)."""
    if as_json:
        print_json([to_json(item) for item in items])
        return
    if not items:
        if empty:
            click.echo(empty, err=True)
        return
    if header:
        click.echo(header)
    for item in items:
        click.echo(line(item))
