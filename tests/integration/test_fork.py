"""Fork: a new sandbox with a copy of a live one's files at one instant, isolated both
ways, with its own identity; through the SDK, the CLI and the gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.runtime.runtime import Runtime
from gateway_harness import RunningGateway, running_gateway
from tierkit import command_lines

# Every test on both isolation tiers (tests/conftest.py, default_tier).
pytestmark = pytest.mark.usefixtures("default_tier")

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
OWNERS = "python3 -c 'import os, sys; print(*(f\"{s.st_uid}:{s.st_gid}\" for s in map(os.stat, sys.argv[1:])))'"


@pytest.fixture
def source(agentbox_home: Path, runtime: Runtime) -> Iterator[Sandbox]:
    sb = Sandbox.create(memory="256MiB", disk="256MiB", network="none", home=agentbox_home)
    try:
        yield sb
    finally:
        if runtime.store.get(sb.id) is not None:
            sb.kill()


def test_fork_copies_files_and_isolates_both_ways(source: Sandbox, runtime: Runtime) -> None:
    source.files.write("/workspace/shared.txt", "before")
    source.commands.run("mkdir -p ~/.config/tool && echo cfg > ~/.config/tool/x; "
                        "echo tmp > /tmp/t; head -c 3000000 /dev/urandom > /workspace/blob")  # fmt: skip
    before = source.commands.run("sha256sum /workspace/blob").stdout.split()[0]
    source.commands.start("sleep 600")
    fork = source.fork()
    try:
        assert fork.id != source.id
        # the same files: workspace, home (writable layer), /tmp
        assert fork.files.read("/workspace/shared.txt") == "before"
        assert fork.commands.run("cat ~/.config/tool/x /tmp/t").stdout == "cfg\ntmp\n"
        assert fork.commands.run("sha256sum /workspace/blob").stdout.split()[0] == before
        # owned by the fork's user (on gvisor its own host uid, not the source's), and
        # read with python: coreutils' stat fails on this runsc (docs/design.md)
        owner = fork.commands.run("echo $(id -u):$(id -g)").stdout.strip()
        assert owner != ":" and fork.commands.run(OWNERS + " /workspace/shared.txt ~/.config/tool/x"
                                                  ).stdout.split() == [owner, owner]  # fmt: skip
        # its own identity; no processes copied
        assert fork.commands.run("hostname").stdout.strip() == fork.id
        assert [line for line in command_lines(source) if "sleep 600" in line]  # the control
        assert not [line for line in command_lines(fork) if "sleep 600" in line]
        assert fork.commands.list() == []
        # changes stay on their side, both ways
        fork.files.write("/workspace/shared.txt", "fork")
        fork.files.write("/workspace/only-fork", "f")
        source.files.write("/workspace/only-source", "s")
        assert source.commands.run("rm /workspace/blob").ok
        assert not source.files.exists("/workspace/blob")
        assert source.files.read("/workspace/shared.txt") == "before"
        assert not source.files.exists("/workspace/only-fork")
        assert not fork.files.exists("/workspace/only-source")
        assert fork.files.exists("/workspace/blob")
        events = runtime.store.events_after(0, sandbox=fork.id)
        assert events[0]["type"] == "created"
        assert events[0]["details"]["forked_from"] == source.id
    finally:
        fork.kill()


def test_fork_host_uids_differ_and_the_disk_quota_holds(source: Sandbox, runtime: Runtime) -> None:
    source.files.write("/workspace/a", "a")
    fork = source.fork()
    try:
        src, dst = runtime.host(runtime.get(source.id)), runtime.host(runtime.get(fork.id))
        # seen from the host (the disk's side, on either tier), each sandbox's files
        # belong to its own host uid
        src_uid = os.stat(src.workspace / "a").st_uid
        dst_uid = os.stat(dst.workspace / "a").st_uid
        assert src_uid == src.host_uid and dst_uid == dst.host_uid and src_uid != dst_uid
        r = fork.commands.run("head -c 400000000 /dev/zero > /workspace/fill", timeout=60)
        assert r.exit_code != 0 and "No space left" in r.stderr  # the fork's disk is bounded
    finally:
        fork.kill()


def test_fork_of_a_paused_and_of_a_stopped_sandbox(source: Sandbox, runtime: Runtime) -> None:
    source.files.write("/workspace/f", "x")
    source.pause()
    fork = source.fork()
    try:
        assert runtime.get(source.id).state == "paused"  # forking did not resume it
        assert fork.files.read("/workspace/f") == "x"
    finally:
        fork.kill()
    source.stop()
    fork = source.fork()
    try:
        assert fork.files.read("/workspace/f") == "x"
    finally:
        fork.kill()


def test_cli_fork_prints_the_new_id(source: Sandbox, agentbox_home: Path) -> None:
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    env.pop("AGENTBOX_URL", None)
    out = subprocess.run([AGENTBOX, "sandbox", "fork", source.id, "--json"], env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    new = json.loads(out)["id"]
    try:
        assert new.startswith("sb-") and new != source.id
        states = json.loads(subprocess.run([AGENTBOX, "sandbox", "ls", "--json"], env=env,
                            capture_output=True, text=True, check=True).stdout)  # fmt: skip
        assert {s["id"]: s["state"] for s in states}[new] == "running"
    finally:
        Sandbox.connect(new, home=agentbox_home).kill()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwf")) as running:
        yield running


def test_fork_through_the_gateway_has_its_own_tokens(gw: RunningGateway) -> None:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB",
                                             "network": "none"}).json()["id"]  # fmt: skip
        try:
            op.put(f"/v1/sandboxes/{sid}/files", json={"path": "w.txt", "content": "hi"})
            token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
            with gw.client(token) as c:
                assert c.post(f"/v1/sandboxes/{sid}/fork").status_code == 403  # operator only
            r = op.post(f"/v1/sandboxes/{sid}/fork")
            assert r.status_code == 201, r.text
            fid = r.json()["id"]
            try:
                with gw.client(token) as c:  # the source's token does not reach the fork
                    r = c.get(f"/v1/sandboxes/{fid}/files", params={"path": "w.txt"})
                    assert r.status_code == 403
                r = op.get(f"/v1/sandboxes/{fid}/files", params={"path": "w.txt"})
                assert r.status_code == 200 and "hi" in r.text
            finally:
                op.delete(f"/v1/sandboxes/{fid}")
        finally:
            op.delete(f"/v1/sandboxes/{sid}")
