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
from agentbox.runtime.template_tiers import TIERS
from gateway_harness import GatewayProcess, throwaway_home, wait_removed

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
            if str(home) in cmdline and ("bwrap" in cmdline or "runsc" in cmdline):
                processes.append(cmdline[:80])
    sandbox_dirs = sorted(p.name for p in (home / "sandboxes").glob("sb-*"))
    images = sorted(p.name for p in diskpool.pool_dir(home).glob("*.img"))
    return {"mounts": len(mounts), "loops": len(loops), "cgroups": cgroups, "links": links,
            "nft": nft, "processes": sorted(processes), "dirs": sandbox_dirs, "images": images}  # fmt: skip


# On gvisor 20 creates, not 50: each is a Sentry and a Gofer (runsc processes, ~40 MiB)
# on a 2-core host; 8 must still be made before the kill lands.
CREATES = {"namespaces": 50, "gvisor": 20}


@pytest.mark.parametrize("tier", TIERS)
def test_sigkill_during_creates_then_restart(home: Path, tier: str) -> None:
    gw = Gateway(home)
    gw.start()
    body = {"memory": "64MiB", "disk": "32MiB", "idle_timeout": 0, "isolation": tier}
    creates = CREATES[tier]
    with gw.client() as op:  # warm: the disk pool, the egress daemon, the nft table
        for network in ("none", {"mode": "allowlist", "allow": ["example.test"]}):
            sid = op.post("/v1/sandboxes", json={**body, "network": network}).json()["id"]
            assert op.delete(f"/v1/sandboxes/{sid}").status_code == 200
            wait_removed(home, sid)  # its host side goes after the answer
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

    with ThreadPoolExecutor(creates) as pool:
        futures = [pool.submit(create_and_exec, i) for i in range(creates)]
        deadline = time.monotonic() + 120
        while len(created) < 8 and time.monotonic() < deadline:  # mid-work, for sure
            time.sleep(0.02)
        gw.kill(signal.SIGKILL)
        outcomes = [f.result() for f in futures]
    assert 8 <= len(created) < creates or "failed" in outcomes, "the kill came too late"

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
        assert op.get(f"/v1/sandboxes/{kept}").json()["isolation"] == tier
    gw.kill(signal.SIGTERM)  # a graceful stop leaves sandboxes running (on_shutdown: keep)
    runtime = Runtime(home)
    assert runtime.commands(kept).run("echo still").stdout == "still\n"
    runtime.destroy(kept)
    after = host_resources(home)
    # Cgroups are named by sandbox, not by home: others on a shared host come and go while
    # this runs (minutes on gvisor). None may be left of a sandbox this test made: those
    # it heard of, and the half-made ones the recovery removed.
    ours = {*created, *(s["id"] for s in listed), kept, *recovery[-1]["removed"],
            *recovery[-1].get("orphans", [])}  # fmt: skip
    left = [c for c in after.pop("cgroups") if Path(c).name in ours]
    assert left == [], left
    before.pop("cgroups")
    assert after == before


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("how", ["stop", "destroy"])
def test_on_shutdown_stop_or_destroy(home: Path, how: str, tier: str) -> None:
    gw = Gateway(home, on_shutdown=how)
    gw.start()
    body = {"memory": "64MiB", "disk": "32MiB", "idle_timeout": 0, "network": "none",
            "isolation": tier}  # fmt: skip
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
