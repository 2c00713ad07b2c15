"""What every command group of the CLI shares: one parser for durations and sizes,
suggestions for a mistyped subcommand, and subcommands imported only when they run."""

from __future__ import annotations

import difflib
import importlib
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


class LazyGroup(SuggestingGroup):
    """A group whose ``lazy`` subcommands are imported only when one runs: the modules of
    ``serve``, ``audit``, ``template``... import the gateway, pydantic or the template
    builder, which ``agentbox sandbox exec`` and ``agentbox --help`` must not pay for.
    ``--help`` lists them with the short help written here (tests/unit/test_cli_lazy.py
    checks it against each command's own)."""

    def __init__(
        self, *args: Any, lazy: dict[str, tuple[str, str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}  # name -> (module, attribute, short help)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, attribute, _ = self.lazy[cmd_name]
        command: click.Command = getattr(importlib.import_module(module), attribute)
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            if name in self.lazy and name not in self.commands:
                rows.append((name, click.utils.make_default_short_help(self.lazy[name][2], limit)))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)
