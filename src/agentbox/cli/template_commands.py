"""``agentbox template ...``: list, build, import and remove sandbox templates.

A thin layer over :class:`agentbox.runtime.templates.TemplateStore` in ``$AGENTBOX_HOME``.
Progress goes to stderr, results to stdout (``--json`` for machines); any agentbox error
prints ``error: <message>`` and exits 1.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import click

from agentbox.cli.errors import reports_errors
from agentbox.cli.params import SuggestingGroup
from agentbox.config.host import agentbox_home
from agentbox.runtime.template_tiers import TIERS, default_tier, set_default_tier
from agentbox.runtime.templates import DEFAULT_SUITE, Template, TemplateStore


def _store() -> TemplateStore:
    return TemplateStore(agentbox_home())


def _progress(line: str) -> None:
    click.echo(line, err=True)


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _isolation(name: str) -> str:
    return default_tier(agentbox_home(), name) or "namespaces"


def _as_dict(t: Template) -> dict[str, object]:
    return {**t.to_dict(), "isolation": _isolation(t.name)}


def _print_result(t: Template, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(_as_dict(t), indent=2))
    else:
        click.echo(f"{t.name} {t.digest}")


_ISOLATION = click.option(
    "--isolation",
    type=click.Choice(TIERS),
    help="The tier of sandboxes created from this template without an --isolation of "
    "their own (default: namespaces).",
)


@click.group("template", cls=SuggestingGroup)
def template() -> None:
    """Manage sandbox templates: the read-only root filesystems sandboxes start from.

    'default' needs nothing downloaded (it shares the host's /usr). Build Debian
    templates with mmdebstrap, or import a `docker save` / OCI image tarball.

    \b
    Examples:
      agentbox template ls
      agentbox template build py --packages python3,git
      agentbox template import node ./node.tar
      agentbox template set py --isolation gvisor
      agentbox template rm py
    """


@template.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@reports_errors()
def list_templates(as_json: bool) -> None:
    """List templates (name, digest, size, creation time).

    \b
    Example:
      agentbox template ls --json
    """
    templates = _store().list()
    if as_json:
        click.echo(json.dumps([_as_dict(t) for t in templates], indent=2))
        return
    click.echo(f"{'NAME':<20} {'DIGEST':<19} {'SIZE':>9}  CREATED")
    for t in templates:
        created = datetime.datetime.fromtimestamp(t.created_at).strftime("%Y-%m-%d %H:%M")
        note = "  (host /usr)" if t.host_usr else ""
        tier = _isolation(t.name)
        note += f"  (isolation {tier})" if tier != "namespaces" else ""
        click.echo(
            f"{t.name:<20} {t.digest[:19]:<19} {_human_size(t.size_bytes):>9}  {created}{note}"
        )


@template.command("build")
@click.argument("name")
@click.option(
    "--packages",
    default="",
    metavar="PKG,PKG",
    help="Comma-separated Debian packages to install (on top of apt and its essentials).",
)
@click.option("--suite", default=DEFAULT_SUITE, show_default=True, help="Debian suite.")
@click.option(
    "--mirror",
    default=None,
    metavar="URL",
    help="Debian mirror URL. Default: the host's own apt sources.",
)
@_ISOLATION
@click.option("--json", "as_json", is_flag=True, help="Print the template as JSON.")
@reports_errors()
def build_template(
    name: str, packages: str, suite: str, mirror: str | None, isolation: str | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Build template NAME from Debian packages with mmdebstrap (needs root).

    The same recipe (suite, packages, mirror) is built once: building it again is a
    cache hit that returns at once with the same digest. Progress goes to stderr.

    \b
    Example:
      agentbox template build py --packages python3,git --suite bookworm
    """
    pkgs = [p for p in packages.split(",") if p.strip()]
    t = _store().build(name, pkgs, suite=suite, mirror=mirror, progress=_progress)
    if isolation is not None:
        set_default_tier(agentbox_home(), name, isolation)
    _print_result(t, as_json)


@template.command("import")
@click.argument("name")
@click.argument("image", type=click.Path(path_type=Path, dir_okay=False))
@_ISOLATION
@click.option("--json", "as_json", is_flag=True, help="Print the template as JSON.")
@reports_errors()
def import_template(name: str, image: Path, isolation: str | None, as_json: bool) -> None:
    """Import template NAME from IMAGE, a `docker save` or OCI image-layout tarball.

    Layers are applied safely: entries that would land outside the template are
    skipped, device nodes dropped, setuid/setgid bits removed.

    \b
    Example:
      docker save python:3.12-slim -o py.tar
      agentbox template import py312 py.tar
    """
    t = _store().import_image(name, image, progress=_progress)
    if isolation is not None:
        set_default_tier(agentbox_home(), name, isolation)
    _print_result(t, as_json)


@template.command("set")
@click.argument("name")
@click.option(
    "--isolation",
    type=click.Choice(TIERS),
    required=True,
    help="The tier of sandboxes created from NAME without an --isolation of their own.",
)
@reports_errors()
def set_template(name: str, isolation: str) -> None:
    """Set template NAME's default isolation tier.

    \b
    Example:
      agentbox template set untrusted --isolation gvisor
      agentbox sandbox create --template untrusted      # runs on gvisor
    """
    t = _store().get(name)  # an unknown name is TemplateNotFound, with the fix
    set_default_tier(agentbox_home(), t.name, None if isolation == "namespaces" else isolation)
    click.echo(f"{name}: isolation {isolation}")


@template.command("rm")
@click.argument("name")
@reports_errors()
def remove_template(name: str) -> None:
    """Remove template NAME (its files go once no other name, sandbox or snapshot uses them).

    \b
    Example:
      agentbox template rm py
    """
    _store().remove(name)
    click.echo(f"removed {name}")
