"""A test's sandbox on one isolation tier (the fixtures that run a contract on both tiers
use it: tests/conftest.py, tests/security/conftest.py and single modules)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.runtime.runtime import Runtime


@contextlib.contextmanager
def sandbox_on(
    runtime: Runtime, home: Path, tier: str = "namespaces", disk: str = "256MiB"
) -> Iterator[Sandbox]:
    """A sandbox on isolation ``tier``, destroyed afterwards unless the test did."""
    sb = Sandbox.create(memory="256MiB", disk=disk, pids=256, isolation=tier, home=home)
    try:
        yield sb
    finally:
        if runtime.store.get(sb.id) is not None:
            sb.kill()


def not_on_gvisor(tier: str, reason: str) -> None:
    """Skip on the gvisor tier, saying why it does not hold there (a skip, never a pass;
    keep these few, each with its reason)."""
    if tier == "gvisor":
        pytest.skip(f"does not hold on the gvisor tier: {reason}")
