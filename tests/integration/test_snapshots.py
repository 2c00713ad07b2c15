"""Snapshots against real sandboxes: snapshot -> destroy -> restore gives identical files
on the folder store and on a real S3-compatible server (moto, loopback); the secret scan
refuses planted keys with a report that never holds the value; CLI and gateway alike."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.client.remote import GatewayClient, RemoteRuntime
from agentbox.errors import SandboxNotFound, SecretsFound, SnapshotNotFound, TierUnsupported
from agentbox.runtime.runtime import Runtime
from gateway_harness import RunningGateway, running_gateway
from hostres import wait_for

# Every test on both isolation tiers (tests/conftest.py, default_tier).
pytestmark = pytest.mark.usefixtures("default_tier")

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
AWS_KEY = "AKIAZ7QHXQ4VN3TPLM2D"
PRIVATE_KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAuV3nS8nUYqzKzxqJ1gJzvU6pZ3D1x8yq0u9wXlq7m1ZgQbJr\n"
    "-----END RSA PRIVATE KEY-----\n"
)
# Every file (content hash) and every entry (type, mode, owner, link target) the agent can see.
INVENTORY = (
    "cd / && find /workspace /home/user -mindepth 1 -printf '%p %y %m %U:%G %l\\n' | sort; "
    "find /workspace /home/user -type f -print0 | sort -z | xargs -0 sha256sum"
)


def fill(sb: Sandbox) -> str:
    """Files of every kind, in the workspace and the writable layer; their inventory."""
    made = sb.commands.run(
        "mkdir -p /workspace/src/pkg /workspace/empty ~/.config/app && "
        "echo 'print(1)' > /workspace/src/pkg/main.py && chmod 755 /workspace/src/pkg/main.py && "
        "head -c 3000000 /dev/urandom > /workspace/blob.bin && "
        "ln -s src/pkg/main.py /workspace/link && ln -s /etc/passwd /workspace/abs-link && "
        "ln /workspace/blob.bin /workspace/hard.bin && printf 'k=v' > ~/.config/app/conf && "
        "printf '\\xff\\xfe\\x00binary' > /workspace/bin.dat && touch -d 2001-01-01 /workspace/old"
    )
    assert made.ok, made  # every kind was made: a chain cut short would compare less
    listed = inventory(sb)
    assert "/workspace/hard.bin f" in listed and "/workspace/old f" in listed, listed
    return listed


def inventory(sb: Sandbox) -> str:
    """INVENTORY with the sandbox user's ids as ``user:user``: on the gvisor tier they are
    its slot's host uid, and a restored sandbox may get another slot than its source."""
    ids = sb.commands.run("echo $(id -u):$(id -g)").stdout.strip()
    listed = sb.commands.run(INVENTORY)
    assert listed.ok and ids != ":", listed
    return listed.stdout.replace(f" {ids} ", " user:user ")


@pytest.fixture
def made(runtime: Runtime) -> Iterator[list[Sandbox]]:
    sandboxes: list[Sandbox] = []
    yield sandboxes
    for sb in sandboxes:
        if runtime.store.get(sb.id) is not None:
            sb.kill()


def new(made: list[Sandbox], home: Path) -> Sandbox:
    sb = Sandbox.create(memory="256MiB", disk="256MiB", network="none", home=home)
    made.append(sb)
    return sb


def round_trip(made: list[Sandbox], home: Path) -> None:
    sb = new(made, home)
    before = fill(sb)
    info = sb.snapshot()
    assert info.id.startswith("snap-") and info.files > 5 and info.size < info.raw_size
    sb.kill()
    restored = Sandbox.restore(info.id, home=home)
    made.append(restored)
    assert restored.id != sb.id
    assert " user:user " in before  # the agent's files are its user's
    assert inventory(restored) == before
    restored.files.write("/workspace/after", "writable")  # the agent owns its files again
    assert info.id in [s.id for s in Sandbox.snapshots(home=home)]
    Sandbox.delete_snapshot(info.id, home=home)
    with pytest.raises(SnapshotNotFound):
        Sandbox.restore(info.id, home=home)


def test_round_trip_on_the_folder_store(made: list[Sandbox], agentbox_home: Path,
                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.setenv("AGENTBOX_STORE", f"file://{tmp_path / 'store'}")
    round_trip(made, agentbox_home)
    assert (tmp_path / "store").is_dir()


def test_round_trip_on_s3(made: list[Sandbox], agentbox_home: Path, bucket: str,
                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("AGENTBOX_STORE", f"s3://{bucket}/agentbox")
    round_trip(made, agentbox_home)


def test_same_content_same_snapshot(made: list[Sandbox], agentbox_home: Path) -> None:
    sb = new(made, agentbox_home)
    sb.files.write("/workspace/a", "same")
    first, second = sb.snapshot(), sb.snapshot()
    assert first.id == second.id  # content-addressed: stored once
    sb.files.write("/workspace/a", "changed")
    assert sb.snapshot().id != first.id


def test_the_clone_is_unmounted_beside_the_store_and_left_nowhere(
    made: list[Sandbox], agentbox_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its unmount frees the clone's cached pages (0.1-0.17 s at 1 GB): it runs on a
    # thread of its own while the archive's fsync waits for the disk, and is waited for.
    from agentbox.isolation import disk

    unmounted_by: list[str] = []
    real = disk.unmount

    def recording(mountpoint: Path) -> None:
        unmounted_by.append(threading.current_thread().name)
        real(mountpoint)

    monkeypatch.setattr(disk, "unmount", recording)
    sb = new(made, agentbox_home)
    sb.files.write("/workspace/a", "x")
    sb.snapshot()
    assert unmounted_by == ["snapshot-unmount"]
    assert ".snapshot-" not in Path("/proc/self/mounts").read_text()
    from agentbox.isolation import diskpool

    pool = diskpool.pool_dir(agentbox_home)
    assert not [p for p in pool.iterdir() if p.name.startswith(".snapshot-")]
    assert "snapshot-unmount" not in {t.name for t in threading.enumerate()}


def test_secrets_block_a_snapshot_and_the_report_never_holds_them(
    made: list[Sandbox], agentbox_home: Path
) -> None:
    sb = new(made, agentbox_home)
    sb.files.write("/workspace/deploy/.env", f"REGION=eu\nAWS_ACCESS_KEY_ID={AWS_KEY}\n")
    sb.files.write("/home/user/.ssh/id_rsa", PRIVATE_KEY)
    with pytest.raises(SecretsFound) as caught:
        sb.snapshot()
    err = caught.value
    found = {(f["path"], f["line"], f["kind"]) for f in err.details["findings"]}
    assert ("/workspace/deploy/.env", 2, "AWS Access Key") in found
    assert any(p == "/home/user/.ssh/id_rsa" and k == "Private Key" for p, _, k in found)
    text = err.message + json.dumps(err.details)
    assert AWS_KEY not in text and "MIIEow" not in text
    assert Sandbox.snapshots(home=agentbox_home) == [] or all(
        s.sandbox != sb.id for s in Sandbox.snapshots(home=agentbox_home)
    )  # nothing stored
    # allow-listed: taken as is
    allowed = sb.snapshot(allowlist="/workspace/deploy/.env\nkind=Private Key\n")
    # redacted: taken, without the values
    redacted = sb.snapshot(redact=True)
    assert redacted.redacted == ["/home/user/.ssh/id_rsa", "/workspace/deploy/.env"]
    copy = Sandbox.restore(redacted.id, home=agentbox_home)
    made.append(copy)
    env = copy.files.read("/workspace/deploy/.env")
    assert AWS_KEY not in env and "REGION=eu" in env and "[REDACTED:" in env
    assert "MIIEow" not in copy.files.read("/home/user/.ssh/id_rsa")
    assert allowed.id != redacted.id


def test_cli_snapshot_create_restore_ls_rm(made: list[Sandbox], agentbox_home: Path) -> None:
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    env.pop("AGENTBOX_URL", None)

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AGENTBOX, *args], env=env, capture_output=True, text=True,
                              check=check)  # fmt: skip

    sb = new(made, agentbox_home)
    sb.files.write("/workspace/x.txt", "cli")
    snap = json.loads(cli("snapshot", "create", sb.id, "--json").stdout)["id"]
    assert snap in [s["id"] for s in json.loads(cli("snapshot", "ls", "--json").stdout)]
    restored = json.loads(cli("snapshot", "restore", snap, "--json").stdout)["id"]
    made.append(Sandbox.connect(restored, home=agentbox_home))
    assert Sandbox.connect(restored, home=agentbox_home).files.read("/workspace/x.txt") == "cli"
    assert cli("snapshot", "rm", snap).stdout.strip() == snap
    # secrets: non-zero exit, the report on stderr, never the value
    sb.files.write("/workspace/k", f"aws_access_key_id = {AWS_KEY}\n")
    refused = cli("snapshot", "create", sb.id, check=False)
    assert refused.returncode == 3 and refused.stdout == ""
    assert "/workspace/k:1: AWS Access Key" in refused.stderr and AWS_KEY not in refused.stderr


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    store = tmp_path_factory.mktemp("gw-store")
    extra = "snapshots:\n  max_count: 2\n"
    tmp = tmp_path_factory.mktemp("gws")
    with running_gateway(agentbox_home, tmp, extra_yaml=extra,
                         env={"AGENTBOX_STORE": f"file://{store}"}) as running:  # fmt: skip
        yield running


def test_snapshots_through_the_gateway(gw: RunningGateway) -> None:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB",
                                             "network": "none"}).json()["id"]  # fmt: skip
        restored: list[str] = []
        try:
            ids = []
            for i in range(3):
                op.put(f"/v1/sandboxes/{sid}/files", json={"path": "n.txt", "content": str(i)})
                r = op.post(f"/v1/sandboxes/{sid}/snapshots", json={})
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            listed = [s["id"] for s in op.get("/v1/snapshots").json()]
            assert listed == ids[1:]  # retention: max_count 2
            r = op.post(f"/v1/snapshots/{ids[2]}/restore")
            assert r.status_code == 201, r.text
            restored.append(r.json()["id"])
            text = op.get(f"/v1/sandboxes/{restored[0]}/files", params={"path": "n.txt"}).text
            assert "2" in text
            op.put(f"/v1/sandboxes/{sid}/files",
                   json={"path": "k", "content": f"aws_access_key_id = {AWS_KEY}\n"})  # fmt: skip
            r = op.post(f"/v1/sandboxes/{sid}/snapshots", json={})
            assert r.status_code == 422 and r.json()["error"]["code"] == "secrets_found"
            assert AWS_KEY not in r.text
            r = op.post(f"/v1/sandboxes/{sid}/snapshots", json={"redact": True})
            assert r.status_code == 201 and r.json()["redacted"] == ["/workspace/k"]
            token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
            with gw.client(token) as c:  # a session token may not take or read snapshots
                assert c.post(f"/v1/sandboxes/{sid}/snapshots", json={}).status_code == 403
                assert c.get("/v1/snapshots").status_code == 403
            assert op.delete(f"/v1/snapshots/{ids[2]}").status_code == 200
            assert op.get(f"/v1/snapshots/{ids[2]}").status_code == 404
        finally:
            for s in [sid, *restored]:
                op.delete(f"/v1/sandboxes/{s}")
    trail = gw.audit_path.read_text()
    assert '"snapshot_created"' in trail and '"snapshot_refused"' in trail
    assert AWS_KEY not in trail


def test_cli_through_a_gateway(gw: RunningGateway, agentbox_home: Path) -> None:
    """The same commands with AGENTBOX_URL set: fork, snapshot create/restore/ls/rm."""
    env = {**os.environ, "AGENTBOX_URL": gw.url, "AGENTBOX_TOKEN": gw.operator_token}
    env.pop("AGENTBOX_HOME", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AGENTBOX, *args], env=env, capture_output=True, text=True,
                              check=False, timeout=120)  # fmt: skip

    made: list[str] = []
    try:
        r = cli("sandbox", "create", "--memory", "128MiB", "--disk", "64MiB", "--network", "none")
        assert r.returncode == 0, r.stderr
        sid = r.stdout.strip()
        made.append(sid)
        fork = cli("sandbox", "fork", sid, "--json")
        assert fork.returncode == 0, fork.stderr
        made.append(json.loads(fork.stdout)["id"])
        snap = cli("snapshot", "create", sid, "--json")
        assert snap.returncode == 0, snap.stderr
        snap_id = json.loads(snap.stdout)["id"]
        assert snap_id in cli("snapshot", "ls").stdout
        restored = cli("snapshot", "restore", snap_id, "--json")
        assert restored.returncode == 0, restored.stderr
        made.append(json.loads(restored.stdout)["id"])
        states = {s["id"]: s["state"] for s in json.loads(cli("sandbox", "ls", "--json").stdout)}
        assert all(states[i] == "running" for i in made)
        assert cli("snapshot", "rm", snap_id).returncode == 0
    finally:
        for sandbox_id in made:
            cli("sandbox", "rm", sandbox_id)


# snapshots with memory through the gateway (runsc checkpoint; runtime/memory_snapshots.py)
_COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"


def _count(sb: Sandbox) -> int:
    return int(sb.commands.run("cat /tmp/count").stdout.strip() or 0)


@pytest.fixture
def remote(gw: RunningGateway) -> Iterator[RemoteRuntime]:
    client = GatewayClient(gw.url, gw.operator_token)
    try:
        yield RemoteRuntime(client)
    finally:
        client.close()


def test_a_memory_snapshot_through_the_sdk_and_gateway_carries_a_process_on(
    gw: RunningGateway, remote: RemoteRuntime
) -> None:
    """sb.snapshot(memory=True) on the remote backend (REST ``"memory": true``): the
    source carries on, and the sandbox restored from it (through the gateway, after the
    source is gone) goes on counting from the checkpoint's count, in memory only (/tmp is
    not in a snapshot's files: a fresh process would start from 1)."""
    spec = {"isolation": "gvisor", "network": "none", "memory": "256MiB", "disk": "128MiB"}
    source = Sandbox(remote.create(spec), remote)
    restored = None
    try:
        source.commands.start(_COUNTER)
        wait_for(lambda: _count(source) >= 5, 30, "the counter to count")
        before = _count(source)
        info = source.snapshot(memory=True)
        assert info.memory is not None and info.memory["size"] > 0
        at_source = _count(source)
        wait_for(lambda: _count(source) > at_source, 30, "the source to count on")
        source.kill()
        restored = Sandbox(remote.restore(info.id), remote)
        first = wait_for(lambda: _count(restored), 30, "the restored process to count")
        assert first > before
        wait_for(lambda: _count(restored) > first, 30, "the restored process to count on")
    finally:
        for sb in (source, restored):
            if sb is not None:
                with contextlib.suppress(SandboxNotFound):
                    sb.kill()
    created = [json.loads(line) for line in gw.audit_path.read_text().splitlines()
               if '"snapshot_created"' in line]  # fmt: skip
    assert any(r.get("snapshot") == info.id and r.get("memory") is True for r in created)


def test_a_memory_snapshot_on_the_namespaces_tier_is_a_typed_error_through_the_gateway(
    gw: RunningGateway, remote: RemoteRuntime
) -> None:
    """Over REST and through the SDK alike: tier_unsupported, saying what to do instead."""
    spec = {"network": "none", "memory": "256MiB", "disk": "128MiB", "isolation": "namespaces"}
    sb = Sandbox(remote.create(spec), remote)  # namespaces whatever the module's tier
    try:
        with gw.operator() as op:
            r = op.post(f"/v1/sandboxes/{sb.id}/snapshots", json={"memory": True})
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "tier_unsupported"
        assert "needs isolation gvisor" in error["message"]
        assert '"memory": false' in error["message"] and "memory=False" in error["message"]
        with pytest.raises(TierUnsupported, match="needs isolation gvisor"):
            sb.snapshot(memory=True)
        assert not [s for s in remote.list_snapshots() if s.sandbox == sb.id]
    finally:
        sb.kill()
