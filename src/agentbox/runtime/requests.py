"""The request objects every SDK backend takes: one frozen dataclass per call that carries
more than a path (``commands.run``, ``processes.start``, a session's ``run``,
``files.write``, ``files.download_tar``). The in-process runtime and the gateway client
(``agentbox.client.remote``) implement ``agentbox.client.interfaces`` over these, so an
argument is declared once and neither backend can drop one silently; the SDK's public
methods (``Sandbox.commands.run(cmd, timeout=...)``) build them.

Units: ``timeout`` in **seconds**; sizes in **bytes**. The checks that need no sandbox run
here, when the request is built, so both backends refuse the same values the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal, TypedDict, TypeVar, cast

WriteMode = Literal["overwrite", "append", "create"]
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_OUTPUT = 1 << 20


def _check_run_limits(timeout: float | None, max_output_bytes: int) -> None:
    # errors (with hints) only when refusing: a call over the home's socket never loads it
    if timeout is not None and timeout <= 0:
        from agentbox.errors import InvalidRequest

        raise InvalidRequest("timeout must be positive (seconds)")
    if max_output_bytes < 0:
        from agentbox.errors import InvalidRequest

        raise InvalidRequest("max_output_bytes must be >= 0")


@dataclass(frozen=True)
class RunRequest:
    """Run ``command`` (a bash string, or an argv run without a shell) and wait:
    ``stdin`` fed to it, ``timeout`` its wall-clock limit (None: none), output beyond
    ``max_output_bytes`` per stream cut (head and tail kept), ``pty`` on a terminal."""

    command: str | Sequence[str]
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    stdin: bytes | str | None = None
    timeout: float | None = DEFAULT_TIMEOUT_S
    max_output_bytes: int = DEFAULT_MAX_OUTPUT
    pty: bool = False

    def __post_init__(self) -> None:
        _check_run_limits(self.timeout, self.max_output_bytes)


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
        _check_run_limits(self.timeout, self.max_output_bytes)

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


class ExportOptions(TypedDict, total=False):
    """``download_tar``'s keywords, in the SDK and the runtime alike."""

    include_unsafe: bool  # also what the host would run or trust (default False)
    withheld: list[tuple[str, str]] | None  # appended: (path in the tar, why left out)


class SnapshotOptions(TypedDict, total=False):
    """``snapshot``'s keywords, in the SDK's backends and the runtime alike."""

    redact: bool  # replace found secrets instead of refusing (default False)
    allowlist: str | None  # allow-list text (see storage.secretscan.AllowList)
    memory: bool  # its running processes too (isolation gvisor; default False)


@dataclass(frozen=True)
class DownloadRequest:
    """A tar of ``path`` streamed into ``fileobj``: what the host would run or trust is
    left out and listed in ``withheld`` (when given) unless ``include_unsafe``."""

    path: str
    fileobj: IO[bytes]
    include_unsafe: bool = False
    withheld: list[tuple[str, str]] | None = None


Command = TypeVar("Command", RunRequest, StartRequest)


def coerce(
    kind: type[Command], value: Command | str | Sequence[str], options: dict[str, Any]
) -> Command:
    """The runtime's short form for its own callers (``runner.run(["true"], timeout=5)``):
    ``value`` as is when it is a request, else a request of ``kind`` built from a command
    and those ``options`` that are its fields, which are taken out of ``options`` (what
    remains are the call's own, such as ``on_output``)."""
    names = {f.name for f in dataclasses.fields(kind)} & options.keys()
    fields = {name: options.pop(name) for name in names}
    if isinstance(value, kind):
        if fields:
            raise TypeError(f"{', '.join(sorted(fields))} given twice: in the request and apart")
        return value
    return kind(cast("str | Sequence[str]", value), **fields)
