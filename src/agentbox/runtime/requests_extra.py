"""The request objects of :mod:`agentbox.runtime.requests` other than ``RunRequest``:
a background process's start, a shell session's run, a file write and a tar download.
Apart because a one-shot script (create, run, kill) builds none of them and each frozen
dataclass costs its import ~0.7 ms (tests/unit/test_import_weight.py)."""

from __future__ import annotations

from dataclasses import dataclass

from agentbox.runtime.requests import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT_S,
    RunRequest,
    check_run_limits,
)

TYPE_CHECKING = False  # not typing's: see agentbox.runtime.requests
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import IO

    from agentbox.runtime.request_types import WriteMode


@dataclass(frozen=True)
class StartRequest:
    """Start ``command`` in the background: ``stdin`` keeps its stdin open for
    ``write_stdin``; ``pty=(cols, rows)`` runs it on a terminal of that size."""

    command: str | Sequence[str]
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    stdin: bool = False
    pty: tuple[int, int] | None = None


@dataclass(frozen=True)
class SessionRunRequest:
    """Run ``command`` in shell session ``session_id`` (its ``cd`` and ``export`` carry
    over between runs)."""

    session_id: str
    command: str
    timeout: float | None = DEFAULT_TIMEOUT_S
    stdin: bytes | str | None = None
    max_output_bytes: int = DEFAULT_MAX_OUTPUT

    def __post_init__(self) -> None:
        check_run_limits(self.timeout, self.max_output_bytes)

    def run_of(self, argv: Sequence[str]) -> RunRequest:
        """The run of ``argv`` (the session's wrapper) with this request's stdin and
        limits."""
        return RunRequest(
            argv, stdin=self.stdin, timeout=self.timeout, max_output_bytes=self.max_output_bytes
        )


@dataclass(frozen=True)
class WriteRequest:
    """Write ``data`` (bytes, or bytes chunks streamed one at a time) to ``path``:
    ``overwrite`` truncates, ``append`` appends, ``create`` refuses an existing file;
    ``perms`` apply to a file this creates; ``make_parents`` creates missing parents."""

    path: str
    data: bytes | Iterable[bytes]
    mode: WriteMode = "overwrite"
    perms: int = 0o644
    make_parents: bool = True


@dataclass(frozen=True)
class DownloadRequest:
    """A tar of ``path`` streamed into ``fileobj``: what the host would run or trust is
    left out and listed in ``withheld`` (when given) unless ``include_unsafe``."""

    path: str
    fileobj: IO[bytes]
    include_unsafe: bool = False
    withheld: list[tuple[str, str]] | None = None
