"""Shared fixtures: a real runtime on a throwaway AGENTBOX_HOME, and real sandboxes.

Nothing here skips: when the host lacks what a test needs, the test fails and says what
is missing (run `agentbox doctor`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox, endpoint
from agentbox.errors import HostUnsupported
from agentbox.runtime import template_tiers
from agentbox.runtime.host import release_home_mounts
from agentbox.runtime.runtime import Runtime
from tierkit import sandbox_on

# The suite's SDK and CLI calls drive the runtime in-process, as written, even while a
# test's `agentbox serve` serves the home (their processes inherit this); the tests of
# the home's gateway being found (test_gateway_socket.py) unset it.
os.environ["AGENTBOX_URL"] = endpoint.IN_PROCESS

pytest_plugins = [
    "s3kit",
    "pgkit",
]  # moto S3 (moto_endpoint, s3_env, bucket); PostgreSQL (postgres, state)


@pytest.fixture(scope="session")
def agentbox_home() -> Iterator[Path]:
    configured = os.environ.get("AGENTBOX_HOME")
    if configured:
        yield Path(configured)
        return
    with tempfile.TemporaryDirectory(prefix="agentbox-test-", dir="/var/tmp") as tmp:
        os.environ["AGENTBOX_HOME"] = tmp
        yield Path(tmp)
        destroy_leftovers(Path(tmp))  # a failed test may have left a sandbox behind
        release_home_mounts(Path(tmp))  # the disk pool's mount, before the files go


def destroy_leftovers(home: Path) -> None:
    """Destroy every sandbox still recorded in ``home`` (best effort, at session end)."""
    try:
        runtime = Runtime(home)
    except HostUnsupported:  # e.g. a home no sandbox could use (a template store's): none
        return
    for record in runtime.store.list():
        try:
            runtime.destroy(record.id)
        except Exception as e:  # keep going: the rest must go too
            print(f"could not destroy leftover sandbox {record.id}: {e}")


@pytest.fixture(scope="session", autouse=True)
def _release_disk_pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Homes made under pytest's tmp dirs mount a disk pool on their first sandbox; take
    them down at the end (pytest then removes the directories)."""
    yield
    base = str(tmp_path_factory.getbasetemp())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mountpoint = line.split()[4]
        if mountpoint.startswith(base) and mountpoint.endswith("/disks"):
            destroy_leftovers(Path(mountpoint).parent)
            release_home_mounts(Path(mountpoint).parent)


@pytest.fixture(scope="session")
def host_ready(agentbox_home: Path) -> None:
    """Fail (never skip) with the doctor's findings when the host cannot run sandboxes."""
    from agentbox.isolation.hostcheck import run_checks

    missing = [c for c in run_checks() if c.required and not c.ok]
    if missing:
        pytest.fail(
            "this host cannot run sandboxes: "
            + "; ".join(f"{c.name}: {c.detail} (fix: {c.fix})" for c in missing)
        )


@pytest.fixture(scope="session")
def runtime(agentbox_home: Path, host_ready: None) -> Runtime:
    return Runtime(agentbox_home)


@pytest.fixture(params=("namespaces", "gvisor"))
def tiered_sandbox(
    request: pytest.FixtureRequest, runtime: Runtime, agentbox_home: Path
) -> Iterator[Sandbox]:
    """``sandbox`` on each isolation tier: a module runs its contract on both by asking
    for this one as its ``sandbox``."""
    with sandbox_on(runtime, agentbox_home, request.param) as sb:
        yield sb


@pytest.fixture(scope="module", params=template_tiers.TIERS)
def default_tier(request: pytest.FixtureRequest, agentbox_home: Path) -> Iterator[str]:
    """While it is set up, every sandbox made from template ``default`` without an
    isolation of its own runs on this tier, whoever creates it (SDK, REST, MCP, the CLI,
    a gateway in another process): a module runs on both tiers with
    ``pytestmark = pytest.mark.usefixtures("default_tier")``. Module-scoped, so a module's
    tests run tier by tier; a module-scoped fixture that creates a sandbox must ask for
    it (to be made after it, once per tier)."""
    template_tiers.set_default_tier(agentbox_home, "default", request.param)
    try:
        yield request.param
    finally:
        template_tiers.set_default_tier(agentbox_home, "default", None)


@pytest.fixture
def sandbox(runtime: Runtime, agentbox_home: Path) -> Iterator[Sandbox]:
    with sandbox_on(runtime, agentbox_home) as sb:
        yield sb
