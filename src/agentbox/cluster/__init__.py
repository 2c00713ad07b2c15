"""Cluster mode (docs/cluster.md): nodes run sandboxes, gateway replicas route to them,
PostgreSQL holds what they share.

    pki.py           the cluster CA and certificates; both ends' TLS contexts
    registry.py      the nodes and cluster_sandboxes tables
    placement.py     which node a create goes to (pure)
    node_runtime.py  a node's Runtime: its sandboxes' registry rows
    heartbeat.py     a node's heartbeat and reconcile
    node_api.py      `agentbox node`: the node's app (mutual TLS)
    node_client.py   a gateway's mutual-TLS pool to the nodes
    gateway_app.py   `agentbox serve` in cluster mode: authenticate, route, stream
"""
