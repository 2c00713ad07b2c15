"""A test's sandbox on one isolation tier (the fixtures that run a contract on both tiers
use it: tests/conftest.py, tests/security/conftest.py and single modules)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.runtime.runtime import Runtime


@contextlib.contextmanager
def sandbox_on(
    runtime: Runtime, home: Path, tier: str = "namespaces", disk: str = "256MiB"
) -> Iterator[Sandbox]:
    """A sandbox on isolation ``tier``, destroyed afterwards unless the test did."""
    sb = Sandbox.create(memory="256MiB", disk=disk, pids=256, isolation=tier, home=home)
    try:
        yield sb
    finally:
        if runtime.store.get(sb.id) is not None:
            sb.kill()


# Every process's command line, one per line, read from /proc by the shell itself: `ps`
# does not work on the gvisor tier (and `ls` of some directories fails there), so a check
# built on them sees nothing and passes whatever runs.
PROCESS_LISTING = 'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline; echo; done'


def command_lines(sb: Sandbox) -> list[str]:
    """The command lines of the sandbox's processes; proves the listing saw its own shell
    (whose command line names /proc), so an empty answer can never pass a check."""
    r = sb.commands.run(PROCESS_LISTING, timeout=60)
    assert r.exit_code == 0 and not r.timed_out, (r.exit_code, r.timed_out, r.stderr)
    lines = [line.strip() for line in r.stdout.splitlines() if line.strip()]
    assert any("/proc/[0-9]*" in line for line in lines), f"the listing missed itself: {lines}"
    return lines


def not_on_gvisor(tier: str, reason: str) -> None:
    """Skip on the gvisor tier, saying why it does not hold there (a skip, never a pass;
    keep these few, each with its reason)."""
    if tier == "gvisor":
        pytest.skip(f"does not hold on the gvisor tier: {reason}")


# Integration files that run on one tier, each with why (tests/unit/test_integration_tiers.py
# checks every other file there runs on both, or is gVisor's own). Tier-independent: what
# they test is decided above the isolation tier (a front end, the gateway's own logic, a
# host-side store), and the commands, files and lifecycle under it run on both tiers in
# the files that test those.
TIER_INDEPENDENT = {
    "test_admission.py": "admission counts requests before any tier is involved",
    "test_async_sdk.py": "the async SDK mirrors the sync one; the calls under it: test_sdk_contract",
    "test_audit_sink.py": "the remote audit sink; no sandbox",
    "test_cli.py": "the CLI's own parsing and output; `--isolation`: test_gvisor_tier",
    "test_cluster_node_list.py": "a replica's node list; no sandbox runs",
    "test_cluster_node_pool.py": "a replica's node connections; no sandbox runs",
    "test_conformance.py": "MCP protocol conformance of the gateway",
    "test_connect_snippets.py": "the README's client snippets (the protocol)",
    "test_console.py": "the web console (front end)",
    "test_disk_cache_threads.py": "the formatted-disk cache both tiers' disks come from",
    "test_e2b_js.py": "the E2B wire protocol; what runs under it: test_e2b_pty, test_sdk_contract",
    "test_e2b_sdk.py": "the E2B wire protocol; what runs under it: test_e2b_pty, test_sdk_contract",
    "test_egress_proxy.py": "the egress proxy alone; sandboxes' egress: security/test_network_egress",
    "test_error_hints.py": "error wording per surface",
    "test_gateway_clients.py": "the SDK and CLI through a gateway: typed errors over the wire",
    "test_gateway_concurrency.py": "the gateway's executor threads",
    "test_gateway_fuzz.py": "the gateway's request handling",
    "test_gateway_socket.py": "the SDK's transport to the home's gateway; the calls under it: test_sdk_contract",
    "test_gateway_lifecycle.py": "the gateway's watcher, SSE and webhooks; idle: test_idle_and_events",
    "test_host_checks.py": "the doctor's host checks",
    "test_host_plumbing.py": "the host side of a sandbox's network link (nft check, link removal)",
    "test_launcher_view.py": "the namespaces tier's launcher (bubblewrap) only",
    "test_launch_overlap.py": "the namespaces tier's launcher waiting for its disk; gvisor mounts first",
    "test_loop_direct_io.py": "a snapshot view's loop device on the host",
    "test_mcp_auth.py": "the gateway's HTTP authorization",
    "test_metrics.py": "the gateway's /metrics",
    "test_model_endpoint.py": "the gateway's model endpoint; no command runs",
    "test_model_wire_formats.py": "the model endpoint's translation; no sandbox",
    "test_network_homes.py": "network numbers per home; no command runs",
    "test_objectstore.py": "the snapshot blob stores; no sandbox",
    "test_quick_exec.py": "the namespaces tier's light exec path; gvisor is left to the runtime",
    "test_state_postgres.py": "the gateways' shared state",
    "test_stdio_gateway.py": "the stdio relay to a gateway; its tool calls: test_gateway_mcp",
    "test_tasks.py": "batch task workers and accounting; their tools: test_gateway_mcp",
    "test_task_state_outage.py": "the task workers across a PostgreSQL outage; the tier is not involved",
    "test_telemetry.py": "OTLP traces of the gateway",
    "test_template_gc.py": "the template store's collection (host side)",
    "test_tool_arguments.py": "argument models, checked before any sandbox is reached",
}
# Not run on gvisor yet, and where to pick up.
NOT_YET_ON_GVISOR = {
    "test_sandbox_locales.py": "the locale archive is bound by the namespaces tier's bwrap mounts; a gvisor sandbox loads the host's locale files (correct, slower)",
    "test_desktop.py": "desktop mode (Xvnc, openbox) is built on the namespaces tier only",
    "test_task_seed_chain.py": "its browser step on gvisor: test_browser runs the browser there",
    "test_real_agents.py": "real agents from npm: long; run it on gvisor with default_tier",
}

# Security files that run on one tier, and why: what they attack is the gateway, the
# policy or host-side code the tiers share (the same files API, proxy and archive code),
# or a part only one tier has. Those that attack the sandbox boundary itself run on both
# (tests/security/conftest.py, ``tier``); tests/unit/test_integration_tiers.py checks.
SECURITY_ONE_TIER = {
    "test_approval_state.py": "MCP approval state in the gateway; no sandbox boundary",
    "test_bad_input.py": "argument checks before any sandbox is reached (runtime/requests.py)",
    "test_browser_confinement.py": "the namespaces tier's browser; gvisor's: test_browser_gvisor",
    "test_command_policy_bypass.py": "the gateway's command policy, before any tier",
    "test_desktop_access.py": "desktop mode is built on the namespaces tier only",
    "test_egress_ask.py": "the egress proxy's ask decisions, the same for both tiers' netns",
    "test_file_policy_resolved.py": "the gateway's file policy, before any tier",
    "test_gateway_bad_input.py": "the gateway's HTTP and MCP input, before any tier",
    "test_host_side_paths.py": "host code walking /proc/PID/root of a bubblewrap init",
    "test_launcher_env.py": "the namespaces tier's host-side launcher (agentbox-nsexec)",
    "test_network_spec_refusals.py": "network spec validation, before any tier",
    "test_resident_launcher.py": "the namespaces tier's resident launcher",
    "test_secretscan_coverage.py": "host-side secret scan of a snapshot's files",
    "test_safe_export.py": "host-side export of the sandbox disk, the same code on both",
    "test_shell_parser_differential.py": "the shell parser against bash; no sandbox",
    "test_snapshot_restore.py": "host-side unpacking of a hostile archive into a new disk",
    "test_teardown.py": "gvisor's teardown: test_lifecycle and test_crash_recovery (both tiers)",
    "test_watch_confinement.py": "runtime/watches.py on a fake root beside a host directory",
}
