"""Concurrent tool calls are not queued behind a handful of threads: a ``terminal_run`` holds
a thread of the gateway's executor while its command runs, and Python's default executor
has min(32, cpus + 4) of them (6 on a 2-core host), so callers past that waited for
commands they had nothing to do with."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentbox import Sandbox
from gateway_harness import running_gateway

CALLS = 12  # above the default executor's size on hosts with up to 7 cores


def test_a_dozen_commands_run_at_once(
    agentbox_home: Path, tmp_path_factory: pytest.TempPathFactory, host_ready: None
) -> None:
    sb = Sandbox.create(memory="256MiB", disk="128MiB", network="none", home=agentbox_home)
    try:
        with running_gateway(agentbox_home, tmp_path_factory.mktemp("conc")) as gw:

            def call(i: int) -> dict[str, object]:
                # Each command says it started, then waits (in the sandbox) for the go file.
                command = (
                    f"mkdir -p /workspace/started/{i} && "
                    "while [ ! -e /workspace/go ]; do sleep 0.02; done"
                )
                with gw.operator() as client:
                    r = client.post("/v1/tools/terminal_run",
                                    json={"arguments": {"sandbox_id": sb.id, "command": command}})  # fmt: skip
                    assert r.status_code == 200, r.text
                    return dict(r.json())

            with ThreadPoolExecutor(CALLS) as pool:
                futures = [pool.submit(call, i) for i in range(CALLS)]
                try:
                    started: list[str] = []
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline:  # each ls is a round trip: the pace
                        r = sb.commands.run("ls /workspace/started 2>/dev/null || true")
                        started = r.stdout.split()
                        if len(started) == CALLS or any(f.done() for f in futures):
                            break
                finally:
                    sb.files.write("/workspace/go", "")  # release every command, pass or fail
                results = [f.result() for f in futures]
            assert len(started) == CALLS, f"only {len(started)} of {CALLS} ran at once"
            assert all(r["exit_code"] == 0 for r in results), results
    finally:
        sb.kill()
