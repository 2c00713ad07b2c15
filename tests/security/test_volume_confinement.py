"""Named volumes: a tree one sandbox controls, later read by another sandbox and handed
over by host-side code.

Covers: symlinks planted in a volume (absolute, relative with ``..``, to a directory)
reach nothing of the host from the next sandbox's shell, its file API, or the host's
hand-over walk (which changes neither owner nor mode of what they name); a set-uid binary
planted in a volume runs without its bit later (the bit is cleared and both the host
mount and the sandbox's bind are nosuid); device nodes cannot be made in a volume, and
one put there from the host opens nowhere (nodev); a full volume ends with ENOSPC inside
and the host holds at most its size; racing writers: exactly one wins; a mount path the
agent turned into a symlink while stopped is refused at the next start.

Each runs on both isolation tiers (``tier``): on gVisor the host binds the volume into the
tree its Gofer serves, so the mount options checked are that host bind's.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from secprobe import HostSecret, dir_entries

from agentbox import Sandbox, Volume
from agentbox.errors import AgentboxError, InvalidRequest, VolumeInUse
from agentbox.runtime.runtime import Runtime

SMALL = {"memory": "256MiB", "disk": "128MiB", "pids": 256, "network": "none"}
PATH = "/home/user/cache"
# A file's permission bits, octal: not coreutils' stat, whose statx this gVisor refuses.
MODE = "python3 -c 'import os, sys; print(format(os.stat(sys.argv[1]).st_mode & 0o7777, \"o\"))' "


@pytest.fixture
def volume(runtime: Runtime, agentbox_home: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    # Parameters ([rw-gvisor]) are no part of a name: a random tail keeps runs apart.
    test = request.node.originalname.removeprefix("test_").replace("_", "-")
    name = f"s-{test[:40]}-{secrets.token_hex(3)}"
    Volume.create(name, size="32MiB", home=agentbox_home)
    try:
        yield name
    finally:
        for record in runtime.store.list():
            if any(v.name == name for v in record.spec.volumes):
                runtime.destroy(record.id)
        runtime.volumes.remove(name)


def _with(
    volume: str, home: Path, mode: str = "rw", path: str = PATH, tier: str = "namespaces"
) -> Sandbox:
    mounts = [{"name": volume, "path": path, "mode": mode}]
    return Sandbox.create(**SMALL, volumes=mounts, isolation=tier, home=home)  # type: ignore[arg-type]


def _host_data(runtime: Runtime, volume: str) -> Path:
    return runtime.home / "volumes" / "mnt" / volume / "data"


def _mount_options(sb: Sandbox, path: str, tier: str, home: Path) -> set[str]:
    """The options of the mount at ``path``: in the sandbox (bubblewrap's bind), or on
    the host (gVisor's Sentry sees no host mount; the host bind is what its Gofer serves)."""
    if tier == "gvisor":
        mountinfo = Path("/proc/self/mountinfo").read_text()
        path = str(home / "sandboxes" / sb.id / "root") + path
    else:
        mountinfo = sb.commands.run("cat /proc/self/mountinfo").stdout
    for line in mountinfo.splitlines():
        fields = line.split()
        if fields[4] == path:
            return set(fields[5].split(","))
    raise AssertionError(f"{path} is not a mount in the sandbox")


@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_symlinks_planted_in_a_volume_reach_nothing_of_the_host(
    runtime: Runtime,
    agentbox_home: Path,
    volume: str,
    host_secret: HostSecret,
    mode: str,
    tier: str,
) -> None:
    host_secret.file.chmod(0o600)
    before = host_secret.file.stat(), host_secret.dir.stat()
    with _with(volume, agentbox_home, tier=tier) as planter:
        r = planter.commands.run(
            f"cd {PATH} && ln -s {host_secret.file} abs && "
            f"ln -s ../../../../../../../..{host_secret.file} rel && "
            f"ln -s {host_secret.dir} dir && mkdir sub && ln -s {host_secret.dir} sub/deep"
        )
        assert r.exit_code == 0, r.stderr
    # The next sandbox's hand-over walks the tree as root on the host.
    with _with(volume, agentbox_home, mode, tier=tier) as reader:
        for link in ("abs", "rel", "dir/secret.txt", "sub/deep/secret.txt"):
            r = reader.commands.run(f"cat {PATH}/{link}")
            assert host_secret.value not in r.stdout, link
            try:
                data = reader.files.read(f"{PATH}/{link}")
            except AgentboxError:
                continue
            assert host_secret.value not in data, link
    after = host_secret.file.stat(), host_secret.dir.stat()
    for old, new in zip(before, after, strict=True):  # the walk followed no link
        assert (new.st_uid, new.st_gid, new.st_mode) == (old.st_uid, old.st_gid, old.st_mode)
    # Host-side listing and usage read only the filesystem's counters.
    info = runtime.volumes.get(volume)
    assert host_secret.value not in str(info)


def test_a_setuid_binary_planted_in_a_volume_is_not_setuid_later(
    runtime: Runtime, agentbox_home: Path, volume: str, tier: str
) -> None:
    with _with(volume, agentbox_home, tier=tier) as planter:
        r = planter.commands.run(f"cp /usr/bin/id {PATH}/id && chmod 6755 {PATH}/id && "
                                 f"{MODE}{PATH}/id")  # fmt: skip
        assert r.stdout.strip() == "6755", r.stderr  # the plant itself worked
        assert {"nosuid", "nodev"} <= _mount_options(planter, PATH, tier, agentbox_home)
    for mode in ("ro", "rw"):
        with _with(volume, agentbox_home, mode, tier=tier) as later:
            assert later.commands.run(f"{MODE}{PATH}/id").stdout.strip() == "755"
            options = _mount_options(later, PATH, tier, agentbox_home)
            assert {"nosuid", "nodev"} <= options
            assert ("ro" in options) == (mode == "ro")
            uid = later.commands.run("id -u").stdout.strip()
            assert uid != "0"
            assert later.commands.run(f"{PATH}/id -u").stdout.strip() == uid
    # And the host's own mount of the volume, which every bind comes from.
    mnt = str(_host_data(runtime, volume).parent)
    line = next(x for x in Path("/proc/self/mountinfo").read_text().splitlines()
                if x.split()[4] == mnt)  # fmt: skip
    assert {"nosuid", "nodev"} <= set(line.split()[5].split(","))


def test_device_nodes_in_a_volume_cannot_be_made_or_used(
    runtime: Runtime, agentbox_home: Path, volume: str, tier: str
) -> None:
    with _with(volume, agentbox_home, tier=tier) as sb:
        for make in (f"mknod {PATH}/null c 1 3",
                     f"python3 -c 'import os; os.mknod(\"{PATH}/zero\", 0o20666, os.makedev(1, 5))'"):  # fmt: skip
            assert sb.commands.run(make).exit_code != 0, make
        assert dir_entries(sb, PATH) == []  # not `ls`: it fails on gvisor, printing ""
    # One put there from outside (an image made elsewhere): nodev, so it opens nothing.
    data = _host_data(runtime, volume)
    os.mknod(data / "mem", 0o666 | stat.S_IFCHR, os.makedev(1, 1))  # /dev/mem
    os.mknod(data / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    with _with(volume, agentbox_home, "ro", tier=tier) as sb:
        for node in ("mem", "zero"):
            r = sb.commands.run(f"head -c 1 {PATH}/{node} | wc -c")
            assert r.stdout.strip() == "0" and "head:" in r.stderr, (node, r.stderr)


def test_a_full_volume_stops_at_its_size(
    runtime: Runtime, agentbox_home: Path, volume: str, tier: str
) -> None:
    with _with(volume, agentbox_home, tier=tier) as sb:
        r = sb.commands.run(f"for i in 1 2 3 4; do dd if=/dev/urandom of={PATH}/f$i bs=1M "
                            "count=16 2>&1; done",
                            timeout=120)  # fmt: skip
        assert "No space left on device" in r.stdout, r.stdout
        assert sb.commands.run("echo fine > /workspace/x && cat /workspace/x").stdout == "fine\n"
    # What the host gives the volume, counted by the host: never more than its size (the
    # host's free space itself moves with every other sandbox on this machine).
    image = Path(runtime.volumes.store.get(volume).image)
    assert image.stat().st_blocks * 512 <= 32 * 1024**2
    assert runtime.volumes.get(volume)["free_bytes"] < 1024**2


def test_racing_writers_exactly_one_wins(
    runtime: Runtime, agentbox_home: Path, volume: str
) -> None:
    def create(_: int) -> Sandbox | AgentboxError:
        try:
            return _with(volume, agentbox_home)
        except VolumeInUse as e:
            return e

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(create, range(4)))
    winners = [o for o in outcomes if isinstance(o, Sandbox)]
    try:
        assert len(winners) == 1, outcomes
        assert all(isinstance(o, VolumeInUse) for o in outcomes if o not in winners)
        assert [m["sandbox"] for m in runtime.volumes.get(volume)["mounts"]] == [winners[0].id]
    finally:
        for sb in winners:
            sb.kill()


def test_a_mount_path_turned_into_a_symlink_is_refused_at_the_next_start(
    runtime: Runtime, agentbox_home: Path, volume: str, host_secret: HostSecret, tier: str
) -> None:
    with _with(volume, agentbox_home, path="/home/user/a/cache", tier=tier) as sb:
        # /home/user/a is no mount point itself: the agent may move it and leave a link.
        r = sb.commands.run(f"mv /home/user/a /home/user/b && ln -s {host_secret.dir} /home/user/a")
        assert r.exit_code == 0, r.stderr
        sb.stop()
        with pytest.raises(InvalidRequest, match="symlink"):
            sb.resume()
    assert sorted(p.name for p in host_secret.dir.iterdir()) == ["secret.txt"]
