"""Isolation tiers: which host-resource class runs a sandbox (one interface, two
implementations). ``namespaces``: bubblewrap + cgroups + seccomp (``runtime.host``, the
default); ``gvisor``: the same disk and cgroups under runsc (``runtime.gvisor_host``).
The tier is fixed at create and kept in the sandbox's stored spec."""

from __future__ import annotations

from pathlib import Path

from agentbox.isolation.cgroups import Limits
from agentbox.runtime.host import SandboxHost

NAMESPACES, GVISOR = "namespaces", "gvisor"
TIERS = (NAMESPACES, GVISOR)
# The host threads runsc itself needs beside the agent's tasks (the Sentry's Go runtime,
# the Gofer): without them a sandbox with pids=64 ended at a two-process pipeline, its
# Sentry unable to make a thread. Under ptrace each guest task is a host stub thread,
# so the agent's own tasks stay bounded by about ``pids``.
GVISOR_PIDS_HEADROOM = 128


def host_for(home: Path, sandbox_id: str, slot: int, isolation: str) -> SandboxHost:
    if isolation == GVISOR:
        # Imported here: a command on a default-tier sandbox never needs it.
        from agentbox.runtime.gvisor_host import GvisorHost

        return GvisorHost(home, sandbox_id, slot)
    return SandboxHost(home, sandbox_id, slot)


def found_isolation(directory: Path) -> str:
    """The tier of a sandbox directory no record owns (crash recovery): a gVisor one has
    its OCI bundle or runsc state."""
    gvisor = any((directory / name).exists() for name in ("bundle", "runsc", "netns"))
    return GVISOR if gvisor else NAMESPACES


def host_limits(isolation: str, limits: Limits) -> Limits:
    """The limits of the sandbox's host cgroup: on gvisor it holds runsc's own threads
    too (see GVISOR_PIDS_HEADROOM); memory and CPU cover the whole sandbox as they are."""
    if isolation != GVISOR:
        return limits
    return Limits(limits.memory_bytes, limits.pids + GVISOR_PIDS_HEADROOM, limits.cpus)
