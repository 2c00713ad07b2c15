"""What every command group of the CLI shares: one parser for durations and sizes, and
suggestions for a mistyped subcommand."""

from __future__ import annotations

import difflib
from typing import Any

import click

from agentbox.errors import InvalidRequest
from agentbox.units import parse_duration


class Duration(click.ParamType):
    """Seconds from "8h", "30m", "90s", "1.5d" or a plain number of seconds."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        what = f"--{param.name.replace('_', '-')}" if param and param.name else "duration"
        try:
            return parse_duration(str(value), what)
        except InvalidRequest as e:
            self.fail(e.message, param, ctx)


DURATION = Duration()


class SuggestingGroup(click.Group):
    """A group that answers a mistyped subcommand with the nearest names."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            name = args[0] if args else ""
            near = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.5)
            if not near or name.startswith("-"):
                raise
            names = " or ".join(repr(n) for n in near)
            raise click.UsageError(f"{e.message.rstrip('.')}. Did you mean {names}?", ctx) from None


SuggestingGroup.group_class = type  # subgroups made with @group.group() suggest too
