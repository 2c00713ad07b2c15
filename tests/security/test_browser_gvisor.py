"""The browser on the gvisor tier: Chromium runs inside the Sentry, so every one of its
processes is a task of gVisor's kernel, none a host process; Chromium's own sandbox
(user namespaces + seccomp-bpf, both gVisor's) is on; what it reads of /proc is gVisor's;
its traffic takes the sandbox's egress path (the proxy decides, the audit records).

What the host keeps of it is one ``runsc exec`` (its stdio carries the DevTools pipe);
see browser/launch.py and runtime/gvisor_commands.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from secprobe import host_uid

from agentbox import Sandbox
from agentbox.audit.log import read_records
from agentbox.browser.launch import NO_SANDBOX
from agentbox.browser.manager import (
    CHROMIUM,
    GVISOR_MIN_PIDS,
    BrowserConfig,
    BrowserManager,
    NavigationFailed,
)
from agentbox.egressd import daemon as egressd
from agentbox.errors import Conflict
from agentbox.network import plane
from agentbox.runtime.runtime import Runtime
from browserkit import chromium_pids, require_browser
from hostres import wait_for

PAGE = "data:text/html,<title>Inside</title><h1>confined</h1>"
# Each process's command line and its seccomp mode, as gVisor's /proc shows them.
_LISTING = (
    'for p in /proc/[0-9]*; do echo "$(tr "\\0" " " < $p/cmdline)|'
    '$(grep ^Seccomp: $p/status | tr -d "[:space:]")"; done'
)


@pytest.fixture
def gvisor_browser(
    runtime: Runtime, agentbox_home: Path
) -> Iterator[tuple[Sandbox, BrowserManager]]:
    require_browser()
    network = {"mode": "allowlist", "allow": ["allowed.test"], "hosts": {}}
    sb = Sandbox.create(memory="1GiB", disk="512MiB", pids=GVISOR_MIN_PIDS, network=network,
                        isolation="gvisor", home=agentbox_home)  # fmt: skip
    manager = BrowserManager(runtime, BrowserConfig())
    try:
        yield sb, manager
    finally:
        manager.close_all()
        if runtime.store.get(sb.id) is not None:
            sb.kill()


def _chromium_inside(sb: Sandbox) -> list[tuple[str, str]]:
    out = sb.commands.run(_LISTING).stdout
    rows = [line.rpartition("|") for line in out.splitlines()]
    return [(cmd.strip(), mode) for cmd, _, mode in rows if cmd.startswith(CHROMIUM)]


def test_chromium_on_gvisor_is_no_host_process_and_runs_its_own_sandbox(
    runtime: Runtime, gvisor_browser: tuple[Sandbox, BrowserManager]
) -> None:
    sb, manager = gvisor_browser
    opened = manager.open(sb.id, PAGE, None, 120, 1000)
    assert opened["title"] == "Inside" and "confined" in opened["text"]
    assert chromium_pids(host_uid(sb)) == []  # not one Chromium process on the host
    inside = _chromium_inside(sb)
    main = [cmd for cmd, _ in inside if "--type=" not in cmd]
    assert len(main) == 1, inside
    assert f"--proxy-server=http://{runtime.net.proxy_address}:{plane.EXPLICIT_PORT}" in main[0]
    assert NO_SANDBOX not in main[0]  # Chromium's own sandbox is on here
    # Its renderers run under Chromium's seccomp-bpf filter (mode 2), in gVisor's kernel.
    renderers = [mode for cmd, mode in inside if "--type=renderer" in cmd]
    assert renderers and all(mode == "Seccomp:2" for mode in renderers), inside


def test_the_browser_reads_gvisors_proc_not_the_hosts(
    gvisor_browser: tuple[Sandbox, BrowserManager],
) -> None:
    """What the browser can list of /proc is gVisor's: the sandbox's few tasks, not the
    host's processes (this test's own pid among them); the host's boot id is not there.
    (gVisor's /proc files report size 0, so Chromium shows them empty: a listing is what
    it can read.)"""
    sb, manager = gvisor_browser
    opened = manager.open(sb.id, "file:///proc/", None, 120, 20000)
    pids = {int(n) for n in re.findall(r"^(\d+)/", opened["text"], re.MULTILINE)}
    assert 1 in pids, opened["text"]  # the listing was read: the sandbox's init is there
    host_pids = {int(n) for n in os.listdir("/proc") if n.isdigit()}
    assert os.getpid() not in pids and len(pids) < len(host_pids) / 2, (pids, len(host_pids))
    with pytest.raises(NavigationFailed, match="ERR_FILE_NOT_FOUND"):
        manager.open(sb.id, "file:///proc/sys/kernel/random/boot_id", opened["handle"], 60, 100)


def test_the_browser_on_gvisor_takes_the_egress_path(
    runtime: Runtime, gvisor_browser: tuple[Sandbox, BrowserManager]
) -> None:
    """A name off the allowlist is refused by the sandbox's egress proxy and recorded."""
    sb, manager = gvisor_browser
    opened = manager.open(sb.id, PAGE, None, 120, 1000)
    with pytest.raises(NavigationFailed, match="egress policy"):
        manager.open(sb.id, "https://other.test/", opened["handle"], 30, 1000)

    def denied() -> list[dict[str, object]]:
        records = read_records(egressd.audit_path(runtime.home), limit=None)
        return [r for r in records if r["sandbox"] == sb.id and r["host"] == "other.test"
                and r["decision"] == "egress_denied"]  # fmt: skip

    wait_for(denied, 10, "the refused CONNECT in egress.jsonl")


def test_a_memory_snapshot_waits_for_the_browser_to_close(
    runtime: Runtime, gvisor_browser: tuple[Sandbox, BrowserManager]
) -> None:
    """The DevTools pipe is a host fd in the Sentry, which a checkpoint cannot save (a
    failed checkpoint ends the sandbox): refused with the next step, the sandbox intact."""
    sb, manager = gvisor_browser
    opened = manager.open(sb.id, PAGE, None, 120, 1000)
    with pytest.raises(Conflict, match="browser_close"):
        runtime.snapshot(sb.id, memory=True)
    assert manager.snapshot(sb.id, opened["handle"], 30, 1000, False)["title"] == "Inside"
    assert sb.commands.run("echo alive").stdout == "alive\n"
