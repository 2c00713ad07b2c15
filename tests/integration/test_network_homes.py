"""Many AGENTBOX_HOMEs on one host: leftover homes do not use up the network numbers.

Runs against the host's real registry, which other homes on this host share: the homes
this test makes are the only ones it may take a number from (they are the only idle
homes whose use lock names them, the ones reclaimed first), and it removes them after.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.egressd import daemon as egressd
from agentbox.network import plane
from agentbox.runtime.host import release_home_mounts

REGISTER = "import sys; from pathlib import Path; from agentbox.network import plane; " + (
    "print(plane.home_net(Path(sys.argv[1])).index)"
)


@pytest.fixture
def base(host_ready: None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agentbox-homes-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for home in path.iterdir():
            with contextlib.suppress(OSError, ValueError):
                pid = int((home / egressd.PID_FILE).read_text())
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                    time.sleep(0.05)
            release_home_mounts(home)
        shutil.rmtree(path, ignore_errors=True)  # their registry entries go with them


def _registry() -> dict[str, int]:
    try:
        homes: dict[str, int] = json.loads(plane.REGISTRY.read_text())
    except FileNotFoundError:
        return {}
    return homes


def test_leftover_homes_do_not_block_a_new_networked_home(base: Path) -> None:
    before = {h: k for h, k in _registry().items() if Path(h).is_dir()}
    busy = {h: k for h, k in before.items() if _has_daemon_or_sandbox(k)}
    # Homes whose processes have ended and that have no sandbox and no egress daemon (a
    # CLI run, a test session): more of them than there are numbers left.
    leftovers = [base / f"left{i}" for i in range(max(20, plane.MAX_HOMES - len(before) + 1))]
    for home in leftovers:
        home.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", REGISTER, str(home)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        # left over long ago: reclaimed before the (idle) homes of other tests on this host
        os.utime(plane.use_lock(int(done.stdout)), (0, 0))
    registered = _registry()
    assert any(str(h) not in registered for h in leftovers), "no number ran out"

    new = base / "new"
    new.mkdir()
    sb = Sandbox.create(
        memory="128MiB", disk="64MiB", network={"mode": "allowlist", "allow": ["example.test"]},
        home=new,
    )  # fmt: skip
    try:
        net = plane.home_net(new)
        address = (net.proxy_address, plane.EXPLICIT_PORT)
        probe = f"import socket; socket.create_connection({address!r}, timeout=10); print('ok')"
        r = sb.commands.run(["python3", "-c", probe])
        assert r.exit_code == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    finally:
        sb.kill()
    after = _registry()
    assert after[str(new)] == net.index
    kept = {h: after.get(h) for h in busy}
    assert kept == busy, "a home with sandboxes or an egress daemon lost its number"
    taken = {h for h in before if h not in after and Path(h).is_dir()}
    assert not taken, f"homes this test did not make lost their numbers: {taken}"


def _has_daemon_or_sandbox(number: int) -> bool:
    links = list(Path("/sys/class/net").glob(f"{plane.HomeNet(number).ifname_prefix}*"))
    return bool(links) or plane.flock_held(plane.number_lock(number))
