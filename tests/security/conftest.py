"""Fixtures of the security suite: a sandbox shared by read-only probes, and host secrets.

Probes that only *observe* (syscall denials, what is visible) share one sandbox per
module to keep the suite fast; attacks that change state (fills, bombs, races) get their
own sandbox with the limits they need.

Isolation tiers: a module that takes the ``tier`` fixture (or ``tier_sandbox``) runs
every test once per tier (docs/design.md, "What each tier stops"). The classes that run
on both: files and symlinks (test_file_api_escapes), /proc and host facts
(test_host_isolation), fds (test_fd_leaks), network (test_network_egress), other
sandboxes (test_cross_sandbox), named volumes (test_volume_confinement), syscall denials
(test_syscall_denials), confinement (test_confinement), resource limits
(test_resource_limits); the gVisor-only ones, a fork bomb included, are in
test_gvisor_kernel. A test
that cannot apply to a tier says why with ``secprobe.not_on(tier, ...)`` (a skip, never a pass).
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from secprobe import HostSecret

from agentbox import Sandbox
from agentbox.runtime.runtime import Runtime
from tierkit import sandbox_on


@pytest.fixture(scope="module")
def shared_sandbox(runtime: Runtime, agentbox_home: Path) -> Iterator[Sandbox]:
    sb = Sandbox.create(memory="256MiB", disk="128MiB", pids=256, home=agentbox_home)
    try:
        yield sb
    finally:
        if runtime.store.get(sb.id) is not None:
            sb.kill()


TIERS = ("namespaces", "gvisor")


@pytest.fixture(scope="module", params=TIERS)
def tier(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def tier_sandbox(tier: str, runtime: Runtime, agentbox_home: Path) -> Iterator[Sandbox]:
    """``shared_sandbox`` on each isolation tier."""
    with sandbox_on(runtime, agentbox_home, tier, disk="128MiB") as sb:
        yield sb


@pytest.fixture
def host_secret() -> Iterator[HostSecret]:
    name = "agentbox-secret-" + secrets.token_hex(6)
    secret = HostSecret(
        value="S3CR3T-" + secrets.token_hex(16),
        name=name,
        dir=Path("/var/tmp") / name,
        file=Path("/var/tmp") / name / "secret.txt",
        tmp_file=Path("/tmp") / f"{name}.txt",
        root_file=Path("/root") / f"{name}.txt",
    )
    secret.dir.mkdir(mode=0o755)
    secret.dir.chmod(0o755)
    try:
        for path in secret.files:
            path.write_text(secret.value + "\n")
            path.chmod(0o644)
        yield secret
    finally:
        shutil.rmtree(secret.dir, ignore_errors=True)
        secret.tmp_file.unlink(missing_ok=True)
        secret.root_file.unlink(missing_ok=True)
