"""Cluster-wide reads through a replica: GET /v1/audit and GET /v1/events without a
sandbox ask every ready node and merge (each record names its chain, each event its
node; the merged stream's ids are a cursor over all nodes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from clusterkit import Cluster


@pytest.fixture
def spread(cluster: Cluster) -> Iterator[dict[str, str]]:
    """Sandboxes on at least two nodes: {sandbox: node}."""
    made: dict[str, str] = {}
    with cluster.client("gw-1") as c:
        try:
            for _ in range(4):
                created = c.post("/v1/sandboxes", json={})
                assert created.status_code == 201, created.text
                sandbox = created.json()["id"]
                rows = {r["id"]: r["node"] for r in c.get("/v1/sandboxes").json()}
                made[sandbox] = rows[sandbox]
                if len(set(made.values())) >= 2:
                    break
            assert len(set(made.values())) >= 2, made
            yield made
        finally:
            for sandbox in made:
                c.delete(f"/v1/sandboxes/{sandbox}")


def sse(text: str) -> list[dict[str, Any]]:
    frames = []
    for frame in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        if "data" in fields:
            frames.append({**json.loads(fields["data"]), "cursor": fields.get("id")})
    return frames


def test_audit_answers_for_every_node(cluster: Cluster, spread: dict[str, str]) -> None:
    with cluster.client("gw-2") as c:
        answer = c.get("/v1/audit", params={"decision": "sandbox_created", "limit": 1000})
        assert answer.status_code == 200, answer.text
        records = answer.json()
        seen = {r["sandbox"]: r["chain"] for r in records if r["sandbox"] in spread}
        assert seen == {s: f"node:{n}" for s, n in spread.items()}
        times = [r["ts"] for r in records]
        assert times == sorted(times)
        # One chain's seqs need its node; with it, only that node answers.
        refused = c.get("/v1/audit", params={"since_seq": 0})
        assert refused.status_code == 400 and "node=ID" in refused.text
        node = next(iter(spread.values()))
        one = c.get("/v1/audit", params={"node": node, "since_seq": 0, "limit": 1000}).json()
        mine = {s for s, n in spread.items() if n == node}
        assert mine <= {r["sandbox"] for r in one}
        assert not ({r["sandbox"] for r in one} & (spread.keys() - mine))


def test_events_merge_every_node(cluster: Cluster, spread: dict[str, str]) -> None:
    start = ",".join(f"{n}=0" for n in sorted(cluster.nodes))
    with cluster.client("gw-2") as c:
        replay = c.get("/v1/events", params={"follow": "false", "after": start})
        assert replay.status_code == 200, replay.text
        events = [e for e in sse(replay.text) if e["sandbox"] in spread]
        created = {e["sandbox"]: e["node"] for e in events if e["type"] == "created"}
        assert created == spread
        # The last id is a cursor over all nodes: resuming from it replays nothing old.
        last = sse(replay.text)[-1]["cursor"]
        assert set(dict(p.split("=") for p in last.split(","))) >= set(spread.values())
        again = c.get("/v1/events", params={"follow": "false"}, headers={"Last-Event-ID": last})
        assert not [e for e in sse(again.text) if e["sandbox"] in spread and e["type"] == "created"]
        # A node's plain event id means nothing cluster-wide: refused, saying what works.
        plain = c.get("/v1/events", params={"follow": "false", "after": "3"})
        assert plain.status_code == 400 and "NODE=ID" in plain.text
