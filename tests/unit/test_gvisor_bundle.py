"""The OCI spec and exec process the gVisor tier hands runsc (isolation/gvisor.py)."""

from __future__ import annotations

from pathlib import Path

from agentbox.isolation import gvisor


def _config(netns: Path | None) -> dict[str, object]:
    return gvisor.bundle_config(
        root=Path("/r"), args=["/.agentbox/init", "init", "1", "60"], env={"A": "b"},
        uid=2000001, gid=2000001, hostname="sb-x", netns=netns, tmp=Path("/d/tmp"),
        cgroups_path="/agentbox/sb-x", memory_bytes=1 << 30, pids=100, cpus=1.5,
    )  # fmt: skip


def test_the_first_process_is_unprivileged() -> None:
    process = _config(None)["process"]
    assert isinstance(process, dict)
    assert process["user"] == {"uid": 2000001, "gid": 2000001}
    assert process["noNewPrivileges"] is True
    assert all(caps == [] for caps in process["capabilities"].values())
    assert process["env"] == ["A=b"]


def test_limits_name_the_sandboxs_own_cgroups() -> None:
    linux = _config(None)["linux"]
    assert isinstance(linux, dict)
    assert linux["cgroupsPath"] == "/agentbox/sb-x"
    resources = linux["resources"]
    assert resources["memory"] == {"limit": 1 << 30, "swap": 1 << 30}
    assert resources["pids"] == {"limit": 100}
    assert resources["cpu"] == {"quota": 150_000, "period": 100_000}


def test_the_network_namespace_is_the_planes_or_a_new_one() -> None:
    def network(config: dict[str, object]) -> dict[str, str]:
        linux = config["linux"]
        assert isinstance(linux, dict)
        return next(n for n in linux["namespaces"] if n["type"] == "network")

    assert network(_config(Path("/h/netns"))) == {"type": "network", "path": "/h/netns"}
    assert network(_config(None)) == {"type": "network"}


def test_tmp_is_the_disks_not_a_runsc_tmpfs() -> None:
    mounts = _config(None)["mounts"]
    assert isinstance(mounts, list)
    tmp = next(m for m in mounts if m["destination"] == "/tmp")
    assert tmp["type"] == "bind" and tmp["source"] == "/d/tmp"


def test_every_command_runs_in_its_own_pid_namespace_without_capabilities_left() -> None:
    process = gvisor.exec_process(args=["sh", "-c", "x"], env={}, cwd="/workspace",
                                  uid=2000001, gid=2000001)  # fmt: skip
    assert process["args"] == ["/.agentbox/agent", "exec", "sh", "-c", "x"]
    # the wrapper's (a PID namespace; emptying the command's bounding set), not the
    # command's: gvisor_agent.c drops every set before the exec
    assert process["capabilities"]["permitted"] == ["CAP_SYS_ADMIN", "CAP_SETPCAP"]
    assert "ambient" not in process["capabilities"]
    assert process["noNewPrivileges"] is True


def test_the_newest_runsc_wins() -> None:
    old = gvisor.Runsc("/usr/bin/runsc", "0.0~20221219.0", "ptrace")
    new = gvisor.Runsc("/usr/local/bin/runsc", "release-20240807.0", "systrap")
    assert max((old, new), key=lambda r: r.release) is new
