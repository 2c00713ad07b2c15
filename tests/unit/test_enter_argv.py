"""``runtime.enter_argv`` repeats two small facts of the network plane so the CLI's light
exec path need not import it: they must stay equal."""

from __future__ import annotations

from agentbox.network import plane
from agentbox.runtime import enter_argv


def test_proxy_and_trust_variables_match_the_network_plane() -> None:
    for index in range(plane.MAX_HOMES):
        assert enter_argv.proxy_env(index) == plane.HomeNet(index).proxy_env()
    assert enter_argv.ca_env() == plane.ca_env()
    assert enter_argv.SANDBOX_CA_BUNDLE == plane.SANDBOX_CA_BUNDLE
    assert enter_argv.EXPLICIT_PORT == plane.EXPLICIT_PORT
