"""SIGKILL of a real gateway process during 50 concurrent creates and execs, then a
restart: every sandbox either works or is cleanly gone, and once they are destroyed the
host holds exactly what it held before (mounts, loop devices, cgroups, veths, nft rules,
sandbox processes)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import pytest

from agentbox.isolation import diskpool
from agentbox.network import plane
from agentbox.runtime.runtime import Runtime
from gateway_harness import GatewayProcess, throwaway_home

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
CONFIG = """
gateway:
  listen: 127.0.0.1:{port}
  auth: {{operator_token_env: GATEWAY_PROCESS_TOKEN, rate_limit_per_minute: 1000000}}
tools:
  - name: terminal.run
    allow: [echo, "true"]
audit:
  path: {home}/audit/audit.jsonl
"""


@pytest.fixture
def home(host_ready: None) -> Iterator[Path]:
    with throwaway_home("agentbox-crash-") as path:
        yield path


class Gateway(GatewayProcess):
    def __init__(self, home: Path, on_shutdown: str = "keep") -> None:
        super().__init__(
            home, CONFIG.replace("gateway:\n", f"gateway:\n  on_shutdown: {on_shutdown}\n", 1)
        )


def host_resources(home: Path) -> dict[str, Any]:
    """What a sandbox of this home can hold on the host, counted from the kernel's side."""
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if str(home) in line]  # fmt: skip
    loops = [b for b in Path("/sys/block").glob("loop*/loop/backing_file")
             if str(home) in b.read_text()]  # fmt: skip
    cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/agentbox/sb-*")) + sorted(
        str(p) for p in Path("/sys/fs/cgroup").glob("agentbox/sb-*")
    )
    net = plane.registered_home_net(home)
    links = (
        sorted(p.name for p in Path("/sys/class/net").glob(f"{net.ifname_prefix}*")) if net else []
    )
    # The sandboxes' table only: tests before this one may still be taking down their own.
    nft = subprocess.run(["nft", "list", "table", "inet", "agentbox"], capture_output=True,
                         text=True).stdout  # fmt: skip
    nft = "\n".join(line for line in nft.splitlines() if "counter packets" not in line)
    processes = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(home) in cmdline and "bwrap" in cmdline:
                processes.append(cmdline[:80])
    sandbox_dirs = sorted(p.name for p in (home / "sandboxes").glob("sb-*"))
    images = sorted(p.name for p in diskpool.pool_dir(home).glob("*.img"))
    return {"mounts": len(mounts), "loops": len(loops), "cgroups": cgroups, "links": links,
            "nft": nft, "processes": sorted(processes), "dirs": sandbox_dirs, "images": images}  # fmt: skip


def leaked_cgroups(new: set[str], home: Path) -> list[str]:
    """The cgroups of ``new`` that are not another home's: another home's sandbox has its
    bubblewrap or runsc (named by that home) in its cgroup, or goes away within seconds when it
    was ending; a leak of this home's stays, empty or with this home's processes."""

    def foreign(cgroup: str) -> bool:
        for procs in Path(cgroup).rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(OSError):
                        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                        launcher = b"bwrap" in cmdline or b"runsc" in cmdline
                        if launcher and str(home).encode() not in cmdline:
                            return True
        return False

    deadline = time.monotonic() + 10
    while True:  # bounded: another home's ending sandbox is gone within seconds
        suspects = [c for c in sorted(new) if Path(c).exists() and not foreign(c)]
        if not suspects or time.monotonic() > deadline:
            return suspects
        time.sleep(0.2)


def test_sigkill_during_50_creates_then_restart(home: Path) -> None:
    gw = Gateway(home)
    gw.start()
    body = {"memory": "64MiB", "disk": "32MiB", "idle_timeout": 0}
    with gw.client() as op:  # warm: the disk pool, the egress daemon, the nft table
        for network in ("none", {"mode": "allowlist", "allow": ["example.test"]}):
            sid = op.post("/v1/sandboxes", json={**body, "network": network}).json()["id"]
            assert op.delete(f"/v1/sandboxes/{sid}").status_code == 200
    before = host_resources(home)

    created: list[str] = []

    def create_and_exec(i: int) -> str:
        network: Any = "none" if i % 2 else {"mode": "allowlist", "allow": ["example.test"]}
        with contextlib.suppress(httpx2.HTTPError, KeyError, ValueError), gw.client() as c:
            sid = c.post("/v1/sandboxes", json={**body, "network": network}).json()["id"]
            created.append(sid)
            c.post(f"/v1/sandboxes/{sid}/commands", json={"command": "echo ok"})
            return sid
        return "failed"

    with ThreadPoolExecutor(50) as pool:
        futures = [pool.submit(create_and_exec, i) for i in range(50)]
        deadline = time.monotonic() + 120
        while len(created) < 8 and time.monotonic() < deadline:  # mid-work, for sure
            time.sleep(0.02)
        gw.kill(signal.SIGKILL)
        outcomes = [f.result() for f in futures]
    assert 8 <= len(created) < 50 or "failed" in outcomes, "the kill came too late to test"

    gw.start()  # recovery runs before it serves
    trail = [json.loads(x) for x in (home / "audit" / "audit.jsonl").read_text().splitlines()]
    recovery = [r for r in trail if r["decision"] == "recovery"]
    # The kill landed mid-create: the restart found half-made sandboxes to finish off.
    assert recovery and recovery[-1]["removed"], recovery
    with gw.client() as op:
        listed = op.get("/v1/sandboxes").json()
        for sandbox in listed:  # every one left works
            assert sandbox["state"] == "running", sandbox
            r = op.post(f"/v1/sandboxes/{sandbox['id']}/commands", json={"command": "echo ok"})
            assert r.status_code == 200 and r.json()["stdout"] == "ok\n", r.text
        for sandbox in listed:
            assert op.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 200
        kept = op.post("/v1/sandboxes", json={**body, "network": "none"}).json()["id"]
    gw.kill(signal.SIGTERM)  # a graceful stop leaves sandboxes running (on_shutdown: keep)
    runtime = Runtime(home)
    assert runtime.commands(kept).run("echo still").stdout == "still\n"
    runtime.destroy(kept)
    after = host_resources(home)
    # Cgroups are named by sandbox, not by home: one that ended meanwhile may be another
    # home's (an earlier test's sandbox going away), one that is new may be another home's
    # live sandbox; none of this home's may be new.
    assert not leaked_cgroups(set(after.pop("cgroups")) - set(before.pop("cgroups")), home)
    assert after == before


@pytest.mark.parametrize("how", ["stop", "destroy"])
def test_on_shutdown_stop_or_destroy(home: Path, how: str) -> None:
    gw = Gateway(home, on_shutdown=how)
    gw.start()
    body = {"memory": "64MiB", "disk": "32MiB", "idle_timeout": 0, "network": "none"}
    with gw.client() as op:
        ids = [op.post("/v1/sandboxes", json=body).json()["id"] for _ in range(2)]
    gw.kill(signal.SIGTERM)
    runtime = Runtime(home)
    states = {r.id: r.state for r in runtime.store.list()}
    if how == "destroy":
        assert not set(ids) & set(states)
    else:
        assert [states[i] for i in ids] == ["stopped", "stopped"]
        for sandbox_id in ids:
            runtime.destroy(sandbox_id)
