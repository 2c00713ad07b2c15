"""The ``requestState`` of MCP's input-required result (the approval flow, 2026-07-28) is
client-held and untrusted. State that fails verification, in any way it can, is refused
with a JSON-RPC error (SEP-2322: servers MUST reject state that fails integrity checks;
the conformance suite's input-required-result-tampered-state, which needs a fixture tool
the gateway does not have) and runs nothing: appended bytes (the suite's spelling), a
flipped payload or MAC byte, the payload re-encoded to name another approval, empty or
non-state text, state sealed under another key, genuine state of another call, and
state another token was given for the same sandbox and command. The genuine state,
after the operator's approval, runs it, once: replayed, it is refused.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from agentbox.gateway.sealed import load_key, seal, unseal
from gateway_harness import RunningGateway, issue, mcp_client, running_gateway

COMMAND = "rm -rf /workspace/victim"  # the test policy asks an operator about `rm -rf *`
RECHECK = {"approval": types.ElicitResult(action="accept", content={"recheck": True})}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("state"), "60s") as running:
        yield running


@pytest.fixture(scope="module")
def sandbox_id(gw: RunningGateway) -> Iterator[str]:
    with gw.sandbox() as sid:
        yield sid


async def _never_asked(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    raise AssertionError("the test answers the approval's elicitation itself")


def declaring_elicitation(
    gw: RunningGateway, token: str
) -> contextlib.AbstractAsyncContextManager[Client]:
    """A 2026-07-28 client that declares elicitation (so approvals come as input-required
    results with requestState)."""
    return mcp_client(gw, token, elicitation_callback=_never_asked)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _flip(text: str, at: int) -> str:
    return text[:at] + ("A" if text[at] != "A" else "B") + text[at + 1 :]


def _variants(state: str, key: bytes, other_state: str, other_approval: str) -> dict[str, str]:
    payload, mac = state.split(".")
    decoded = unseal(key, state)
    assert decoded is not None
    renamed = json.dumps({**decoded, "approval_id": other_approval}, sort_keys=True)
    return {
        "suffix (the suite's -TAMPERED)": state + "-TAMPERED",
        "payload byte": _flip(payload, 3) + "." + mac,
        "mac byte": payload + "." + _flip(mac, 3),
        "payload names another approval": _b64(renamed.encode()) + "." + mac,
        "mac dropped": payload,
        "empty": "",
        "not state": "approval_id=" + decoded["approval_id"],
        "sealed under another key": seal(secrets.token_bytes(32), decoded),
        "unbound (pre-actor) state": _b64(b'{"approval_id":"x"}') + "." + mac,
        "state of another call": other_state,
    }


def test_unverifiable_request_state_is_refused_and_runs_nothing(
    gw: RunningGateway, sandbox_id: str
) -> None:
    owner, other = issue(gw, sandbox_id), issue(gw, sandbox_id)
    key = load_key(gw.home)

    async def main() -> None:
        async with declaring_elicitation(gw, owner) as c:
            made = await c.call_tool("terminal_run", {"command": "mkdir -p /workspace/victim"})
            assert not made.is_error, made.content
            first = await c.session.call_tool(
                "terminal_run", {"command": COMMAND}, allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult) and first.request_state
            state = first.request_state
            approval = unseal(key, state)
            assert approval is not None
            # A second pending approval, for a state that names it (re-encoded or re-sealed).
            second = await c.session.call_tool(
                "terminal_run", {"command": "rm -rf /workspace/other"}, allow_input_required=True
            )
            assert isinstance(second, types.InputRequiredResult)
            other_approval = unseal(key, second.request_state or "")
            assert other_approval is not None
        with gw.operator() as op:  # approved: a state the gateway accepted would now run
            op.post(f"/v1/approvals/{approval['approval_id']}/approve").raise_for_status()
            op.post(f"/v1/approvals/{other_approval['approval_id']}/approve").raise_for_status()

        async def refused(token: str, bad: str) -> MCPError:
            async with declaring_elicitation(gw, token) as c:
                with pytest.raises(MCPError) as e:
                    await c.session.call_tool(
                        "terminal_run", {"command": COMMAND},
                        input_responses=RECHECK, request_state=bad, allow_input_required=True,
                    )  # fmt: skip
                return e.value

        other_state = second.request_state or ""
        for name, bad in _variants(state, key, other_state, other_approval["approval_id"]).items():
            error = await refused(owner, bad)
            assert error.code == -32602, (name, error)
            assert error.error.data["code"] == "invalid_request", (name, error.error)
            assert "requestState" in error.error.message, (name, error.error)
        # The genuine state, from a token it was not given (same sandbox, same command).
        error = await refused(other, state)
        assert error.code == -32602 and "another token" in error.error.message, error.error

        async with declaring_elicitation(gw, owner) as c:
            still = await c.call_tool("fs_stat", {"path": "/workspace/victim"})
            assert not still.is_error, "a refused state ran the command"
            ran = await c.session.call_tool(
                "terminal_run", {"command": COMMAND},
                input_responses=RECHECK, request_state=state, allow_input_required=True,
            )  # fmt: skip
            assert isinstance(ran, types.CallToolResult) and not ran.is_error, ran
            gone = await c.call_tool("fs_stat", {"path": "/workspace/victim"})
            assert gone.is_error and "file_not_found" in gone.content[0].text, gone.content
            # An approval runs its call once: the same genuine state replayed (the victim
            # made again) is refused and the command does not run a second time.
            remade = await c.call_tool("terminal_run", {"command": "mkdir -p /workspace/victim"})
            assert not remade.is_error, remade.content
            again = await c.session.call_tool(
                "terminal_run", {"command": COMMAND},
                input_responses=RECHECK, request_state=state, allow_input_required=True,
            )  # fmt: skip
            assert isinstance(again, types.CallToolResult) and again.is_error, again
            assert "used already" in again.content[0].text, again.content
            kept = await c.call_tool("fs_stat", {"path": "/workspace/victim"})
            assert not kept.is_error, "a replayed approval ran the command again"

    anyio.run(main)
