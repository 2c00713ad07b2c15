"""The Python SDK: ``Sandbox`` (sync) and ``AsyncSandbox`` (async), E2B-style.

    from agentbox import Sandbox

    with Sandbox.create(template="default", memory="512MiB", timeout=600) as sb:
        result = sb.commands.run("python3 -c 'print(6*7)'", timeout=60)
        print(result.stdout, result.exit_code)
        sb.files.write("/workspace/hello.txt", "hi")

Units: ``timeout`` on ``create`` is the sandbox's max lifetime in **seconds**; on
``commands.run`` the command's wall-clock limit in **seconds**. Sizes take ints (bytes) or
strings like ``"512MiB"``.

The SDK talks to the home's gateway when one serves it (``agentbox serve``), as docker's
CLI talks to dockerd, else drives the runtime in-process (this process needs root, like
the daemon); ``AGENTBOX_URL`` names a gateway, or ``inprocess`` (``agentbox.endpoint``).
``AsyncSandbox`` runs the same calls in worker threads, so the two never drift apart.
"""

from __future__ import annotations

import functools
import os

# Not typing's TYPE_CHECKING: with AGENTBOX_URL=unix:... a one-shot script loads this
# module, the socket client and little else (tests/unit/test_import_weight.py); typing,
# pathlib (with urllib.parse, ipaddress and re), dataclasses and the request types cost
# more than the call. Everything below is imported where it is used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins
    from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
    from pathlib import Path
    from types import TracebackType
    from typing import IO, Any, ParamSpec, TypeVar, Unpack

    from agentbox.client.desktop import Desktop
    from agentbox.client.interfaces import Backend, ProcessesAPI
    from agentbox.config.specs import NetworkSpec
    from agentbox.runtime.files import FileInfo
    from agentbox.runtime.output import CommandResult
    from agentbox.runtime.processes import ProcessInfo, ProcessOutput
    from agentbox.runtime.requests import ExportOptions, WriteMode
    from agentbox.runtime.snapshots import SnapshotInfo
    from agentbox.runtime.store import SandboxRecord

    P = ParamSpec("P")
    R = TypeVar("R")
    W = TypeVar("W")


_backends: dict[Path | str | None, Backend] = {}


def _runtime(home: Path | None, *, discover: bool = True) -> Backend:
    """The backend for this process (``agentbox.endpoint``): with no home given, the
    gateway ``AGENTBOX_URL`` names, else the home's gateway when one serves its socket
    (``discover``), else the runtime in-process. One per home or URL (the runtime caches
    host facts). Through the home's socket (``unix://HOME/gateway.sock``) a script loads
    neither the runtime nor an HTTP library (client/unixhttp.py)."""
    from agentbox import endpoint
    from agentbox.lightimport import import_dataclasses

    import_dataclasses()  # before any module of a call defines one
    url = None
    if home is None:
        url = endpoint.gateway_url() if discover else endpoint.named_url()
    if url:
        key: Path | str | None = url
        if key not in _backends:
            from agentbox.client.remote import RemoteRuntime, connect

            _backends[key] = RemoteRuntime(connect(url, os.environ.get("AGENTBOX_TOKEN")))
        return _backends[key]
    if home not in _backends:
        from agentbox.runtime.runtime import Runtime  # in-process: the whole runtime

        _backends[home] = Runtime(home)
    return _backends[home]


def _network(value: NetworkSpec | str | Mapping[str, object]) -> dict[str, object]:
    """``value`` validated and normalised into the one network spec, as its JSON form (what
    the REST body and a record hold)."""
    from agentbox.config.specs import NetworkSpec  # pydantic: only a create with a network pays

    return NetworkSpec.parse(value).model_dump(mode="json")


def spec_of(template: str, **fields: object) -> dict[str, object]:
    """A sandbox spec for ``Runtime.create``: ``template`` and the ``fields`` given (None:
    the default), as the SDK and the CLI build it."""
    return {"template": template, **{k: v for k, v in fields.items() if v is not None}}


def _volumes(values: Sequence[str | Mapping[str, object]]) -> list[dict[str, object]]:
    """Volume mounts checked here whatever the backend (InvalidRequest naming the entry)."""
    from pydantic import ValidationError

    from agentbox.errors import InvalidRequest
    from agentbox.volumes.spec import VolumeMount

    mounts = []
    for i, value in enumerate(values):
        try:
            mount = (
                VolumeMount.parse(value)
                if isinstance(value, str)
                else VolumeMount.model_validate(dict(value))
            )
        except (ValidationError, ValueError) as e:
            raise InvalidRequest(f"volumes.{i}: {e}", field=f"volumes.{i}") from None
        mounts.append(mount.model_dump())
    return mounts


class Commands:
    """``sb.commands``: one-shot and background commands."""

    def __init__(self, runtime: Backend, sandbox_id: str) -> None:
        self._rt = runtime
        self._id = sandbox_id

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = 60.0,
        max_output_bytes: int = 1 << 20,
        pty: bool = False,
    ) -> CommandResult:
        """Run ``cmd`` (a shell string, or an argv list) and wait. ``timeout`` in seconds.

        A timed-out command has its whole process tree killed; the result says
        ``timed_out=True``. Output beyond ``max_output_bytes`` per stream keeps its head and
        tail (``truncated=True``).
        """
        from agentbox.runtime.requests import RunRequest

        request = RunRequest(cmd, cwd, env, stdin, timeout, max_output_bytes, pty)
        return self._rt.commands(self._id).run(request)

    def start(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
    ) -> CommandHandle:
        """Start ``cmd`` in the background and return a handle to it. ``stdin=True``
        keeps its stdin open for ``send_stdin`` until ``close_stdin``; ``pty=(cols, rows)``
        runs it on a terminal of that size (input typed with ``send_stdin``, one output
        stream read as ``stdout``, ``resize`` to change the size). A terminal lives as long
        as the process that holds its master end: the gateway, or in-process this one."""
        from agentbox.runtime.requests_extra import StartRequest

        info = self._rt.processes(self._id).start(StartRequest(cmd, cwd, env, stdin, pty))
        return CommandHandle(self._rt, self._id, info.id)

    def list(self) -> list[ProcessInfo]:
        return self._rt.processes(self._id).list()

    def connect(self, process_id: str) -> CommandHandle:
        self._rt.processes(self._id).get(process_id)
        return CommandHandle(self._rt, self._id, process_id)


class CommandHandle:
    """A background process. Survives the SDK process; reconnect with ``commands.connect``."""

    def __init__(self, runtime: Backend, sandbox_id: str, process_id: str) -> None:
        self._rt = runtime
        self.sandbox_id = sandbox_id
        self.id = process_id

    def _table(self) -> ProcessesAPI:
        return self._rt.processes(self.sandbox_id)

    def info(self) -> ProcessInfo:
        return self._table().get(self.id)

    def read(self, stream: str = "stdout", offset: int = 0, limit: int = 1 << 20) -> ProcessOutput:
        """Output written since byte ``offset``; pass ``next_offset`` back to continue."""
        return self._table().read_output(self.id, stream, offset, limit)

    def send_stdin(self, data: bytes | str) -> int:
        return self._table().write_stdin(self.id, data)

    def close_stdin(self) -> None:
        """Close its stdin: the process reads EOF after what was sent."""
        self._table().close_stdin(self.id)

    def resize(self, cols: int, rows: int) -> None:
        """Set the size of its terminal (started with ``pty``); the program gets SIGWINCH."""
        self._table().resize(self.id, cols, rows)

    def signal(self, sig: int | str = "SIGTERM") -> bool:
        """Whether it was delivered (False: the process had already ended)."""
        return self._table().signal(self.id, sig)

    def kill(self) -> bool:
        return self._table().signal(self.id, "SIGKILL")

    def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Wait up to ``timeout`` seconds; ``info.running`` says whether it ended."""
        return self._table().wait(self.id, timeout)


class Files:
    """``sb.files``: file operations that can never resolve outside the sandbox."""

    def __init__(self, runtime: Backend, sandbox_id: str) -> None:
        self._rt = runtime
        self._id = sandbox_id

    def read(self, path: str, *, offset: int = 0, length: int | None = None) -> str:
        return self.read_bytes(path, offset=offset, length=length).decode("utf-8", "replace")

    def read_bytes(self, path: str, *, offset: int = 0, length: int | None = None) -> bytes:
        return self._rt.files(self._id).read(path, offset, length)

    def read_stream(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        return self._rt.files(self._id).read_stream(path, chunk_size)

    def write(
        self,
        path: str,
        data: str | bytes | Iterable[bytes],
        *,
        mode: WriteMode = "overwrite",
        perms: int = 0o644,
        make_parents: bool = True,
    ) -> FileInfo:
        """``perms``: permission bits of a file this creates; ``make_parents``: create
        missing parent directories."""
        payload = data.encode() if isinstance(data, str) else data
        from agentbox.runtime.requests_extra import WriteRequest

        request = WriteRequest(path, payload, mode, perms, make_parents)
        return self._rt.files(self._id).put(request)

    def list(self, path: str = "/workspace", *, depth: int = 1) -> list[FileInfo]:
        return self._rt.files(self._id).list(path, depth)

    def stat(self, path: str) -> FileInfo:
        return self._rt.files(self._id).stat(path)

    def exists(self, path: str) -> bool:
        return self._rt.files(self._id).exists(path)

    def mkdir(self, path: str, *, parents: bool = True, exist_ok: bool = True) -> FileInfo:
        return self._rt.files(self._id).mkdir(path, parents=parents, exist_ok=exist_ok)

    def move(self, src: str, dst: str, *, overwrite: bool = False) -> FileInfo:
        return self._rt.files(self._id).move(src, dst, overwrite=overwrite)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._rt.files(self._id).remove(path, recursive=recursive)

    def edit(self, path: str, old: str, new: str, *, count: int | None = 1) -> int:
        """Replace ``old`` with ``new``; fails unless exactly ``count`` occurrences exist."""
        return self._rt.files(self._id).edit(path, old, new, count)

    def upload_tar(self, dest_dir: str, fileobj: IO[bytes]) -> int:
        return self._rt.files(self._id).upload_tar(dest_dir, fileobj)

    def download_tar(self, path: str, fileobj: IO[bytes], **options: Unpack[ExportOptions]) -> int:
        """A tar of ``path``; what the host would run or trust (git hooks and config,
        editor, agent and tool settings, rc files, setuid bits, symlinks that may leave
        the tree: see ``agentbox.runtime.export_safety``) is left out and listed in
        ``withheld`` unless ``include_unsafe``."""
        from agentbox.runtime.requests_extra import DownloadRequest

        request = DownloadRequest(path, fileobj, **options)
        return self._rt.files(self._id).download(request)


class Shell:
    """A persistent shell session: ``cd`` and ``export`` carry over between ``run`` calls."""

    def __init__(self, runtime: Backend, sandbox_id: str, session_id: str) -> None:
        self._rt = runtime
        self.sandbox_id = sandbox_id
        self.id = session_id

    def run(
        self,
        cmd: str,
        *,
        timeout: float | None = 60.0,
        stdin: bytes | str | None = None,
        max_output_bytes: int = 1 << 20,
    ) -> CommandResult:
        """Run ``cmd`` in the session; ``timeout`` in seconds."""
        from agentbox.runtime.requests_extra import SessionRunRequest

        request = SessionRunRequest(self.id, cmd, timeout, stdin, max_output_bytes)
        return self._rt.sessions(self.sandbox_id).run(request)

    def close(self) -> None:
        self._rt.sessions(self.sandbox_id).close(self.id)


class Sandbox:
    """A live sandbox. Create with ``Sandbox.create()``; attach with ``Sandbox.connect(id)``."""

    def __init__(self, record: SandboxRecord, runtime: Backend) -> None:
        self._rt = runtime
        self.id = record.id
        self.record = record
        self.commands = Commands(runtime, record.id)
        self.files = Files(runtime, record.id)

    @functools.cached_property
    def desktop(self) -> Desktop:
        """``sb.desktop``: the sandbox's graphical desktop (imported on first use: a
        one-shot script never loads it)."""
        from agentbox.client.desktop import Desktop

        return Desktop(self._rt, self.id)

    @classmethod
    def create(
        cls,
        template: str = "default",
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        disk: int | str | None = None,
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        network: NetworkSpec | str | Mapping[str, object] | None = None,
        idle_timeout: float | str | None = None,
        on_idle: str | None = None,
        isolation: str | None = None,
        volumes: Sequence[str | Mapping[str, object]] | None = None,
        home: Path | None = None,
    ) -> Sandbox:
        """Create and start a sandbox. ``timeout``: max lifetime in seconds (default 24h);
        ``network``: a ``NetworkSpec`` (``agentbox.config.specs``), a mode alone (``none``,
        ``allowlist``, ``open``, ``ask``) or a dict such as
        ``{"mode": "allowlist", "allow": ["pypi.org", "*.pythonhosted.org"]}``, checked
        here whatever the backend (``InvalidRequest`` naming the field and value);
        ``idle_timeout`` (default 15m, 0: never) and ``on_idle`` (``pause``, ``stop`` or
        ``destroy``): what happens to a sandbox nothing has used for that long, applied
        by a running gateway (activity is defined in docs/design.md); ``isolation``:
        ``namespaces`` (the default) or ``gvisor`` (runsc, a user-space kernel; what it
        supports is in docs/design.md, Isolation tiers); ``volumes``: named volumes
        (``Volume.create``) to mount, each ``"NAME:PATH"``, ``"NAME:PATH:ro"`` or a dict
        ``{"name", "path", "mode": "rw"|"ro"}`` (rw: one sandbox at a time)."""
        spec = spec_of(
            template,
            memory=memory,
            cpus=cpus,
            pids=pids,
            disk=disk,
            lifetime=timeout,
            env=dict(env) if env else None,
            network=None if network is None else _network(network),
            idle_timeout=idle_timeout,
            on_idle=on_idle,
            isolation=isolation,
            volumes=None if volumes is None else _volumes(volumes),
        )
        runtime = _runtime(home)
        return cls(runtime.create(spec), runtime)

    @classmethod
    def connect(cls, sandbox_id: str, *, home: Path | None = None) -> Sandbox:
        runtime = _runtime(home)
        return cls(runtime.get(sandbox_id), runtime)

    @classmethod
    def list(cls, *, home: Path | None = None) -> list[SandboxRecord]:
        return _runtime(home).list()

    def info(self) -> SandboxRecord:
        return self._rt.get(self.id)

    def is_running(self) -> bool:
        return self._rt.get(self.id).state == "running"

    def shell(self, cwd: str = "/workspace", env: Mapping[str, str] | None = None) -> Shell:
        return Shell(self._rt, self.id, self._rt.sessions(self.id).create(cwd, env))

    def pause(self) -> SandboxRecord:
        """Freeze every process (CPU drops to zero; memory, files and connections stay).
        Any later call on the sandbox resumes it first."""
        return self._rt.pause(self.id)

    def resume(self) -> SandboxRecord:
        """Continue a paused sandbox exactly where it stopped; start a stopped one again
        on its kept disk."""
        return self._rt.resume(self.id)

    def stop(self) -> None:
        """End every process but keep the disk (files, installed packages); ``resume``
        starts it again."""
        self._rt.stop(self.id)

    def fork(self) -> Sandbox:
        """A new sandbox with a copy of this one's files (writable layer, /workspace,
        /tmp) at this instant; its own identity, no processes. Copy-on-write: fast
        whatever the size, and changes on either side stay on that side."""
        return Sandbox(self._rt.fork(self.id), self._rt)

    def snapshot(
        self, *, redact: bool = False, allowlist: str | None = None, memory: bool = False
    ) -> SnapshotInfo:
        """Store this sandbox's writable layer and /workspace (zstd, content-addressed)
        in the snapshot store; ``Sandbox.restore(info.id)`` makes a sandbox from it.
        Secrets found by the scan refuse it (SecretsFound: path, line, kind) unless
        ``redact`` or an ``allowlist`` (text: path globs, ``path:LINE``, ``kind=...``).
        ``memory``: its running processes too, which a restore carries on (isolation
        gvisor only, else TierUnsupported; the sandbox pauses for about a second)."""
        return self._rt.snapshot(self.id, redact=redact, allowlist=allowlist, memory=memory)

    @classmethod
    def restore(cls, snapshot_id: str, *, home: Path | None = None) -> Sandbox:
        """A new sandbox with the files of a snapshot."""
        runtime = _runtime(home)
        return cls(runtime.restore(snapshot_id), runtime)

    @staticmethod
    def snapshots(*, home: Path | None = None) -> builtins.list[SnapshotInfo]:
        return _runtime(home).list_snapshots()

    @staticmethod
    def delete_snapshot(snapshot_id: str, *, home: Path | None = None) -> None:
        _runtime(home).delete_snapshot(snapshot_id)

    def kill(self) -> None:
        """Destroy the sandbox: every process dies, every host resource is removed."""
        self._rt.destroy(self.id)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


async def _to_thread(func: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    import asyncio  # loaded already under a running loop; sync users never pay for it

    return await asyncio.to_thread(func, *args, **kwargs)


def _threaded(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``func`` as a coroutine function running it in a worker thread: the same parameters
    (typed through the ParamSpec), so the async twin never restates and never drifts."""

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        return await _to_thread(func, *args, **kwargs)

    return wrapper


def _threaded_as(
    func: Callable[P, R], wrap: Callable[[R], W]
) -> Callable[P, Coroutine[Any, Any, W]]:
    """:func:`_threaded`, its result wrapped (a sync handle into its async twin)."""

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> W:
        return wrap(await _to_thread(func, *args, **kwargs))

    return wrapper


class AsyncCommandHandle:
    """:class:`CommandHandle`, awaited."""

    def __init__(self, handle: CommandHandle) -> None:
        self.sandbox_id, self.id = handle.sandbox_id, handle.id
        self.info = _threaded(handle.info)
        self.read = _threaded(handle.read)
        self.send_stdin = _threaded(handle.send_stdin)
        self.close_stdin = _threaded(handle.close_stdin)
        self.resize = _threaded(handle.resize)
        self.signal = _threaded(handle.signal)
        self.kill = _threaded(handle.kill)
        self.wait = _threaded(handle.wait)


class AsyncCommands:
    """:class:`Commands` (``sb.commands``), awaited."""

    def __init__(self, commands: Commands) -> None:
        self.run = _threaded(commands.run)
        self.start = _threaded_as(commands.start, AsyncCommandHandle)
        self.list = _threaded(commands.list)
        self.connect = _threaded_as(commands.connect, AsyncCommandHandle)


class AsyncFiles:
    """:class:`Files` (``sb.files``), awaited."""

    def __init__(self, files: Files) -> None:
        self.read = _threaded(files.read)
        self.read_bytes = _threaded(files.read_bytes)
        self.write = _threaded(files.write)
        self.list = _threaded(files.list)
        self.stat = _threaded(files.stat)
        self.exists = _threaded(files.exists)
        self.mkdir = _threaded(files.mkdir)
        self.move = _threaded(files.move)
        self.remove = _threaded(files.remove)
        self.edit = _threaded(files.edit)
        self.upload_tar = _threaded(files.upload_tar)
        self.download_tar = _threaded(files.download_tar)


class AsyncDesktop:
    """:class:`Desktop` (``sb.desktop``), awaited."""

    def __init__(self, desktop: Desktop) -> None:
        self.start = _threaded(desktop.start)
        self.stop = _threaded(desktop.stop)
        self.screenshot = _threaded(desktop.screenshot)
        self.click = _threaded(desktop.click)
        self.move = _threaded(desktop.move)
        self.drag = _threaded(desktop.drag)
        self.scroll = _threaded(desktop.scroll)
        self.type = _threaded(desktop.type)
        self.key = _threaded(desktop.key)
        self.open = _threaded(desktop.open)


class AsyncShell:
    """:class:`Shell`, awaited."""

    def __init__(self, shell: Shell) -> None:
        self.sandbox_id, self.id = shell.sandbox_id, shell.id
        self.run = _threaded(shell.run)
        self.close = _threaded(shell.close)


class AsyncSandbox:
    """The async twin of ``Sandbox``: same methods and parameters, awaited."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sync = sandbox
        self.id = sandbox.id
        self.record = sandbox.record
        self.commands = AsyncCommands(sandbox.commands)
        self.files = AsyncFiles(sandbox.files)
        self.info = _threaded(sandbox.info)
        self.is_running = _threaded(sandbox.is_running)
        self.shell = _threaded_as(sandbox.shell, AsyncShell)
        self.pause = _threaded(sandbox.pause)
        self.resume = _threaded(sandbox.resume)
        self.stop = _threaded(sandbox.stop)
        self.fork = _threaded_as(sandbox.fork, AsyncSandbox)
        self.snapshot = _threaded(sandbox.snapshot)
        self.kill = _threaded(sandbox.kill)

    @functools.cached_property
    def desktop(self) -> AsyncDesktop:
        return AsyncDesktop(self._sync.desktop)

    create = staticmethod(_threaded_as(Sandbox.create, lambda sb: AsyncSandbox(sb)))
    connect = staticmethod(_threaded_as(Sandbox.connect, lambda sb: AsyncSandbox(sb)))
    restore = staticmethod(_threaded_as(Sandbox.restore, lambda sb: AsyncSandbox(sb)))
    list = staticmethod(_threaded(Sandbox.list))
    snapshots = staticmethod(_threaded(Sandbox.snapshots))
    delete_snapshot = staticmethod(_threaded(Sandbox.delete_snapshot))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.kill()
