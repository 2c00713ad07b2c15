"""The CLI's light exec path (``runtime.quick_exec``) tells a sandbox's commands where the
egress proxy is from ``network.sandbox_env`` alone; the network plane places the proxy by
its own address plan: the two must agree for every home on the host."""

from __future__ import annotations

from agentbox.network import plane, sandbox_env


def test_proxy_address_of_every_home_is_the_planes() -> None:
    for index in range(plane.MAX_HOMES):
        net = plane.HomeNet(index)
        assert sandbox_env.proxy_address(index) == net.proxy_address
        assert sandbox_env.proxy_env(sandbox_env.proxy_address(index)) == net.proxy_env()
    assert plane.EXPLICIT_PORT == sandbox_env.EXPLICIT_PORT
