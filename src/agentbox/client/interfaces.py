"""What the SDK asks of a backend: one interface per part (commands, processes, sessions,
files) and the backend that hands them out, each taking the same arguments everywhere.

Two implementations: the in-process runtime (``agentbox.runtime``: ``CommandRunner``,
``ProcessTable``, ``ShellSessions``, ``SandboxFiles``, ``Runtime``) and the gateway client
(``agentbox.client.remote``), which carries every argument over REST or refuses one it
cannot carry with a typed error; it never drops one. The type checker holds both to these
protocols (``client.sandbox._runtime``), and tests/integration/test_sdk_contract.py runs
every call against both and compares the results (the SWE-ReX pattern).

Units: ``timeout`` in **seconds**; sizes in **bytes**.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:  # the SDK loads light: these are imported where they are used
    from agentbox.runtime.files import FileInfo
    from agentbox.runtime.output import CommandResult, OutputCallback
    from agentbox.runtime.processes import ProcessInfo, ProcessOutput
    from agentbox.runtime.snapshots import SnapshotInfo
    from agentbox.runtime.store import SandboxRecord

WriteMode = Literal["overwrite", "append", "create"]
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_OUTPUT = 1 << 20


class CommandsAPI(Protocol):
    def run(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT,
        pty: bool = False,
        on_output: OutputCallback | None = None,
    ) -> CommandResult:
        """Run ``command`` (a bash string, or an argv run without a shell) and wait."""
        ...


class ProcessesAPI(Protocol):
    def start(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
    ) -> ProcessInfo: ...
    def list(self) -> builtins.list[ProcessInfo]: ...
    def get(self, process_id: str) -> ProcessInfo: ...
    def read_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, limit: int = 1 << 20
    ) -> ProcessOutput: ...
    def write_stdin(self, process_id: str, data: bytes | str) -> int: ...
    def close_stdin(self, process_id: str) -> None: ...
    def resize(self, process_id: str, cols: int, rows: int) -> None: ...
    def signal(self, process_id: str, sig: int | str = "SIGTERM") -> bool:
        """Whether it was delivered (False: the process had ended)."""
        ...

    def wait(self, process_id: str, timeout: float | None = None) -> ProcessInfo: ...


class SessionsAPI(Protocol):
    def create(self, cwd: str = "/workspace", env: Mapping[str, str] | None = None) -> str: ...
    def run(
        self,
        session_id: str,
        command: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        stdin: bytes | str | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT,
    ) -> CommandResult: ...
    def close(self, session_id: str) -> None: ...


class FilesAPI(Protocol):
    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes: ...
    def read_stream(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]: ...
    def write(
        self,
        path: str,
        data: bytes | Iterable[bytes],
        mode: WriteMode = "overwrite",
        perms: int = 0o644,
        make_parents: bool = True,
    ) -> FileInfo: ...
    def edit(self, path: str, old: str, new: str, count: int | None = 1) -> int: ...
    def mkdir(self, path: str, parents: bool = True, exist_ok: bool = True) -> FileInfo: ...
    def stat(self, path: str) -> FileInfo: ...
    def exists(self, path: str) -> bool: ...
    def list(self, path: str, depth: int = 1) -> builtins.list[FileInfo]: ...
    def move(self, src: str, dst: str, overwrite: bool = False) -> FileInfo: ...
    def remove(self, path: str, recursive: bool = False) -> None: ...
    def upload_tar(self, dest_dir: str, fileobj: IO[bytes]) -> int: ...
    def download_tar(
        self,
        path: str,
        fileobj: IO[bytes],
        *,
        include_unsafe: bool = False,
        withheld: builtins.list[tuple[str, str]] | None = None,
    ) -> int: ...


class Backend(Protocol):
    """Where sandboxes live: the in-process ``Runtime`` or ``RemoteRuntime`` (a gateway)."""

    def create(self, spec: Mapping[str, object] | None = None) -> SandboxRecord: ...
    def get(self, sandbox_id: str) -> SandboxRecord: ...
    def list(self) -> builtins.list[SandboxRecord]: ...
    def destroy(self, sandbox_id: str) -> None: ...
    def pause(self, sandbox_id: str) -> SandboxRecord: ...
    def resume(self, sandbox_id: str) -> SandboxRecord: ...
    def stop(self, sandbox_id: str) -> SandboxRecord: ...
    def fork(self, sandbox_id: str) -> SandboxRecord: ...
    def snapshot(
        self, sandbox_id: str, *, redact: bool = False, allowlist: str | None = None
    ) -> SnapshotInfo: ...
    def restore(self, snapshot_id: str) -> SandboxRecord: ...
    def list_snapshots(self) -> builtins.list[SnapshotInfo]: ...
    def delete_snapshot(self, snapshot_id: str) -> None: ...
    def commands(self, sandbox_id: str) -> CommandsAPI: ...
    def processes(self, sandbox_id: str) -> ProcessesAPI: ...
    def sessions(self, sandbox_id: str) -> SessionsAPI: ...
    def files(self, sandbox_id: str) -> FilesAPI: ...
