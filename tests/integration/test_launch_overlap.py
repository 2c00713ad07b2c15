"""A create starts its launcher before the sandbox's disk and root are mounted
(``nsexec spawn --wait-fd``): the launcher's process starts while the host mounts them,
and it joins the cgroups and goes on only when the host says go. A host that gives up
(its preparation failed, or it died) never sends go: the launcher exits, nothing starts
on a half-made root, and the failed create leaves nothing behind."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

import pytest

from agentbox.config.specs import SandboxSpec
from agentbox.errors import SandboxError
from agentbox.isolation.launcher import nsexec_path
from agentbox.runtime.host import SandboxHost
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.snapshots import Fill
from hostres import host_resources


def _read_to_eof(fd: int, timeout: float = 20.0) -> str:
    """Everything written to the pipe until its last writer closes it (bounded)."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], deadline - time.monotonic())
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            return data.decode(errors="replace")
        data += chunk
    raise AssertionError(f"the launcher's output never ended: {data!r}")


def _spawn_waiting(nsexec: Path, marker: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    """``spawn --wait-fd`` of a program that writes ``marker``; returns the launcher, the
    go pipe's write end and the read end of the launcher's (and program's) output."""
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        launcher = subprocess.Popen(
            [str(nsexec), "spawn", "--wait-fd", str(go_r), "--uid", "0", "--gid", "0",
             "--", "/bin/sh", "-c", f"echo ran > {marker}"],
            stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, pass_fds=(go_r,),
            start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(go_r)
        os.close(out_w)
    return launcher, go_w, out_r


def test_the_launcher_goes_on_only_when_told(agentbox_home: Path, tmp_path: Path) -> None:
    nsexec = nsexec_path(agentbox_home / "lib")
    marker = tmp_path / "ran"
    launcher, go_w, out_r = _spawn_waiting(nsexec, marker)
    try:
        os.write(go_w, b"g")
        os.close(go_w)
        output = _read_to_eof(out_r)
    finally:
        os.close(out_r)
        code = launcher.wait(30)
    assert code == 0  # its parent half detached the program and exited
    assert marker.read_text() == "ran\n", output


@pytest.mark.parametrize("sent", [b"", b"x"], ids=["no-go", "wrong-byte"])
def test_a_launcher_never_told_to_go_starts_nothing(
    agentbox_home: Path, tmp_path: Path, sent: bytes
) -> None:
    nsexec = nsexec_path(agentbox_home / "lib")
    marker = tmp_path / "ran"
    launcher, go_w, out_r = _spawn_waiting(nsexec, marker)
    try:
        if sent:
            os.write(go_w, sent)
        os.close(go_w)  # the host gave up (or died): EOF
        output = _read_to_eof(out_r)
    finally:
        os.close(out_r)
        code = launcher.wait(30)
    assert code == 125 and "gave up on this launch" in output, (code, output)
    assert not marker.exists()


def test_a_failed_preparation_leaves_nothing_behind(runtime: Runtime, agentbox_home: Path) -> None:
    """The launcher already runs while the disk is being filled; a failure there ends it
    and removes every trace (the restore path's ``populate``)."""
    seen: list[SandboxHost] = []

    def populate(host: SandboxHost, disk: Path) -> None:
        seen.append(host)
        raise SandboxError("the snapshot's archive is damaged")

    spec = SandboxSpec.model_validate({"memory": "64MiB", "disk": "32MiB", "network": "none"})
    fill = Fill(spec, runtime.templates.get("default"), populate)
    with pytest.raises(SandboxError, match="damaged"):
        runtime.create_filled(fill)
    (host,) = seen
    assert runtime.store.get(host.id) is None
    assert not host.dir.exists()
    left = host_resources(agentbox_home, [host.id])  # mounts, cgroups, dirs, loop devices
    assert not [item for items in left.values() for item in items if host.id in item], left
