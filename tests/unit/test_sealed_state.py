"""Sealed client state (MCP requestState): round trip, and anything altered is no state."""

from __future__ import annotations

from pathlib import Path

from agentbox.gateway.sealed import load_key, seal, unseal


def test_sealed_state_round_trips_and_refuses_what_it_did_not_make(tmp_path: Path) -> None:
    key = load_key(tmp_path)
    assert (
        load_key(tmp_path) == key and (tmp_path / "gateway-state.key").stat().st_mode & 0o077 == 0
    )
    state = seal(key, {"approval_id": "ap-1"})
    assert unseal(key, state) == {"approval_id": "ap-1"}
    payload, mac = state.split(".")
    forged = seal(b"another gateway's key", {"approval_id": "ap-2"})
    for bad in (
        None, "", "not-sealed", '{"approval_id": "ap-2"}', forged,
        payload + "." + mac[:-2] + ("AA" if mac[-2:] != "AA" else "BB"),
        seal(key, {"approval_id": "ap-1"}).replace(payload[:4], "eyJ4"),
        state + ".x", "@@@.@@@",
    ):  # fmt: skip
        assert unseal(key, bad) is None, bad
