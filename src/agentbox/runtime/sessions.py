"""Persistent shell sessions: cwd and exported environment carry over between calls.

Each call is a fresh ``bash`` launched like any command (so its exit status comes from
waitpid, and it gets the sandbox's full confinement). The session's state — ``export -p``
and the working directory — is saved by the shell after the command, into a file inside
the sandbox, and restored before the next one. The state is the agent's own, so keeping
it where the agent can edit it gives it no power it did not have.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping

from agentbox.errors import InvalidRequest, SessionNotFound
from agentbox.fsutil import exec_text
from agentbox.hints import Hint
from agentbox.runtime.commands import CommandRunner
from agentbox.runtime.output import CommandResult, OutputSaver
from agentbox.runtime.requests import RunRequest
from agentbox.runtime.requests_extra import SessionRunRequest

STATE_DIR = "/tmp/.agentbox-sessions"
_ID = re.compile(r"^s-[0-9a-f]{12}$")

# $1 = state file, $2 = the command. eval keeps a syntax error in the command from
# skipping the state save.
_WRAPPER = r"""
__ab_state="$1"; shift
if [ -f "$__ab_state" ]; then . "$__ab_state"; else cd /workspace 2>/dev/null; fi
eval "$1"
__ab_rc=$?
{ export -p; printf 'cd -- %q 2>/dev/null\n' "$PWD"; } > "$__ab_state.new" 2>/dev/null \
  && mv -f "$__ab_state.new" "$__ab_state"
exit $__ab_rc
"""


class ShellSessions:
    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner

    def create(self, cwd: str = "/workspace", env: Mapping[str, str] | None = None) -> str:
        session_id = "s-" + secrets.token_hex(6)
        exports = "".join(
            f"export {k}={shlex.quote(v)}\n" for k, v in self.runner.environment(env).items()
        )
        script = (
            f"mkdir -p {STATE_DIR} && chmod 700 {STATE_DIR} && "
            f"cd -- {shlex.quote(cwd)} && "
            f"{{ printf %s {shlex.quote(exports)}; printf 'cd -- %q\\n' \"$PWD\"; }}"
            f" > {STATE_DIR}/{session_id}"
        )
        result = self.runner.run(RunRequest(["/bin/bash", "-c", script], timeout=30))
        if result.exit_code != 0:
            raise InvalidRequest(f"could not start the shell session: {result.stderr.strip()}")
        return session_id

    def run(
        self,
        request: SessionRunRequest,
        *,
        save: OutputSaver | None = None,
        save_max_bytes: int = 0,
    ) -> CommandResult:
        # Named as the caller knows it, not by argv slot.
        exec_text(request.command, "the command")
        state = self._state_file(request.session_id)
        exists = self.runner.run(RunRequest(["/bin/test", "-f", state], timeout=10))
        if exists.exit_code != 0:
            raise SessionNotFound(
                f"no shell session {request.session_id}",
                hint=Hint("shell_create", {}, "{call} to create one"),
            )
        argv = ["/bin/bash", "-c", _WRAPPER, "agentbox-session", state, request.command]
        return self.runner.run(request.run_of(argv), save=save, save_max_bytes=save_max_bytes)

    def close(self, session_id: str) -> None:
        self.runner.run(RunRequest(["/bin/rm", "-f", self._state_file(session_id)], timeout=10))

    @staticmethod
    def _state_file(session_id: str) -> str:
        if not _ID.match(session_id):
            raise InvalidRequest(f"{session_id!r} is not a session id (they look like s-…)")
        return f"{STATE_DIR}/{session_id}"
