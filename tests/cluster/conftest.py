"""One cluster for the whole directory (three nodes, two gateway replicas, PostgreSQL),
started on first use: the scenarios run one after another on it, and each that breaks
a part (kills a node or a replica, restarts PostgreSQL) brings it back before it ends."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterkit import Cluster, running_cluster

from fakeproviders import FakeProvider
from pgkit import PgServer

# Every node's task workers share the queue; a scripted model (real wire protocol on
# loopback) drives the tasks.
TASKS_YAML = """
providers:
  - name: scripted
    kind: openai
    base_url: {base_url}
    api_key_env: FAKE_KEY
    models: [fake-model]
tasks: {{workers: 1, lease_seconds: 2}}
e2b:
  api_keys:
    - {{name: team-a, project: alpha, key_env: E2B_TEST_KEY_A}}
"""
E2B_KEY = "ka-" + secrets.token_hex(16)  # the E2B front door through a replica


@pytest.fixture(scope="session")
def cluster_model() -> Iterator[FakeProvider]:
    with FakeProvider("openai") as fake:
        yield fake


@pytest.fixture(scope="session")
def cluster(
    postgres: PgServer, agentbox_home: Path, host_ready: None, cluster_model: FakeProvider
) -> Iterator[Cluster]:
    agentbox_home.chmod(0o711)  # as a Runtime makes its home: node homes live under it
    base = agentbox_home / f"cluster-{secrets.token_hex(4)}"
    base.mkdir(parents=True)
    extra = TASKS_YAML.format(base_url=cluster_model.base_url)
    with running_cluster(
        postgres.new_database(), base, nodes=3, gateways=2, extra_yaml=extra,
        env={"FAKE_KEY": "k", "E2B_TEST_KEY_A": E2B_KEY},
    ) as running:  # fmt: skip
        yield running
    # The node homes' sandboxes and mounts are gone (running_cluster); never cross a mount.
    subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)
