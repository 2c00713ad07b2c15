"""Cluster mode end to end, every part a real process: agents through both gateway
replicas, then a node killed with SIGKILL (and coming back), a replica killed mid-stream,
PostgreSQL restarted. Each scenario prints one line: requests failed, acknowledged work
lost (always asserted 0) and time to recover."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import httpx2
import pytest
from clusterkit import AGENTBOX, LOST_AFTER_S, Cluster, destroy_all, placed, wait_for

from agentbox.client.remote import GatewayClient, RemoteRuntime
from agentbox.errors import AgentboxError, SandboxLost
from fakeproviders import FakeProvider, Reply
from pgkit import PgServer

AGENTS = int(os.environ.get("AGENTBOX_CLUSTER_AGENTS", "50"))
T = TypeVar("T")


@dataclass
class Work:
    """What one agent was told was done: its sandbox, and a file it wrote there."""

    sandbox: str
    path: str
    content: bytes
    gateway: str


def runtime(cluster: Cluster, gateway: str) -> RemoteRuntime:
    return RemoteRuntime(GatewayClient(cluster.gateway_urls[gateway], cluster.token, timeout=120))


def report(scenario: str, failed: int, lost: int, recover_s: float | None = None) -> None:
    recovered = f", recovered in {recover_s:.2f} s" if recover_s is not None else ""
    print(f"\n[cluster] {scenario}: requests failed {failed}, acknowledged work lost {lost}"
          f"{recovered}")  # fmt: skip


def agent(cluster: Cluster, i: int) -> Work:
    """Create, write a file, run a command whose output streams back, read the file."""
    gateway = sorted(cluster.gateways)[i % len(cluster.gateways)]
    rt = runtime(cluster, gateway)
    try:
        record = rt.create({})
        content = f"agent {i} {record.id}\n".encode()
        rt.files(record.id).write(f"/workspace/agent-{i}.txt", content)
        chunks: list[bytes] = []
        result = rt.commands(record.id).run(
            f"cat /workspace/agent-{i}.txt; for n in 1 2 3; do echo line $n; done",
            on_output=lambda _stream, data: chunks.append(data),
        )
        assert result.exit_code == 0 and result.stdout.startswith(content.decode()), result
        assert b"".join(chunks).endswith(b"line 3\n"), chunks  # streamed, not only at the end
        assert rt.files(record.id).read(f"/workspace/agent-{i}.txt") == content
        return Work(record.id, f"/workspace/agent-{i}.txt", content, gateway)
    finally:
        rt.client.close()


def lost_work(cluster: Cluster, done: list[Work], skip: frozenset[str] = frozenset()) -> int:
    """Acknowledged files that no longer read back as written, through the *other*
    replica than the one that wrote them."""
    lost = 0
    for work in done:
        if work.sandbox in skip:
            continue
        other = next(g for g in sorted(cluster.gateways) if g != work.gateway)
        rt = runtime(cluster, other)
        try:
            if rt.files(work.sandbox).read(work.path) != work.content:
                lost += 1
        except AgentboxError:
            lost += 1
        finally:
            rt.client.close()
    return lost


def run_agents(cluster: Cluster, count: int) -> tuple[list[Work], list[BaseException]]:
    done: list[Work] = []
    errors: list[BaseException] = []
    with ThreadPoolExecutor(count) as pool:
        for future in [pool.submit(agent, cluster, i) for i in range(count)]:
            try:
                done.append(future.result())
            except BaseException as e:  # counted and shown, not raised one by one
                errors.append(e)
    return done, errors


def pg_connections(cluster: Cluster) -> int:
    """The cluster's connections to its database now (each process keeps one per thread
    that used it: after a burst, about its peak)."""
    import psycopg

    with psycopg.connect(cluster.state_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) - 1 if row else 0  # less this one


def test_concurrent_agents_through_both_replicas(cluster: Cluster) -> None:
    done, errors = run_agents(cluster, AGENTS)
    lost = lost_work(cluster, done)
    report(f"{AGENTS} concurrent agents", len(errors), lost)
    connections = pg_connections(cluster)
    print(f"[cluster] PostgreSQL connections after {AGENTS} agents: {connections}")
    assert connections < 100  # PostgreSQL's default max_connections (was 129: one per thread)
    assert not errors, errors[:3]
    assert lost == 0
    nodes = placed(cluster)
    assert {nodes[w.sandbox] for w in done} == set(cluster.nodes)  # spread over all three
    destroy_all(cluster, [w.sandbox for w in done])
    with cluster.client("gw-2") as c:  # destroyed means gone, whichever replica is asked
        answer = c.get(f"/v1/sandboxes/{done[0].sandbox}")
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "sandbox_not_found"


def test_nodes_command_lists_the_cluster(cluster: Cluster) -> None:
    gateway = cluster.gateways["gw-1"]
    shown = subprocess.run(
        [AGENTBOX, "cluster", "nodes", "--config", str(cluster.base / "gw-1.yaml"), "--json"],
        capture_output=True, text=True, env=gateway.env, timeout=60, check=True,
    )  # fmt: skip
    rows = json.loads(shown.stdout)
    assert sorted(r["id"] for r in rows) == sorted(cluster.nodes)
    assert all(r["state"] == "ready" and "default" in r["capacity"]["templates"] for r in rows)


def test_fork_lands_on_the_source_node(cluster: Cluster) -> None:
    rt = runtime(cluster, "gw-2")
    source = rt.create({})
    rt.files(source.id).write("/workspace/f.txt", b"forked\n")
    fork = rt.fork(source.id)
    nodes = placed(cluster)
    assert nodes[fork.id] == nodes[source.id]
    assert rt.files(fork.id).read("/workspace/f.txt") == b"forked\n"
    rt.client.close()
    destroy_all(cluster, [source.id, fork.id])


def test_port_forwarding_through_a_replica(cluster: Cluster) -> None:
    """HTTP to a service in the sandbox, through a replica and the sandbox's node."""
    rt = runtime(cluster, "gw-2")
    sandbox = rt.create({}).id
    service = "python3 -m http.server 8000 --bind 127.0.0.1 --directory /workspace"
    rt.files(sandbox).write("/workspace/hello.txt", b"through the cluster\n")
    with cluster.client("gw-2") as c:
        started = c.post(f"/v1/sandboxes/{sandbox}/processes", json={"command": service})
        assert started.status_code == 201, started.text

        def served() -> httpx2.Response | None:
            answer = c.get(f"/v1/sandboxes/{sandbox}/ports/8000/hello.txt")
            return answer if answer.status_code == 200 else None

        assert wait_for("the sandbox's service", served, timeout=30).text == (
            "through the cluster\n"
        )
    rt.client.close()
    destroy_all(cluster, [sandbox])


def retry(call: Callable[[], T], deadline_s: float = 60.0) -> tuple[T, int]:
    """``call`` until it answers (state_unavailable and the like are retried): its
    result and how many attempts failed."""
    failed = 0
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return call(), failed
        except AgentboxError as e:  # state_unavailable, node_unreachable, no connection
            failed += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"still failing after {deadline_s} s: {e}") from e
            time.sleep(0.1)


def test_node_killed_then_back(cluster: Cluster) -> None:
    done, errors = run_agents(cluster, 9)
    assert not errors, errors[:3]
    nodes = placed(cluster)
    victim = "node-3"
    on_victim = {w.sandbox for w in done if nodes[w.sandbox] == victim}
    assert on_victim  # placement spread them; three nodes, nine sandboxes
    # The control for the status read after its return: it lists what the node runs.
    with httpx2.Client(verify=cluster.node_context("gw-1"), timeout=30) as c:
        before = c.get(cluster.node_urls[victim] + "/node/v1/status").json()
    assert on_victim <= set(before["sandboxes"]), before
    killed = time.monotonic()
    cluster.nodes[victim].kill9()

    # Creates keep working at once: a refused connection sends the create to another node.
    creates, failed_creates = [], 0
    for i in range(3):
        try:
            creates.append(agent(cluster, 100 + i))
        except AgentboxError:
            failed_creates += 1
    assert all(placed(cluster)[w.sandbox] != victim for w in creates)

    rt = runtime(cluster, "gw-1")
    lost_sandbox = sorted(on_victim)[0]

    def lost_answer() -> SandboxLost | None:
        try:
            rt.files(lost_sandbox).read("/workspace/x")
        except SandboxLost as e:
            return e
        except AgentboxError:
            return None
        return None

    error = wait_for("sandbox_lost", lost_answer, timeout=LOST_AFTER_S * 10)
    detected = time.monotonic() - killed
    assert error.details["node"] == victim and "restore" in error.message
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "fs_read", "arguments": {"sandbox_id": lost_sandbox,
                                                        "path": "/workspace"}}}  # fmt: skip
    with cluster.client("gw-2") as c:  # an MCP client hears it as a tool error it can read
        answer = c.post("/mcp", json=call, headers={"Accept": "application/json"}).json()
    assert answer["id"] == 7 and answer["result"]["isError"], answer
    assert "sandbox_lost" in answer["result"]["content"][0]["text"]
    assert cluster.node_state(victim) == "unreachable"
    lost = lost_work(cluster, done + creates, skip=frozenset(on_victim))
    report(f"kill -9 of {victim}", failed_creates, lost, detected)
    assert lost == 0 and failed_creates == 0

    # It comes back: what the cluster declared lost is destroyed there, never served again.
    cluster.start_node(victim)
    with httpx2.Client(verify=cluster.node_context("gw-1"), timeout=30) as c:
        status = c.get(cluster.node_urls[victim] + "/node/v1/status").json()
    assert not on_victim & set(status["sandboxes"])
    with pytest.raises(SandboxLost):
        rt.files(lost_sandbox).read(done[0].path)
    rt.client.close()
    destroy_all(cluster, [w.sandbox for w in done + creates if w.sandbox not in on_victim])


def test_replica_killed_mid_stream(cluster: Cluster) -> None:
    done, errors = run_agents(cluster, 4)
    assert not errors
    work = next(w for w in done if w.gateway == "gw-2")
    rt = runtime(cluster, "gw-2")
    first = threading.Event()

    def on_output(_stream: str, _data: bytes) -> None:
        if not first.is_set():
            first.set()
            cluster.gateways["gw-2"].kill9()

    killed = None
    with pytest.raises(AgentboxError):
        rt.commands(work.sandbox).run(
            "for n in $(seq 1 100); do echo tick $n; sleep 0.05; done", on_output=on_output
        )
    killed = time.monotonic()
    # The client retries on the other replica: same sandbox, same files.
    other = runtime(cluster, "gw-1")
    result, failed = retry(lambda: other.commands(work.sandbox).run("cat " + work.path))
    recovered = time.monotonic() - killed
    assert result.stdout.encode() == work.content
    cluster.start_gateway("gw-2")
    lost = lost_work(cluster, done)
    report("kill -9 of replica gw-2 mid-stream", failed, lost, recovered)
    assert lost == 0
    other.client.close()
    rt.client.close()
    destroy_all(cluster, [w.sandbox for w in done])


def test_postgres_restart(cluster: Cluster, postgres: PgServer) -> None:
    done, errors = run_agents(cluster, 4)
    assert not errors
    restarted = time.monotonic()
    postgres.restart()
    failed_total = 0
    for gateway in sorted(cluster.gateways):  # each replica reconnects by itself
        rt = runtime(cluster, gateway)
        _, failed = retry(lambda rt=rt: rt.create({}))
        failed_total += failed
        rt.client.close()
    recovered = time.monotonic() - restarted

    def nodes_beat() -> bool:  # each node reconnected too: fresh heartbeats, none lost
        rows = cluster.nodes_table()
        return all(r["state"] == "ready" and r["heartbeat_age_s"] < 2 for r in rows)

    wait_for("heartbeats after the restart", nodes_beat, timeout=LOST_AFTER_S * 10)
    lost = lost_work(cluster, done)
    report("PostgreSQL restart", failed_total, lost, recovered)
    assert lost == 0
    assert all(r["state"] == "ready" for r in cluster.nodes_table())
    destroy_all(cluster, list(placed(cluster)))


def act(tool: str, **arguments: object) -> Reply:
    return Reply(text=json.dumps({"tool": tool, "arguments": arguments}))


def finish(summary: str) -> Reply:
    return Reply(text=json.dumps({"finish": summary}))


def test_a_task_on_a_killed_node_resumes_on_another(
    cluster: Cluster, cluster_model: FakeProvider, postgres: PgServer
) -> None:
    """Its lease runs out; another node's worker takes it, in a new sandbox (the old one
    died with its node), from the step after its last completed one. The nodes' task
    workers have been through a PostgreSQL restart first: they carry on polling."""
    postgres.restart()
    cluster_model.script(
        act("terminal_run", command="echo step"),
        act("terminal_run", command="sleep 30"),  # its node dies during this one
        act("terminal_run", command="echo again"),  # step 2 again, on the other node
        finish("done"),
    )
    asked = len(cluster_model.requests)
    with cluster.client("gw-1") as op:
        task_id = op.post("/v1/tasks", json={"goal": "survive"}).raise_for_status().json()["id"]
        wait_for("step 2 asked", lambda: len(cluster_model.requests) >= asked + 2)
        first = op.get(f"/v1/tasks/{task_id}").json()
        victim = placed(cluster)[first["sandbox"]]
        killed = time.monotonic()
        cluster.nodes[victim].kill9()

        def ended() -> dict[str, object] | None:
            task = op.get(f"/v1/tasks/{task_id}").json()
            return task if task["state"] in ("succeeded", "failed") else None

        task = wait_for("the task's end", ended, timeout=120)
        recovered = time.monotonic() - killed
        steps = op.get(f"/v1/tasks/{task_id}/steps").json()
    report(f"task on killed {victim}", 0 if task["state"] == "succeeded" else 1, 0, recovered)
    assert task["state"] == "succeeded", task
    # Step 1 completed on the dead node and ran once; step 2 (cut by the kill) was asked
    # again and ran on the other node; step 3 is the finish.
    assert [s["n"] for s in steps] == [1, 2, 3]
    outputs = [s["result"].get("stdout") for s in steps[:2]]
    assert outputs == ["step\n", "again\n"] and steps[2]["action"] == {"finish": "done"}, steps
    assert task["sandbox"] != first["sandbox"]
    cluster.start_node(victim)
