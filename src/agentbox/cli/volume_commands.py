"""``agentbox volume``: named cache volumes (create, ls, rm)."""

from __future__ import annotations

import click

from agentbox.cli.errors import reports_errors
from agentbox.cli.output import backend as _runtime
from agentbox.cli.output import print_json
from agentbox.cli.params import SuggestingGroup


@click.group(cls=SuggestingGroup)
def volume() -> None:
    """Named volumes: filesystems that outlive sandboxes (pip, npm, cargo, apt caches),
    each of a fixed size, on a disk of their own.

    \b
    Images go to the gateway's `volumes.dir`, else $AGENTBOX_VOLUMES_DIR, else
    $AGENTBOX_HOME/volumes/images. Mount one with
    `agentbox sandbox create --volume NAME:PATH[:ro]`.
    """


@volume.command("create")
@click.argument("name")
@click.option("--size", default="10GiB", show_default=True, help="Its quota, e.g. 10GiB.")
@click.option("--json", "as_json", is_flag=True, help="Print the volume as a JSON object.")
@reports_errors()
def volume_create(name: str, size: str, as_json: bool) -> None:
    """Create an empty volume and print its name."""
    info = _runtime().volumes.create(name, size)
    print_json(info) if as_json else click.echo(info["name"])


@volume.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@reports_errors()
def volume_ls(as_json: bool) -> None:
    """List volumes with their usage and the sandboxes mounting them."""
    volumes = _runtime().volumes.list()
    if as_json:
        print_json(volumes)
        return
    if not volumes:
        click.echo("no volumes (make one with `agentbox volume create NAME --size 10GiB`)")
    for v in volumes:
        used = v.get("used_bytes")
        shown = "?" if used is None else f"{int(used) / 2**20:.1f}"
        mounts = ", ".join(f"{m['sandbox']}:{m['path']}:{m['mode']}" for m in v["mounts"])
        click.echo(f"{v['name']:<24} {shown:>9} / {int(v['size']) / 2**20:.0f} MiB  "
                   f"{mounts or '-'}")  # fmt: skip


@volume.command("rm")
@click.argument("name")
@reports_errors()
def volume_rm(name: str) -> None:
    """Destroy a volume and its data (refused while a sandbox mounts it)."""
    _runtime().volumes.remove(name)
