"""Which node a new sandbox goes to: a pure function of the nodes' last heartbeats.

Eligible: ready, heard from within ``lost_after`` seconds, and offering the isolation
tier the create asks for (label ``isolation``, a comma list; default ``namespaces``) and
any other labels it requires. Among those, nodes that already hold the template come
first (no build on the create's path), then the emptiest: fewest sandboxes (those the
heartbeat counted plus those this gateway placed since), then the most free memory.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentbox.cluster.registry import Node
from agentbox.errors import CapacityExceeded

DEFAULT_TIER = "namespaces"


def offers(node: Node, isolation: str | None, labels: Mapping[str, str]) -> bool:
    tiers = {t.strip() for t in node.labels.get("isolation", DEFAULT_TIER).split(",")}
    if (isolation or DEFAULT_TIER) not in tiers:
        return False
    return all(node.labels.get(k) == v for k, v in labels.items())


def rank(
    nodes: list[Node],
    *,
    template: str,
    isolation: str | None,
    labels: Mapping[str, str],
    lost_after: float,
    placed: Mapping[str, int],
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

    def key(n: Node) -> tuple[int, int, int]:
        has_template = template in n.capacity.get("templates", [])
        load = int(n.capacity.get("sandboxes", 0)) + placed.get(n.id, 0)
        return (0 if has_template else 1, load, -int(n.capacity.get("memory_free_bytes", 0)))

    return sorted(eligible, key=key)
