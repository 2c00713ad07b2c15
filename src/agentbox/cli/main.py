"""The ``agentbox`` command line. Thin: every command calls the SDK / runtime.

Exit codes: 0 success; 1 an agentbox error (message on stderr, ``error[code]: ...``);
``sandbox exec`` exits with the command's own exit code, or 125 when agentbox itself
failed (like ``docker run``), 124 when the command timed out.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING, Any

import click

from agentbox.cli import execute
from agentbox.cli.errors import reports_errors
from agentbox.cli.output import backend as _runtime
from agentbox.cli.output import print_json as _print_json
from agentbox.cli.output import print_listing
from agentbox.cli.params import DURATION, LazyGroup
from agentbox.errors import InvalidRequest
from agentbox.network.modes import EGRESS_MODES
from agentbox.units import human_size

if TYPE_CHECKING:  # the backend loads when a command needs one: `--help` never does
    from agentbox.runtime.store import SandboxRecord

EXEC_FAILED = execute.EXEC_FAILED


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--env")
        env[key] = value
    return env


# The command groups in other modules, imported when one runs; their short help is here
# so that `agentbox --help` imports none of them (tests/unit/test_cli_lazy.py).
_LAZY = {
    "approvals": ("agentbox.cli.gateway_commands", "approvals",
                  "Decide commands and egress names waiting for approval (operator token)."),
    "audit": ("agentbox.cli.audit_commands", "audit",
              "Check and read the gateway's tamper-evident audit trail."),
    "cluster": ("agentbox.cli.cluster_commands", "cluster",
                "Cluster mode: the certificate authority, node and gateway certificates, nodes."),
    "db": ("agentbox.cli.db_commands", "db",
           "The shared state database: schema migrations for PostgreSQL."),
    "mcp": ("agentbox.cli.gateway_commands", "mcp_stdio",
            "Serve MCP over stdio, for clients that spawn their servers (runs as root)."),
    "node": ("agentbox.cli.cluster_commands", "node",
             "Run a cluster node: sandboxes on this host, the node API (mutual TLS), heartbeats."),
    "serve": ("agentbox.cli.gateway_commands", "serve",
              "Run the gateway: REST API, MCP at /mcp, health checks."),
    "snapshot": ("agentbox.cli.snapshot_commands", "snapshot",
                 "Snapshots: a sandbox's writable layer and /workspace, scanned for secrets "
                 "and kept (zstd, content-addressed) in the snapshot store."),
    "task": ("agentbox.cli.task_commands", "task",
             "Batch tasks: a goal, run by the reference agent loop in a fresh sandbox."),
    "template": ("agentbox.cli.template_commands", "template",
                 "Manage sandbox templates: the read-only root filesystems sandboxes start from."),
    "volume": ("agentbox.cli.volume_commands", "volume",
               "Named volumes: filesystems that outlive sandboxes (pip, npm, cargo, apt "
               "caches), each of a fixed size, on a disk of their own."),
    "token": ("agentbox.cli.gateway_commands", "token",
              "Issue, list and revoke session tokens (talks to the gateway)."),
}  # fmt: skip


@click.group(cls=LazyGroup, lazy=_LAZY, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agentbox")
def cli() -> None:
    """agentbox: disposable, least-privileged Linux sandboxes for AI coding agents.

    \b
    Quick start (as root):
      ID=$(agentbox sandbox create --memory 512MiB)
      agentbox sandbox exec $ID -- python3 -c 'print(6*7)'
      echo hello | agentbox files write $ID /workspace/hi.txt
      agentbox sandbox rm $ID

    State lives in $AGENTBOX_HOME (default /var/lib/agentbox). Run `agentbox doctor`
    first on a new host.
    """


# sandbox ----------------------------------------------------------------------------------
@cli.group()
def sandbox() -> None:
    """Create, inspect, run commands in and destroy sandboxes."""


@sandbox.command("create")
@click.option(
    "--template", "-t", default="default", show_default=True, help="Root filesystem template."
)
@click.option("--memory", help="Memory limit, e.g. 512MiB (default 2GiB).")
@click.option("--pids", type=int, help="Max processes (default 512).")
@click.option("--cpus", type=float, help="CPU quota in cores (default 2).")
@click.option("--disk", help="Disk for the writable layer + /workspace, e.g. 5GiB (default 10GiB).")
@click.option("--lifetime", help="Max lifetime, e.g. 30m or 3600 (seconds); default 24h.")
@click.option(
    "--idle-timeout",
    help="Unused this long (no calls, no running command, CPU under 5%), on-idle applies; "
    "e.g. 15m (the default), 0 = never. Enforced while a gateway runs.",
)
@click.option("--on-idle", type=click.Choice(["pause", "stop", "destroy"]), help="Default: pause.")
@click.option(
    "--env", "env", multiple=True, metavar="KEY=VALUE", help="Environment for every command."
)
@click.option("--project", help="Project the sandbox belongs to (default: default).")
@click.option(
    "--network",
    type=click.Choice(EGRESS_MODES),
    help="Egress: loopback only, the --allow names (default), any public address, or the "
    "--allow names and others once a person approves (agentbox approvals). "
    "Internal ranges and the metadata address are unreachable in every mode.",
)
@click.option(
    "--allow", multiple=True, metavar="DOMAIN", help="A name the sandbox may reach "
    "(repeat; *.example.com = any name below example.com). Implies --network allowlist.",
)  # fmt: skip
@click.option(
    "--isolation",
    type=click.Choice(["namespaces", "gvisor"]),
    help="Isolation tier: namespaces (bubblewrap + seccomp, the default) or gvisor (runsc: "
    "a user-space kernel; see agentbox doctor for what this host can run).",
)
@click.option(
    "--volume", "volumes", multiple=True, metavar="NAME:PATH[:ro]",
    help="Mount a named volume (agentbox volume create) at PATH; :ro read-only (many "
    "sandboxes), else read-write (one sandbox at a time). Repeat for more.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the bare id.")
@reports_errors()
def sandbox_create(
    template: str,
    memory: str | None,
    pids: int | None,
    cpus: float | None,
    disk: str | None,
    lifetime: str | None,
    idle_timeout: str | None,
    on_idle: str | None,
    env: tuple[str, ...],
    project: str | None,
    network: str | None,
    allow: tuple[str, ...],
    isolation: str | None,
    volumes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Create a sandbox and print its id.

    \b
    Examples:
      agentbox sandbox create --memory 1GiB --disk 5GiB --lifetime 2h
      agentbox sandbox create --allow pypi.org --allow files.pythonhosted.org
      agentbox sandbox create --network none
      agentbox sandbox create --isolation gvisor
      agentbox sandbox create --volume pip-cache:/home/user/.cache/pip
    """
    from agentbox.client.sandbox import _volumes, spec_of

    spec = spec_of(
        template,
        memory=memory,
        pids=pids,
        cpus=cpus,
        disk=disk,
        lifetime=lifetime,
        idle_timeout=idle_timeout,
        on_idle=on_idle,
        project=project,
        isolation=isolation,
    )
    if env:
        spec["env"] = _parse_env(env)
    if network or allow:
        spec["network"] = {"mode": network or "allowlist", "allow": list(allow)}
    if volumes:
        spec["volumes"] = _volumes(volumes)
    record = _runtime().create(spec)
    if as_json:
        _print_json(record.to_dict())
    else:
        click.echo(record.id)


@sandbox.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@reports_errors()
def sandbox_ls(as_json: bool) -> None:
    """List sandboxes on this host."""

    def line(r: SandboxRecord) -> str:
        shown = human_size(r.spec.memory)
        return f"{r.id:<18} {r.state:<10} {r.template:<14} {r.isolation:<10} {shown:>10}"

    print_listing(
        _runtime().list(), as_json, line, to_json=lambda r: r.to_dict(),
        empty="no sandboxes (create one: agentbox sandbox create)",
        header=f"{'ID':<18} {'STATE':<10} {'TEMPLATE':<14} {'ISOLATION':<10} {'MEMORY':>10}",
    )  # fmt: skip


@sandbox.command("get")
@click.argument("sandbox_id")
@reports_errors()
def sandbox_get(sandbox_id: str) -> None:
    """Show one sandbox as JSON."""
    _print_json(_runtime().get(sandbox_id).to_dict())


@sandbox.command("rm")
@click.argument("sandbox_ids", nargs=-1, required=True)
@reports_errors()
def sandbox_rm(sandbox_ids: tuple[str, ...]) -> None:
    """Destroy sandboxes: kill every process, remove every host resource."""
    runtime = _runtime()
    for sandbox_id in sandbox_ids:
        runtime.destroy(sandbox_id)
        click.echo(sandbox_id)


def _state_command(name: str, help_text: str) -> None:
    """``sandbox NAME ID``: the runtime's ``NAME`` (pause, resume), then the new state."""

    @sandbox.command(name, help=help_text)
    @click.argument("sandbox_id")
    @click.option("--json", "as_json", is_flag=True, help="Print the sandbox as a JSON object.")
    @reports_errors()
    def command(sandbox_id: str, as_json: bool) -> None:
        record = getattr(_runtime(), name)(sandbox_id)
        _print_json(record.to_dict()) if as_json else click.echo(f"{sandbox_id} {record.state}")


_state_command(
    "pause",
    "Freeze every process of a sandbox (CPU drops to zero; memory and files stay).\n\n"
    "Any later command, file or tool call on it resumes it first.",
)
_state_command(
    "resume",
    "Continue a paused sandbox exactly where it stopped, or start a stopped one again "
    "(its files are kept; its processes started fresh).",
)


@sandbox.command("fork")
@click.argument("sandbox_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the bare id.")
@reports_errors()
def sandbox_fork(sandbox_id: str, as_json: bool) -> None:
    """Copy a sandbox: a new one with its files at this instant, and print the new id.

    The copy is copy-on-write (fast whatever the size); processes are not copied.
    """
    record = _runtime().fork(sandbox_id)
    _print_json(record.to_dict()) if as_json else click.echo(record.id)


@sandbox.command("stop")
@click.argument("sandbox_id")
@reports_errors()
def sandbox_stop(sandbox_id: str) -> None:
    """End every process of a sandbox but keep its disk; `resume` starts it again."""
    _runtime().stop(sandbox_id)
    click.echo(f"{sandbox_id} stopped")


@sandbox.command("desktop")
@click.argument("sandbox_id")
@click.option("--vnc", is_flag=True, required=True, help="Forward a local VNC port to it.")
@click.option("--port", type=int, default=5900, show_default=True, help="Local port (0: any).")
@click.option("--control", is_flag=True, help="Take control (keys, pointer); else view only.")
@reports_errors()
def sandbox_desktop(sandbox_id: str, vnc: bool, port: int, control: bool) -> None:
    """Watch a sandbox's desktop with any VNC client: 127.0.0.1:PORT here is forwarded
    through the gateway ($AGENTBOX_URL, token in $AGENTBOX_TOKEN) until Ctrl-C. View only
    unless --control and the token has desktop_control; the gateway audits both."""
    import asyncio
    import contextlib
    import os

    from agentbox import endpoint
    from agentbox.client import vnc_forward

    url = endpoint.named_url() or "http://127.0.0.1:8848"
    token = os.environ.get("AGENTBOX_TOKEN")
    if not token:
        raise InvalidRequest("set AGENTBOX_TOKEN to the operator's or a viewer's token")

    def ready(bound: int) -> None:
        mode = "control" if control else "view only"
        click.echo(f"agentbox: VNC for {sandbox_id} on 127.0.0.1:{bound} ({mode})", err=True)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it ends
        asyncio.run(
            vnc_forward.serve(url, token, sandbox_id, control=control, port=port, ready=ready)
        )


@sandbox.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("sandbox_id")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--timeout", type=DURATION, default=None, help="Time before the command is killed: 90s, 5m, 2h."
)
@click.option("--cwd", help="Working directory inside the sandbox (default /workspace).")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE", help="Extra environment.")
@reports_errors(EXEC_FAILED)
def sandbox_exec(
    sandbox_id: str,
    argv: tuple[str, ...],
    timeout: float | None,
    cwd: str | None,
    env: tuple[str, ...],
) -> None:
    """Run ARGV in a sandbox; output streams through, the exit code is the command's.

    \b
    Examples:
      agentbox sandbox exec $ID -- ls -la /workspace
      agentbox sandbox exec $ID -- bash -c 'cd /tmp && make'
      echo data | agentbox sandbox exec $ID -- wc -c
    """
    execute.run(
        sandbox_id,
        list(argv),
        timeout,
        cwd,
        _parse_env(env),
        lambda line: click.echo(line, err=True),
    )


@sandbox.command("shell")
@click.argument("sandbox_id")
@click.option("--cwd", default="/workspace", show_default=True)
@reports_errors(EXEC_FAILED)
def sandbox_shell(sandbox_id: str, cwd: str) -> None:
    """Open an interactive bash in a sandbox (a terminal on stdin), or run stdin as a script."""
    from agentbox.runtime.commands import CommandRunner

    # A terminal on the host's side: in-process even when the home's gateway serves.
    runner = _runtime(discover=False).commands(sandbox_id)
    if not isinstance(runner, CommandRunner):
        raise InvalidRequest(
            "`sandbox shell` runs on the gateway host only (unset AGENTBOX_URL or set it to "
            "inprocess, run as root); "
            "through a gateway use `sandbox exec` or MCP's shell_* tools"
        )
    interactive = sys.stdin is not None and sys.stdin.isatty()
    leaf = runner.new_leaf()
    argv = ["/bin/bash", "-l"] if interactive else ["/bin/bash", "-s"]
    # The tier's own launch (gVisor: runsc exec with the terminal passed on).
    launcher, env = runner.command_launch(argv, leaf, cwd, runner.environment(None), interactive)
    try:
        code = subprocess.call(launcher, env=env)
    finally:
        runner.finish_leaf(leaf)
    sys.exit(128 - code if code < 0 else code)


# files ------------------------------------------------------------------------------------
@cli.group()
def files() -> None:
    """Read and write files in a sandbox (paths never resolve outside it)."""


@files.command("read")
@click.argument("sandbox_id")
@click.argument("path")
@reports_errors()
def files_read(sandbox_id: str, path: str) -> None:
    """Write the file at PATH to stdout (binary-safe, streamed)."""
    for chunk in _runtime().files(sandbox_id).read_stream(path):
        sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


@files.command("write")
@click.argument("sandbox_id")
@click.argument("path")
@click.option("--append", is_flag=True, help="Append instead of overwriting.")
@reports_errors()
def files_write(sandbox_id: str, path: str, append: bool) -> None:
    """Write stdin to PATH (streamed; parents are created)."""

    def chunks() -> Any:
        while chunk := sys.stdin.buffer.read(1 << 20):
            yield chunk

    from agentbox.runtime.requests_extra import WriteRequest

    request = WriteRequest(path, chunks(), mode="append" if append else "overwrite")
    info = _runtime().files(sandbox_id).put(request)
    click.echo(f"{info.path} ({info.size} bytes)", err=True)


@files.command("ls")
@click.argument("sandbox_id")
@click.argument("path", default="/workspace")
@click.option("--depth", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@reports_errors()
def files_ls(sandbox_id: str, path: str, depth: int, as_json: bool) -> None:
    """List a directory."""
    entries = _runtime().files(sandbox_id).list(path, depth)
    if as_json:
        _print_json([e.to_dict() for e in entries])
        return
    for e in entries:
        click.echo(f"{e.type:<8} {e.size:>10} {e.path}")


# doctor -----------------------------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True)
@reports_errors()
def doctor(as_json: bool) -> None:
    """Check what this host offers agentbox, and how to fix what it lacks."""
    from agentbox.isolation.hostcheck import run_checks

    checks = run_checks(tiers=True)
    if as_json:
        _print_json([c.to_dict() for c in checks])
    else:
        for c in checks:
            mark = "ok     " if c.ok else ("MISSING" if c.required else "missing")
            click.echo(f"{mark} {c.name:<16} {c.detail}")
            if not c.ok:
                click.echo(f"        fix: {c.fix}")
    if any(c.required and not c.ok for c in checks):
        sys.exit(1)


@cli.command("recover")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@reports_errors()
def recover_command(as_json: bool) -> None:
    """Clean up after a crash: adopt running sandboxes, remove half-created or
    half-destroyed ones and host resources no sandbox owns (the gateway does this at
    start). Safe while other agentbox processes run."""
    from agentbox.runtime.recovery import recover
    from agentbox.runtime.runtime import Runtime

    result = recover(Runtime())
    if as_json:
        _print_json(result.to_dict())
        return
    click.echo(f"{len(result.adopted)} sandboxes adopted, {len(result.removed)} removed")
    for orphan in result.orphans:
        click.echo(f"removed orphan {orphan}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
