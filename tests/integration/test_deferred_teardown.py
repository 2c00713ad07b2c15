"""A gateway's destroy answers once the sandbox's processes are dead; the host side
(mounts, disk image, network link, record) goes on a thread of its own
(runtime/teardown.py). Until it has, the sandbox is gone to every caller, and its slot stays
taken; a draining process waits for all of it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.errors import SandboxNotFound
from agentbox.runtime.runtime import Runtime


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a killed one not yet reaped by its parent is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.parametrize("tier", ["namespaces", "gvisor"])
def test_a_deferred_destroy_answers_before_the_host_side_is_removed(
    tier: str, runtime: Runtime, agentbox_home: Path
) -> None:
    sb = Sandbox.create(memory="256MiB", disk="256MiB", pids=256, isolation=tier,
                        network="none", home=agentbox_home)  # fmt: skip
    gateway = Runtime(agentbox_home)  # the session's runtime stays synchronous
    gateway.defer_teardowns()
    assert gateway.teardowns is not None
    gate = threading.Event()
    try:
        record = gateway.get(sb.id)
        host = gateway.host(record)
        assert host.dir.exists()

        # An earlier removal still running: this one queues behind it, in order.
        def earlier() -> None:
            gate.wait(120)

        gateway.teardowns.submit("earlier", earlier)
        gateway.destroy(sb.id)

        assert record.init_pid is not None and not _running(record.init_pid)  # killed
        with pytest.raises(SandboxNotFound):
            gateway.get(sb.id)
        assert sb.id not in {r.id for r in gateway.list()}
        assert not gateway.exists(sb.id)
        stored = gateway.store.get(sb.id)  # its slot and uid stay taken meanwhile
        assert stored is not None and stored.state == "destroying"
        assert host.dir.exists()
    finally:
        gate.set()
        gateway.finish_teardowns()
    assert gateway.store.get(sb.id) is None
    assert not host.dir.exists()
    assert not _mounted(host.dir / "root")
    assert not gateway.teardowns.pending(sb.id)


def test_without_deferral_a_destroy_leaves_nothing_when_it_returns(
    runtime: Runtime, agentbox_home: Path
) -> None:
    sb = Sandbox.create(memory="256MiB", disk="256MiB", pids=256, network="none",
                        home=agentbox_home)  # fmt: skip
    host = runtime.host(runtime.get(sb.id))
    runtime.destroy(sb.id)
    assert runtime.store.get(sb.id) is None
    assert not host.dir.exists()
