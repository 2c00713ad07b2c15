"""The host network plumbing a create and a kill do without starting processes: the
setup a create starts with (``plane.ensure_host_setup``) lists agentbox's nft table only
when the ruleset changed since the last check (``network/nftgen.py``), and a kill removes
a veth left on the host over rtnetlink (``plane.detach``). Each case runs in a network
namespace of its own (``unshare -n``): its ruleset, links and note, never the host's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="module")
def _host_has_what_these_need() -> None:
    """Fail (never skip, tests/conftest.py) saying what the host lacks."""
    missing = [tool for tool in ("unshare", "nft") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"these tests need root and {', '.join(missing) or 'nothing else'}: "
                    "run the suite as root after scripts/install.sh --dev")  # fmt: skip


# In a new namespace: the generation moves with each change; setup loads the table, notes
# the generation at a check that found it, skips the listing while nothing changed (no
# `nft` on PATH then), and loads the table again once someone deleted it.
_SCRIPT = """
import os, subprocess, sys
from agentbox.network import nftgen, plane

def setup_in_new_process(path):
    # ensure_host_setup remembers a home per process: each step is a new one.
    code = "from agentbox.network import plane; plane.ensure_host_setup(plane.HomeNet(31))"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "PATH": path},
                          capture_output=True, text=True)

def table():
    return subprocess.run(["nft", "list", "table", "inet", plane.TABLE],
                          capture_output=True).returncode == 0

note = nftgen.checked_path(str(plane.REGISTRY.parent))
try:
    first = nftgen.generation()
    assert first is not None
    assert not table()
    assert setup_in_new_process(os.environ["PATH"]).returncode == 0  # loads it
    assert table() and nftgen.generation() != first
    assert not os.path.exists(note)  # loaded, not yet found by a check
    assert setup_in_new_process(os.environ["PATH"]).returncode == 0  # finds it: noted
    assert nftgen.read_checked(str(plane.REGISTRY.parent)) == nftgen.generation()
    # Nothing changed: no nft needed (a listing would fail: not on this PATH).
    assert setup_in_new_process("/nonexistent").returncode == 0
    subprocess.run(["nft", "delete", "table", "inet", plane.TABLE], check=True)
    # Changed: listed again, which needs nft...
    missing = setup_in_new_process("/nonexistent")
    assert missing.returncode != 0 and "'nft'" in missing.stderr, missing.stderr
    # ...and loads the table anew.
    assert setup_in_new_process(os.environ["PATH"]).returncode == 0 and table()
finally:
    try:
        os.unlink(note)
    except FileNotFoundError:
        pass
print("ok")
"""


def test_setup_lists_the_table_only_when_the_ruleset_changed(tmp_path: Path) -> None:
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


_DETACH = """
import os, subprocess
from pathlib import Path
from agentbox.network import plane

link = plane.HomeNet(31).link(7)
subprocess.run(["ip", "link", "add", link.host_ifname, "type", "veth", "peer", "name", "p7"],
               check=True)
assert Path(f"/sys/class/net/{link.host_ifname}").exists()
os.environ["PATH"] = "/nonexistent"  # no `ip` process: a kill starts none
plane.detach(link)
assert not Path(f"/sys/class/net/{link.host_ifname}").exists()
assert not Path("/sys/class/net/p7").exists()  # the pair goes together
plane.detach(link)  # gone already: nothing to do, no error
print("ok")
"""


_NEW_NETNS_AND_SYSFS = [
    "unshare",
    "-n",
    "-m",
    "sh",
    "-c",
    'mount -t sysfs sysfs /sys && exec "$0" -c "$1"',
]


def _run_in_new_netns(script: str) -> None:
    done = subprocess.run(
        # Its own mount namespace too: /sys/class/net shows the netns sysfs was mounted in.
        [*_NEW_NETNS_AND_SYSFS, sys.executable, script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_detach_removes_the_veth_left_on_the_host() -> None:
    _run_in_new_netns(_DETACH)


# A sandbox's pair, its peer in a namespace a live process holds (the sandbox's, before
# its kill): removing it takes both ends, and its name (the slot's) is free for the next
# sandbox at once, while the deleting call still waits for the kernel's RCU barrier.
_DETACH_LIVE = """
import os, subprocess, time
from pathlib import Path
from agentbox.network import plane, rtnetlink

def devices(pid):  # the interfaces of that process's network namespace
    return [line.split(":")[0].strip() for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]

link = plane.HomeNet(31).link(7)
holder = subprocess.Popen(["unshare", "-n", "sleep", "600"])
try:
    deadline = time.monotonic() + 30
    while os.readlink(f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
        assert time.monotonic() < deadline, "unshare never made its namespace"
        time.sleep(0.001)  # until it runs in its own namespace
    for _ in range(3):
        with rtnetlink.Route.here() as route:
            route.add_veth(link.host_ifname, "eth0", holder.pid)
        assert Path(f"/sys/class/net/{link.host_ifname}").exists()
        assert "eth0" in devices(holder.pid)
        plane.detaching(link)()
        assert not Path(f"/sys/class/net/{link.host_ifname}").exists()  # the name is free
        deadline = time.monotonic() + 30  # the peer goes in the same kernel call
        while devices(holder.pid) != ["lo"]:
            assert time.monotonic() < deadline, devices(holder.pid)
            time.sleep(0.001)
    plane.detaching(link)()  # gone already: nothing to do
finally:
    holder.kill()
    holder.wait()
print("ok")
"""

# A link of a sandbox's name that the kernel will not delete (here a loopback renamed, in
# this test's own namespace): detach says so instead of leaving it behind in silence.
_DETACH_REFUSED = """
import subprocess
from agentbox.errors import SandboxError
from agentbox.network import plane

link = plane.HomeNet(31).link(7)
subprocess.run(["ip", "link", "set", "lo", "name", link.host_ifname], check=True)
try:
    plane.detach(link)
except SandboxError as e:
    assert link.host_ifname in str(e), e
else:
    raise AssertionError("detach left an undeletable link behind without a word")
print("ok")
"""


@pytest.mark.parametrize("script", [_DETACH_LIVE, _DETACH_REFUSED], ids=["live-peer", "refused"])
def test_detach_waits_for_the_link_and_reports_a_refusal(script: str) -> None:
    _run_in_new_netns(script)
