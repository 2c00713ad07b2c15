"""Named cache volumes with real sandboxes: a second sandbox's ``pip install`` is served
from the cache the first one filled (counted by the index's request log), the quota
holds, a second writer is refused, volumes stay out of snapshots and fork copies, and a
volume survives a gateway killed with SIGKILL."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import AsyncVolume, Sandbox, Volume
from agentbox.errors import InvalidRequest, VolumeInUse, VolumeNotFound
from agentbox.fsutil import is_mountpoint
from agentbox.isolation import disk
from agentbox.runtime.recovery import recover
from agentbox.runtime.runtime import Runtime
from gateway_harness import GatewayProcess, throwaway_home
from volumekit import CACHE, NETWORK, counted_index

SMALL = {"memory": "256MiB", "disk": "256MiB", "pids": 256, "network": "none"}


@pytest.fixture
def volume(runtime: Runtime, agentbox_home: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "t-" + request.node.name.removeprefix("test_").replace("_", "-")[:40]
    Volume.create(name, size="64MiB", home=agentbox_home)
    try:
        yield name
    finally:
        for record in runtime.store.list():  # a failed test's sandboxes still hold it
            if any(v.name == name for v in record.spec.volumes):
                runtime.destroy(record.id)
        runtime.volumes.remove(name)


def _mount(name: str, mode: str = "rw", path: str = "/home/user/cache") -> list[dict[str, str]]:
    return [{"name": name, "path": path, "mode": mode}]


def test_pip_install_in_a_second_sandbox_comes_from_the_first_ones_cache(
    runtime: Runtime, agentbox_home: Path, tmp_path: Path
) -> None:
    Volume.create("t-pip-cache", size="256MiB", home=agentbox_home)
    try:
        with counted_index(tmp_path, count=3) as index:
            for round_ in range(2):
                with Sandbox.create(network=NETWORK, volumes=[f"t-pip-cache:{CACHE}"],
                                    home=agentbox_home) as sb:  # fmt: skip
                    r = sb.commands.run(index.install(), timeout=180)
                    assert r.exit_code == 0, r.stderr
                    check = (
                        "/tmp/venv/bin/python3 -c 'import cachedemo_2; print(cachedemo_2.VERSION)'"
                    )
                    assert sb.commands.run(check).stdout == "1.0\n"
                if round_ == 0:
                    assert index.wheel_downloads() == 3, index.requests()
            # The second install asked for the index pages again but took every wheel
            # from the volume.
            assert index.wheel_downloads() == 3, index.requests()
            pages = [r for r in index.requests() if r.startswith("GET /simple/") and "whl" not in r]
            assert len(pages) == 6, index.requests()
        used = Volume.get("t-pip-cache", home=agentbox_home).used_bytes
        assert used is not None and used > 3 * 64 * 1024
    finally:
        Volume.get("t-pip-cache", home=agentbox_home).remove()


def test_the_quota_holds_and_spares_the_sandbox_disk_and_the_host(
    runtime: Runtime, agentbox_home: Path, volume: str
) -> None:
    with Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        r = sb.commands.run("dd if=/dev/zero of=/home/user/cache/fill bs=1M count=200; "
                            "echo rc=$?", timeout=120)  # fmt: skip
        assert "No space left on device" in r.stderr, r.stderr
        # The sandbox's own disk is untouched: it still takes a write the volume refused.
        r = sb.commands.run("dd if=/dev/zero of=/workspace/after bs=1M count=8 && echo ok")
        assert r.stdout.strip().endswith("ok"), r.stderr
    info = runtime.volumes.get(volume)
    assert info["free_bytes"] < 2 * 1024**2
    image = Path(runtime.volumes.store.get(volume).image)
    assert image.stat().st_blocks * 512 <= 64 * 1024**2  # the host holds at most its size


def test_a_second_writer_is_refused_readers_share(
    runtime: Runtime, agentbox_home: Path, volume: str
) -> None:
    writer = Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home)  # type: ignore[arg-type]
    try:
        writer.commands.run("echo from-writer > /home/user/cache/note")
        for mode in ("rw", "ro"):  # neither a second writer nor a reader beside it
            with pytest.raises(VolumeInUse) as caught:
                Sandbox.create(**SMALL, volumes=_mount(volume, mode), home=agentbox_home)  # type: ignore[arg-type]
            assert caught.value.details["sandboxes"] == [writer.id]
        with pytest.raises(VolumeInUse):  # and it is not removed under the writer
            runtime.volumes.remove(volume)
    finally:
        writer.kill()
    readers = [Sandbox.create(**SMALL, volumes=_mount(volume, "ro"), home=agentbox_home)  # type: ignore[arg-type]
               for _ in range(2)]  # fmt: skip
    try:
        for reader in readers:
            assert reader.commands.run("cat /home/user/cache/note").stdout == "from-writer\n"
            r = reader.commands.run("touch /home/user/cache/x")
            assert r.exit_code != 0 and "Read-only file system" in r.stderr
        with pytest.raises(VolumeInUse):  # a writer waits for the readers to go
            Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home)  # type: ignore[arg-type]
    finally:
        for reader in readers:
            reader.kill()
    with Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        assert sb.commands.run("cat /home/user/cache/note").stdout == "from-writer\n"


def test_unknown_volume_and_bad_paths_are_refused(runtime: Runtime, agentbox_home: Path) -> None:
    with pytest.raises(VolumeNotFound):
        Sandbox.create(**SMALL, volumes=_mount("t-never-made"), home=agentbox_home)  # type: ignore[arg-type]
    for path in ("/proc/x", "/workspace/cache", "/usr/lib/x", "relative", "/a/../b", "/"):
        with pytest.raises(InvalidRequest):
            Sandbox.create(**SMALL, volumes=_mount("t-any", path=path), home=agentbox_home)  # type: ignore[arg-type]
    assert not [r for r in runtime.store.list() if r.spec.volumes]


def test_snapshots_and_forks_leave_the_volume_out(
    runtime: Runtime, agentbox_home: Path, volume: str
) -> None:
    with Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        sb.commands.run("echo cached > /home/user/cache/blob; echo mine > /workspace/own")
        fork = sb.fork()
        try:
            assert fork.commands.run("cat /workspace/own").stdout == "mine\n"
            # not copied (the source has it: the control)
            assert sb.commands.run("test -e /home/user/cache/blob").exit_code == 0
            assert fork.commands.run("test -e /home/user/cache/blob").exit_code == 1
            assert runtime.volumes.get(volume)["mounts"] == [
                {"sandbox": sb.id, "path": "/home/user/cache", "mode": "rw"}
            ]
        finally:
            fork.kill()
        snapshot = sb.snapshot()
    # Emptied after the snapshot: were the blob in the snapshot, a restore would bring it.
    with Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        sb.commands.run("mv /home/user/cache/blob /home/user/cache/moved")
    try:
        restored = Sandbox.restore(snapshot.id, home=agentbox_home)
        try:  # it mounts the volume its spec names, as it is now
            assert restored.commands.run("cat /workspace/own").stdout == "mine\n"
            assert restored.commands.run("ls -A /home/user/cache").stdout == "moved\n"
        finally:
            restored.kill()
    finally:
        Sandbox.delete_snapshot(snapshot.id, home=agentbox_home)
    # The volume outlived both sandboxes, with its data.
    with Sandbox.create(**SMALL, volumes=_mount(volume, "ro"), home=agentbox_home) as sb:  # type: ignore[arg-type]
        assert sb.commands.run("cat /home/user/cache/moved").stdout == "cached\n"


def test_a_stopped_sandbox_keeps_its_volume_and_gets_it_back(
    runtime: Runtime, agentbox_home: Path, volume: str
) -> None:
    with Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        sb.commands.run("echo before > /home/user/cache/f")
        sb.stop()
        with pytest.raises(VolumeInUse):  # still its writer while stopped
            Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home)  # type: ignore[arg-type]
        sb.resume()
        assert sb.commands.run("cat /home/user/cache/f").stdout == "before\n"


def test_the_gvisor_tier_shares_volumes_with_the_default_one(
    runtime: Runtime, agentbox_home: Path, volume: str
) -> None:
    """A gVisor sandbox's volume is the same tree: what a namespaces sandbox cached it
    reads, its shell and its file API agree, its writes outlive it and a stop, and a
    reader's bind refuses writes."""
    gvisor = {**SMALL, "isolation": "gvisor"}
    with Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        assert sb.commands.run("echo from-ns > /home/user/cache/a").exit_code == 0
    with Sandbox.create(**gvisor, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        assert sb.commands.run("cat /home/user/cache/a").stdout == "from-ns\n"
        assert sb.commands.run("echo from-gvisor > /home/user/cache/b").exit_code == 0
        assert sb.files.read("/home/user/cache/b") == "from-gvisor\n"
        sb.files.write("/home/user/cache/c", "via-files\n")
        assert sb.commands.run("cat /home/user/cache/c").stdout == "via-files\n"
        sb.stop()
        sb.resume()
        assert sb.commands.run("cat /home/user/cache/b").stdout == "from-gvisor\n"
    # Destroyed: its binds went with its tree, and the volume's data stayed.
    assert sb.id not in Path("/proc/self/mountinfo").read_text()
    with Sandbox.create(**gvisor, volumes=_mount(volume, "ro"), home=agentbox_home) as sb:  # type: ignore[arg-type]
        assert sb.commands.run("cat /home/user/cache/b /home/user/cache/c").stdout == (
            "from-gvisor\nvia-files\n"
        )
        r = sb.commands.run("echo x > /home/user/cache/d")
        assert r.exit_code != 0 and "Read-only file system" in r.stderr, r.stderr
    with Sandbox.create(**SMALL, volumes=_mount(volume, "ro"), home=agentbox_home) as sb:  # type: ignore[arg-type]
        assert sb.commands.run("cat /home/user/cache/b").stdout == "from-gvisor\n"


CONFIG = """
gateway:
  listen: 127.0.0.1:{port}
  auth: {{operator_token_env: GATEWAY_PROCESS_TOKEN, rate_limit_per_minute: 1000000}}
sandbox:
  volumes:
    "*": [{{name: cache, path: /home/user/.cache/pip, size: 32MiB}}]
tools:
  - name: terminal.run
    allow: [bash, cat, echo, "true"]
audit:
  path: {home}/audit/audit.jsonl
volumes:
  dir: {home}/other-disk
"""


@pytest.fixture
def gateway_home(host_ready: None) -> Iterator[Path]:
    with throwaway_home("agentbox-volumes-") as path:
        yield path


def test_a_volume_survives_a_gateway_killed_with_sigkill(gateway_home: Path) -> None:
    gw = GatewayProcess(gateway_home, CONFIG)
    gw.start()
    body = {"memory": "128MiB", "disk": "64MiB", "network": "none", "idle_timeout": 0}
    with gw.client() as op:
        # The config's default cache volume: made on first use, in volumes.dir.
        first = op.post("/v1/sandboxes", json=body).json()["id"]
        assert (gateway_home / "other-disk" / "cache.img").is_file()
        r = op.post(f"/v1/sandboxes/{first}/commands",
                    json={"command": "echo kept > /home/user/.cache/pip/entry"})  # fmt: skip
        assert r.status_code == 200, r.text
        # A second sandbox of the project starts without it (busy: skipped).
        second = op.post("/v1/sandboxes", json=body).json()["id"]
        r = op.post(f"/v1/sandboxes/{second}/commands",
                    json={"command": "cat /home/user/.cache/pip/entry"})  # fmt: skip
        assert r.json()["exit_code"] != 0
        listed = op.get("/v1/volumes").json()
        assert [v["name"] for v in listed] == ["cache"]
        assert [m["sandbox"] for m in listed[0]["mounts"]] == [first]
    gw.kill(signal.SIGKILL)
    gw.start()  # recovery runs before it serves
    with gw.client() as op:
        refused = op.delete("/v1/volumes/cache")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "volume_in_use"
        for sid in (first, second):
            assert op.delete(f"/v1/sandboxes/{sid}").status_code == 200
        third = op.post("/v1/sandboxes", json=body).json()["id"]
        r = op.post(f"/v1/sandboxes/{third}/commands",
                    json={"command": "cat /home/user/.cache/pip/entry"})  # fmt: skip
        assert r.json()["stdout"] == "kept\n", r.text
        assert op.delete(f"/v1/sandboxes/{third}").status_code == 200
        assert op.delete("/v1/volumes/cache").status_code == 200
        assert op.get("/v1/volumes").json() == []
    assert not (gateway_home / "other-disk" / "cache.img").exists()
    gw.kill(signal.SIGTERM)


def test_recovery_mounts_volumes_again_and_forgets_mounts_of_gone_sandboxes(
    runtime: Runtime, agentbox_home: Path, volume: str
) -> None:
    with Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        sb.commands.run("echo survived > /home/user/cache/f")
    # As after a reboot: the host mount is gone; and a creator died between its two writes.
    mountpoint = agentbox_home / "volumes" / "mnt" / volume
    disk.unmount(mountpoint)
    assert not is_mountpoint(mountpoint)
    runtime.volumes.store.attach("sb-gone00000000", [(volume, "/home/user/c", "rw", False)])
    with runtime.volumes.store.db.tx() as db:  # the row alone: its sandbox has no record
        rows = db.execute("SELECT COUNT(*) FROM volume_mounts WHERE volume=?", (volume,))
        assert rows.fetchone()[0] == 1
    report = recover(runtime)
    assert is_mountpoint(mountpoint)
    assert any("volume mount" in o for o in report.orphans), report
    with Sandbox.create(**SMALL, volumes=_mount(volume), home=agentbox_home) as sb:  # type: ignore[arg-type]
        assert sb.commands.run("cat /home/user/cache/f").stdout == "survived\n"


def test_the_async_twin(runtime: Runtime, agentbox_home: Path) -> None:
    async def scenario() -> list[object]:
        made = await AsyncVolume.create("t-async", size="16MiB", home=agentbox_home)
        listed = [v.name for v in await AsyncVolume.list(home=agentbox_home)]
        fresh = await (await AsyncVolume.get("t-async", home=agentbox_home)).refresh()
        await made.remove()
        return [made.size, "t-async" in listed, fresh.info["mounts"]]

    assert asyncio.run(scenario()) == [16 * 1024**2, True, []]
    assert not runtime.volumes.exists("t-async")
