"""Which node a new sandbox goes to: a pure function of the nodes' last heartbeats.

Eligible: ready, heard from within ``lost_after`` seconds, and offering the isolation
tier the create asks for (label ``isolation``, a comma list; default ``namespaces``) and
any other labels it requires. Among those, nodes with a warm sandbox the create can claim
come first (``warm``: the create is a transaction on that node, not a launch), then nodes
that already hold the template (no build on the create's path), then the emptiest: fewest
sandboxes (those the heartbeat counted plus those this gateway placed since), then the
most free memory.

A create is steered to a warm pool only when it names nothing fixed at launch
(``FIXED``: limits, disk, network, tier, volumes): then the node fills it in from the
same defaults its pool was made with, so the pool's key matches (``runtime.pool_key``).
The claim itself is the node's one local transaction (``Store.claim``): two creates,
through one replica or two, never get the same warm sandbox; the one that finds the
pool empty is launched on that node as usual.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentbox.cluster.registry import Node
from agentbox.errors import CapacityExceeded

DEFAULT_TIER = "namespaces"
FIXED = frozenset({"isolation", "memory", "pids", "cpus", "disk", "network", "volumes"})


def offers(node: Node, isolation: str | None, labels: Mapping[str, str]) -> bool:
    tiers = {t.strip() for t in node.labels.get("isolation", DEFAULT_TIER).split(",")}
    if (isolation or DEFAULT_TIER) not in tiers:
        return False
    return all(node.labels.get(k) == v for k, v in labels.items())


def warm_counts(
    nodes: list[Node], template: str, request: Mapping[str, object], claimed: Mapping[str, int]
) -> dict[str, int]:
    """Per node, the warm sandboxes of ``template`` its last heartbeat reported, less
    those this gateway has sent creates to claim since; empty for a request that names
    anything ``FIXED`` (it may not match the pool's key)."""
    if FIXED & request.keys():
        return {}
    counts = {}
    for node in nodes:
        pools = node.capacity.get("pools", [])
        ready = sum(int(p.get("ready", 0)) for p in pools if p.get("template") == template)
        if ready > claimed.get(node.id, 0):
            counts[node.id] = ready - claimed.get(node.id, 0)
    return counts


def rank(
    nodes: list[Node],
    *,
    template: str,
    isolation: str | None,
    labels: Mapping[str, str],
    lost_after: float,
    placed: Mapping[str, int],
    warm: Mapping[str, int] | None = None,
) -> list[Node]:
    """Eligible nodes, best first; raises CapacityExceeded when there is none."""
    eligible = [
        n
        for n in nodes
        if n.state == "ready" and n.heartbeat_age < lost_after and offers(n, isolation, labels)
    ]
    if not eligible:
        wanted = f"isolation {isolation or DEFAULT_TIER}" + "".join(
            f", {k}={v}" for k, v in labels.items()
        )
        raise CapacityExceeded(
            f"no ready cluster node offers {wanted}: start a node with those labels "
            "(`agentbox node`), or check `agentbox cluster nodes` for unreachable ones",
            retry_after=5,
        )

    def key(n: Node) -> tuple[int, int, int, int]:
        has_warm = (warm or {}).get(n.id, 0) > 0
        has_template = template in n.capacity.get("templates", [])
        load = int(n.capacity.get("sandboxes", 0)) + placed.get(n.id, 0)
        memory = -int(n.capacity.get("memory_free_bytes", 0))
        return (0 if has_warm else 1, 0 if has_template else 1, load, memory)

    return sorted(eligible, key=key)
