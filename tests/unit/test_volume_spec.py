"""The ``volumes`` entries of a sandbox spec: names, paths and modes refused before
anything is made, in the SDK's, the CLI's and the REST body's spellings alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentbox.client.sandbox import _volumes
from agentbox.config.settings import parse_settings
from agentbox.errors import InvalidConfig, InvalidRequest, VolumeNotFound
from agentbox.runtime.spec_input import spec_from
from agentbox.runtime.store import Store
from agentbox.volumes.service import Volumes
from agentbox.volumes.spec import VolumeMount


def test_the_cli_spelling() -> None:
    assert VolumeMount.parse("pip-cache:/home/user/.cache/pip") == VolumeMount(
        name="pip-cache", path="/home/user/.cache/pip", mode="rw"
    )
    assert VolumeMount.parse("npm:/home/user/.npm:ro").mode == "ro"
    for bad in ("pip-cache", "pip-cache:", ":/x", "pip:/x:rx", "pip:/x:ro:more"):
        with pytest.raises(ValueError):
            VolumeMount.parse(bad)


@pytest.mark.parametrize(
    "path",
    ["relative", "/", "/home/user/", "/home//user", "/home/user/../../etc", "/./x",
     "/proc", "/proc/sys", "/dev/shm", "/sys/x", "/usr/local/x", "/bin/x", "/lib64/x",
     "/tmp", "/tmp/cache", "/var/tmp/x", "/workspace", "/workspace/.cache",
     "/.agentbox/init", "/etc/agentbox", "/etc/agentbox/ca.pem", "/x\0y"],
)  # fmt: skip
def test_paths_the_sandbox_owns_or_not_canonical_are_refused(path: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        spec_from({"volumes": [{"name": "cache", "path": path}]})
    assert caught.value.details["field"].startswith("volumes.0")


@pytest.mark.parametrize("name", ["", "Cache", "a b", "-x", "../x", "x/y", "a" * 64, "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidRequest):
        spec_from({"volumes": [{"name": name, "path": "/home/user/c"}]})


def test_one_entry_per_volume_and_path_and_no_nesting() -> None:
    for volumes in (
        [{"name": "a", "path": "/home/user/x"}, {"name": "a", "path": "/home/user/y"}],
        [{"name": "a", "path": "/home/user/x"}, {"name": "b", "path": "/home/user/x"}],
        [{"name": "a", "path": "/home/user/x"}, {"name": "b", "path": "/home/user/x/y"}],
        [{"name": f"v{i}", "path": f"/home/user/{i}"} for i in range(7)],  # 6 at most
    ):
        with pytest.raises(InvalidRequest):
            spec_from({"volumes": volumes})
    ok = spec_from({"volumes": [{"name": "a", "path": "/home/user/x"},
                                {"name": "b", "path": "/home/user/xy", "mode": "ro"}]})  # fmt: skip
    assert [v.mode for v in ok.volumes] == ["rw", "ro"]


def test_the_sdk_checks_before_any_backend() -> None:
    assert _volumes(["c:/home/user/c:ro", {"name": "d", "path": "/opt/d"}]) == [
        {"name": "c", "path": "/home/user/c", "mode": "ro", "if_busy": "fail"},
        {"name": "d", "path": "/opt/d", "mode": "rw", "if_busy": "fail"},
    ]
    with pytest.raises(InvalidRequest, match=r"volumes\.1"):
        _volumes(["c:/home/user/c", "d:/proc/x"])


def test_the_config_sections() -> None:
    s = parse_settings(
        "volumes: {dir: /mnt/data/v, capacity: 2GiB}\n"
        "sandbox:\n  volumes:\n"
        '    "*": [{name: pip-cache, path: /home/user/.cache/pip, size: 1GiB}]\n'
        "    ci: [{name: npm, path: /home/user/.npm, mode: ro, if_busy: fail}]\n"
    )
    assert (s.volumes.dir, s.volumes.capacity) == ("/mnt/data/v", 2 * 1024**3)
    default = s.sandbox.volumes["*"][0]
    assert (default.size, default.if_busy, default.mode) == (1024**3, "skip", "rw")
    assert s.sandbox.volumes["ci"][0].model_dump(exclude={"size"}) == {
        "name": "npm", "path": "/home/user/.npm", "mode": "ro", "if_busy": "fail"
    }  # fmt: skip
    for bad in ('sandbox: {volumes: {"*": [{name: x, path: /proc/x}]}}',
                'sandbox: {volumes: {"*": [{name: x, path: /h, sizes: 1GiB}]}}',
                "volumes: {capacity: lots}"):  # fmt: skip
        with pytest.raises(InvalidConfig):
            parse_settings(bad)


def test_names_that_could_be_paths_never_reach_the_filesystem(tmp_path: Path) -> None:
    Store(tmp_path / "state.db")  # the sandboxes table the volume store joins on
    volumes = Volumes(tmp_path, tmp_path / "images")
    for name in ("../../x", "a/b", "..", "", "A"):
        for call in (volumes.get, volumes.remove):
            with pytest.raises(VolumeNotFound):
                call(name)
        with pytest.raises(InvalidRequest):
            volumes.create(name, "16MiB")
    assert sorted(p.name for p in tmp_path.rglob("*") if "lock" in p.name) == []
