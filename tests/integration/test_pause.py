"""Pause / resume: a counter stops advancing while paused and continues after; a call on
a paused sandbox resumes it; the CLI and a gateway do the same."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.runtime.host import SandboxHost
from agentbox.runtime.runtime import Runtime
from gateway_harness import RunningGateway, running_gateway

# Every test on both isolation tiers (tests/conftest.py, default_tier).
pytestmark = pytest.mark.usefixtures("default_tier")

COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.01; done"


def _count(sb: Sandbox) -> int:
    # Read on the host side of the sandbox's /tmp: any call *through* agentbox (the file
    # API included) would resume a paused sandbox.
    record = sb.info()
    host = SandboxHost(Path(os.environ["AGENTBOX_HOME"]), sb.id, record.slot)
    for _ in range(300):
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int((host.disk / "tmp" / "count").read_text())
        time.sleep(0.01)  # not started yet, or caught between truncate and write
    raise AssertionError("the counter never wrote its count")


def _advancing(sb: Sandbox, seconds: float = 0.3) -> bool:
    first = _count(sb)
    time.sleep(seconds)
    return _count(sb) > first


def _cpu_usage_us(sb: Sandbox, runtime: Runtime) -> int:
    stat = runtime.layout.sandbox(sb.id).unified / "cpu.stat"
    fields = dict(line.split() for line in stat.read_text().splitlines())
    return int(fields["usage_usec"])


def test_pause_freezes_and_resume_continues(runtime: Runtime, agentbox_home: Path) -> None:
    sb = Sandbox.create(memory="128MiB", disk="64MiB", network="none", home=agentbox_home)
    try:
        sb.commands.start(COUNTER)
        assert _advancing(sb), "the counter should run before the pause"
        assert sb.pause().state == "paused" and sb.info().state == "paused"
        cpu = _cpu_usage_us(sb, runtime)
        assert not _advancing(sb), "the counter advanced while paused"
        assert _cpu_usage_us(sb, runtime) == cpu, "the paused sandbox used CPU"
        assert sb.resume().state == "running"
        assert _advancing(sb), "the counter did not continue after resume"
    finally:
        sb.kill()


def test_a_call_on_a_paused_sandbox_resumes_it(agentbox_home: Path) -> None:
    sb = Sandbox.create(memory="128MiB", disk="64MiB", network="none", home=agentbox_home)
    try:
        sb.commands.start(COUNTER)
        sb.pause()
        # Paused by another process: this one's cached view must notice.
        other = Runtime(agentbox_home)
        assert other.get(sb.id).state == "paused"
        assert sb.commands.run("echo back").stdout == "back\n"
        assert sb.info().state == "running" and _advancing(sb)
        sb.pause()
        other.commands(sb.id).run(["true"])  # the other process's call resumes it too
        assert sb.info().state == "running"
    finally:
        sb.kill()


def test_a_paused_sandbox_is_destroyed_cleanly(agentbox_home: Path) -> None:
    sb = Sandbox.create(memory="128MiB", disk="64MiB", network="none", home=agentbox_home)
    sb.commands.start("sleep 1000")
    sb.pause()
    sb.kill()
    assert sb.id not in [r.id for r in Sandbox.list(home=agentbox_home)]


def test_cli_and_gateway_pause_and_resume(
    agentbox_home: Path, tmp_path: Path, host_ready: None
) -> None:
    agentbox = str(Path(sys.executable).parent / "agentbox")
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    sb = Sandbox.create(memory="128MiB", disk="64MiB", network="none", home=agentbox_home)
    try:
        out = subprocess.run([agentbox, "sandbox", "pause", sb.id], env=env, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        assert out == f"{sb.id} paused\n" and sb.info().state == "paused"
        subprocess.run([agentbox, "sandbox", "resume", sb.id], env=env, check=True,
                       capture_output=True)  # fmt: skip
        assert sb.info().state == "running"
        with running_gateway(agentbox_home, tmp_path) as gw:
            _through_gateway(gw, sb.id)
    finally:
        sb.kill()


def _through_gateway(gw: RunningGateway, sandbox_id: str) -> None:
    with gw.operator() as op:
        assert op.post(f"/v1/sandboxes/{sandbox_id}/pause").json()["state"] == "paused"
        ran = op.post(f"/v1/sandboxes/{sandbox_id}/commands", json={"command": "echo hi"})
        assert ran.json()["stdout"] == "hi\n"  # the call resumed it
        assert op.get(f"/v1/sandboxes/{sandbox_id}").json()["state"] == "running"
        op.post(f"/v1/sandboxes/{sandbox_id}/pause")
        assert op.post(f"/v1/sandboxes/{sandbox_id}/resume").json()["state"] == "running"
        trail = op.get("/v1/audit", params={"sandbox": sandbox_id}).json()
    assert {"sandbox_paused", "sandbox_resumed"} <= {r["decision"] for r in trail}
