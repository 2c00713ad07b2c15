"""The SDK and CLI over a gateway: the same calls as the in-process runtime, over HTTP.

``RemoteRuntime`` offers the methods of ``agentbox.runtime.runtime.Runtime`` that the SDK
uses, backed by the REST API. Errors come back as the same classes (the gateway sends
each error's stable ``code``), so code written against the in-process SDK runs unchanged
when ``AGENTBOX_URL`` is set.
"""

from __future__ import annotations

import json
import time

from agentbox.client.unixhttp import UnixGatewayClient, raise_error, socket_path, token_for
from agentbox.runtime.requests import RunRequest, coerce

# The result types, the errors and typing are imported where a call needs them: a one-shot
# script over the home's socket (client/unixhttp.py) loads neither httpx2, nor the
# runtime's modules, nor the error tree unless a call fails
# (tests/unit/test_import_weight.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins
    from collections.abc import Iterable, Iterator, Mapping, Sequence
    from typing import IO, Any, TypeAlias, Unpack

    import httpx2

    from agentbox.runtime.files import FileInfo
    from agentbox.runtime.output import CommandResult, OutputCallback
    from agentbox.runtime.processes import ProcessInfo, ProcessOutput
    from agentbox.runtime.record import SandboxRecord
    from agentbox.runtime.requests import SnapshotOptions
    from agentbox.runtime.requests_extra import (
        DownloadRequest,
        SessionRunRequest,
        StartRequest,
        WriteRequest,
    )
    from agentbox.runtime.snapshots import SnapshotInfo

DEFAULT_TIMEOUT_S = 600.0


class GatewayClient:
    """A thin JSON client for the gateway's REST API (``uds``: over that unix socket,
    ``shown`` in messages in place of the URL)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        uds: str | None = None,
        shown: str | None = None,
    ) -> None:
        if not token:
            from agentbox.errors import Unauthenticated

            raise Unauthenticated(
                "AGENTBOX_URL is set but AGENTBOX_TOKEN is not: export the operator or session "
                "token the gateway gave you"
            )
        import httpx2  # here: the socket client (unixhttp) streams through this one only

        self.url = shown or url.rstrip("/")
        self._http = httpx2.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=None if uds is None else httpx2.HTTPTransport(uds=uds),
        )

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        with gateway_errors(self.url):
            response = self._http.request(method, path, **kwargs)
        raise_for_error(response)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.content

    def download(
        self,
        path: str,
        params: dict[str, Any],
        fileobj: IO[bytes],
        withheld: list[tuple[str, str]] | None = None,
    ) -> int:
        """Stream a download into ``fileobj``; returns the entry count the gateway reports
        (and extends ``withheld`` with what it left out)."""
        with (
            gateway_errors(self.url, lost=True),
            self._http.stream("GET", path, params=params) as response,
        ):
            if response.status_code >= 400:
                response.read()
                raise_for_error(response)
            for chunk in response.iter_bytes():
                fileobj.write(chunk)
            if withheld is not None:
                report = json.loads(response.headers.get("x-agentbox-withheld", "[]"))
                withheld.extend((str(p), str(why)) for p, why in report)
                unlisted = int(response.headers.get("x-agentbox-withheld-count", "0"))
                unlisted -= len(report)
                if unlisted > 0:  # "": a path no tar entry has
                    why = f"{unlisted} more entries were withheld (the list is capped)"
                    withheld.append(("", why))
            return int(response.headers.get("x-agentbox-entries", "0"))

    def events(self, method: str, path: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Server-sent events of a streaming route, as (event, data) pairs."""
        with (
            gateway_errors(self.url, lost=True),
            self._http.stream(method, path, **kwargs) as response,
        ):
            if response.status_code >= 400:
                response.read()
                raise_for_error(response)
            yield from _parse_sse(response.iter_lines())


class SocketGatewayClient(UnixGatewayClient):
    """The home's socket (client/unixhttp.py); the streaming routes (a command's output
    as server-sent events, a tar download) through ``GatewayClient`` over the same socket,
    httpx2 imported on their first use."""

    _full: GatewayClient | None = None

    def full(self) -> GatewayClient:
        if self._full is None:
            self._full = GatewayClient(
                "http://localhost", self._token, self.timeout, uds=self.path, shown=self.url
            )
        return self._full

    def close(self) -> None:
        if self._full is not None:
            self._full.close()

    def download(
        self,
        path: str,
        params: dict[str, Any],
        fileobj: IO[bytes],
        withheld: builtins.list[tuple[str, str]] | None = None,
    ) -> int:
        return self.full().download(path, params, fileobj, withheld)

    def events(self, method: str, path: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        self._connect().close()  # a missing gateway says so before the stream starts
        return self.full().events(method, path, **kwargs)


if TYPE_CHECKING:
    Client: TypeAlias = GatewayClient | SocketGatewayClient


def connect(url: str, token: str | None = None) -> GatewayClient | SocketGatewayClient:
    """A client for ``url``: ``unix:///path`` (or ``unix:/path``) the gateway's socket, with
    ``token`` or else the operator token beside it; otherwise HTTP(S)."""
    path = socket_path(url)
    if path is not None:
        return SocketGatewayClient(path, token or token_for(path))
    return GatewayClient(url, token)


def gateway_errors(url: str, *, lost: bool = False) -> _GatewayErrors:
    """The SDK's one mapping of transport failures (httpx's ``map_exceptions``), as a
    context manager: a connection that cannot be made or breaks is ``GatewayUnreachable``;
    ``lost``: it broke during a call (whatever the call did may have happened)."""
    return _GatewayErrors(url, lost)


class _GatewayErrors:
    # A class, not contextlib's decorator: a script over the home's socket, which never
    # comes here, then does not load contextlib (tests/unit/test_import_weight.py).
    def __init__(self, url: str, lost: bool) -> None:
        self.url = url
        self.lost = lost

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: object) -> None:  # fmt: skip
        import httpx2  # loaded already: only GatewayClient's calls come here

        if error is None or not isinstance(error, httpx2.TransportError):
            return
        from agentbox.errors import GatewayUnreachable

        if self.lost:
            raise GatewayUnreachable(f"lost the gateway at {self.url}: {error}") from None
        raise GatewayUnreachable(
            f"cannot reach the gateway at {self.url}: {error}; is `agentbox serve` running?"
        ) from None


def raise_for_error(response: httpx2.Response) -> None:
    """An error answer as the class the gateway raised (its ``code`` survives the wire)."""
    if response.status_code >= 400:
        raise_error(response.status_code, response.content)


def _parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    event = "message"
    for line in lines:
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            yield event, json.loads(line[len("data: ") :])


def _record(data: dict[str, Any]) -> SandboxRecord:
    from agentbox.runtime.record import SandboxRecord

    # The gateway shows the public part of the spec; the rest (env, lifetime) stays there.
    spec = {k: data[k] for k in SandboxRecord.PUBLIC_SPEC if data.get(k) is not None}
    spec["isolation"] = data.get("isolation") or "namespaces"
    if data.get("from_pool"):  # record.from_pool, as on the gateway's side
        spec["from_pool"] = True
    return SandboxRecord(
        id=data["id"],
        slot=-1,
        state=data["state"],
        template=data["template"],
        template_digest=data.get("template_digest", ""),
        init_pid=None,
        init_start_time=None,
        created_at=data["created_at"],
        expires_at=data.get("expires_at"),
        stored=json.dumps(spec),
    )


def _result(data: dict[str, Any]) -> CommandResult:
    from agentbox.runtime.output import CommandResult

    stdout, stderr = data["stdout"].encode(), data["stderr"].encode()
    return CommandResult(
        stdout_bytes=stdout,
        stderr_bytes=stderr,
        exit_code=data["exit_code"],
        timed_out=data["timed_out"],
        truncated=data["truncated"],
        duration_ms=data["duration_ms"],
        stdout_total=data.get("stdout_bytes_total", len(stdout)),
        stderr_total=data.get("stderr_bytes_total", len(stderr)),
        stdout_file=data.get("stdout_file"),
        stderr_file=data.get("stderr_file"),
    )


def _process_info(data: dict[str, Any]) -> ProcessInfo:
    from agentbox.runtime.processes import ProcessInfo

    return ProcessInfo(
        data["id"], data["argv"], data["started_at"], data["running"], data["exit_code"],
        waiting_for_input=bool(data.get("waiting_for_input")), prompt=data.get("prompt"),
    )  # fmt: skip


def _file_info(data: dict[str, Any]) -> FileInfo:
    from agentbox.runtime.files import FileInfo

    return FileInfo(
        path=data["path"],
        name=data.get("name", data["path"].rsplit("/", 1)[-1]),
        type=data.get("type", "file"),
        size=data.get("size", 0),
        mode=data.get("mode", 0),
        mtime=data.get("mtime", 0.0),
        symlink_target=data.get("symlink_target"),
    )


def _command(command: str | Sequence[str]) -> str | list[str]:
    """A shell string as is, an argv as a JSON list: run without a shell there too."""
    return command if isinstance(command, str) else [str(a) for a in command]


def _text(data: bytes | str, what: str) -> str:
    """``data`` as the JSON string REST carries; bytes must be UTF-8 text."""
    if isinstance(data, str):
        return data
    try:
        return data.decode()
    except UnicodeDecodeError:
        from agentbox.errors import InvalidRequest

        raise InvalidRequest(
            f"{what} must be UTF-8 text through a gateway; write binary input to a file "
            "with files.write and redirect it (or run in-process: AGENTBOX_URL=inprocess)"
        ) from None


def _timeout_ms(timeout: float | None) -> int | None:
    """None: the gateway's own limit (a gateway never runs a command without one)."""
    if timeout is None:
        return None
    if timeout <= 0:
        from agentbox.errors import InvalidRequest

        raise InvalidRequest("timeout must be positive (seconds)")
    return max(1, int(timeout * 1000))


class RemoteCommands:
    def __init__(self, client: Client, sandbox_id: str) -> None:
        self._c, self._id = client, sandbox_id

    def run(
        self,
        request: RunRequest | str | Sequence[str],
        *,
        on_output: OutputCallback | None = None,
        **fields: Any,
    ) -> CommandResult:
        """As the in-process run (the same short form: a command and the request's
        ``fields``); ``max_output_bytes`` is cut to the gateway's maximum (``limits_applied``
        says so)."""
        r = coerce(RunRequest, request, fields)
        body: dict[str, Any] = {
            "command": _command(r.command),
            "cwd": r.cwd,
            "env": dict(r.env) if r.env else None,
            "max_output_bytes": r.max_output_bytes,
            "timeout_ms": _timeout_ms(r.timeout),
        }
        if r.pty:
            body["pty"] = True
        if r.stdin is not None:
            body["stdin"] = _text(r.stdin, "stdin")
        path = f"/v1/sandboxes/{self._id}/commands"
        if on_output is None:
            return _result(self._c.request("POST", path, json=body))
        for event, data in self._c.events("POST", path, params={"stream": "true"}, json=body):
            if event in ("stdout", "stderr"):
                on_output(event, data["data"].encode())
            elif event == "result":
                return _result(data)
            elif event == "error":
                raise_error(500, json.dumps({"error": data}).encode())
        from agentbox.errors import AgentboxError

        raise AgentboxError("the gateway closed the output stream without a result")


class RemoteProcesses:
    def __init__(self, client: Client, sandbox_id: str) -> None:
        self._c, self._base = client, f"/v1/sandboxes/{sandbox_id}/processes"

    def start(self, request: StartRequest | str | Sequence[str], **fields: Any) -> ProcessInfo:
        from agentbox.runtime.requests_extra import StartRequest

        r = coerce(StartRequest, request, fields)
        body: dict[str, object] = {
            "command": _command(r.command),
            "cwd": r.cwd,
            "env": dict(r.env) if r.env else None,
            "stdin": r.stdin,
        }
        if r.pty is not None:
            body["pty"] = {"cols": r.pty[0], "rows": r.pty[1]}
        process_id = self._c.request("POST", self._base, json=body)["process_id"]
        # As the in-process start: just started (running), argv as it runs (a shell
        # string as bash's argv), from the list.
        from agentbox.runtime.processes import ProcessInfo

        known = next((p for p in self.list() if p.id == process_id), None)
        argv, started = (known.argv, known.started_at) if known else ([], 0.0)
        return ProcessInfo(process_id, argv, started, True, None, terminal=r.pty is not None)

    def list(self) -> list[ProcessInfo]:
        data = self._c.request("GET", self._base)
        return [_process_info(p) for p in data["processes"]]

    def get(self, process_id: str) -> ProcessInfo:
        # The output route says whether it runs (a typed process_not_found when there is
        # no such process); the list carries what it is (argv, start time).
        from agentbox.runtime.processes import ProcessInfo

        state = self._state(process_id)
        known = next((p for p in self.list() if p.id == process_id), None)
        argv, started = (known.argv, known.started_at) if known else ([], 0.0)
        return ProcessInfo(
            process_id, argv, started, state["running"], state["exit_code"],
            waiting_for_input=bool(state.get("waiting_for_input")), prompt=state.get("prompt"),
        )  # fmt: skip

    def _state(self, process_id: str) -> dict[str, Any]:
        path = f"{self._base}/{process_id}/output"
        return dict(self._c.request("GET", path, params={"limit": 1}))

    def read_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, limit: int = 1 << 20
    ) -> ProcessOutput:
        from agentbox.runtime.processes import ProcessOutput

        params = {"stream": stream, "offset": offset, "limit": limit}
        out = self._c.request("GET", f"{self._base}/{process_id}/output", params=params)
        return ProcessOutput(out["data"].encode(), out["next_offset"])

    def write_stdin(self, process_id: str, data: bytes | str) -> int:
        text = _text(data, "data")
        out = self._c.request("POST", f"{self._base}/{process_id}/stdin", json={"data": text})
        return int(out["written"])

    def close_stdin(self, process_id: str) -> None:
        self._c.request("POST", f"{self._base}/{process_id}/stdin", json={"eof": True})

    def resize(self, process_id: str, cols: int, rows: int) -> None:
        body = {"cols": cols, "rows": rows}
        self._c.request("POST", f"{self._base}/{process_id}/resize", json=body)

    def signal(self, process_id: str, sig: int | str = "SIGTERM") -> bool:
        path = f"{self._base}/{process_id}/signal"
        return bool(self._c.request("POST", path, json={"signal": str(sig)})["signalled"])

    def wait(self, process_id: str, timeout: float | None = None) -> ProcessInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while self._state(process_id)["running"]:  # one request a poll
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        return self.get(process_id)


class RemoteSessions:
    def __init__(self, client: Client, sandbox_id: str) -> None:
        self._c, self._base = client, f"/v1/sandboxes/{sandbox_id}/sessions"

    def create(self, cwd: str = "/workspace", env: Mapping[str, str] | None = None) -> str:
        body = {"cwd": cwd, "env": dict(env) if env else None}
        return str(self._c.request("POST", self._base, json=body)["session_id"])

    def run(self, request: SessionRunRequest) -> CommandResult:
        r = request
        body: dict[str, Any] = {
            "command": r.command,
            "timeout_ms": _timeout_ms(r.timeout),
            "max_output_bytes": r.max_output_bytes,
            "stdin": None if r.stdin is None else _text(r.stdin, "stdin"),
        }
        return _result(self._c.request("POST", f"{self._base}/{r.session_id}/run", json=body))

    def close(self, session_id: str) -> None:
        self._c.request("DELETE", f"{self._base}/{session_id}")


class RemoteFiles:
    def __init__(self, client: Client, sandbox_id: str) -> None:
        self._c, self._base = client, f"/v1/sandboxes/{sandbox_id}/files"

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        params: dict[str, Any] = {"path": path, "offset": offset}
        if length is not None:
            params["length"] = length
        data = self._c.request("GET", self._base, params=params)
        import base64

        content = data["content"]
        return base64.b64decode(content) if data["encoding"] == "base64" else content.encode()

    def read_stream(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        offset = 0
        while True:
            chunk = self.read(path, offset, chunk_size)
            if not chunk:
                return
            yield chunk
            offset += len(chunk)

    def write(self, path: str, data: bytes | Iterable[bytes], **options: Any) -> FileInfo:
        """As the in-process ``write``: ``put`` with a ``WriteRequest`` of these."""
        from agentbox.runtime.requests_extra import WriteRequest

        return self.put(WriteRequest(path, data, **options))

    def put(self, request: WriteRequest) -> FileInfo:
        r = request
        import base64  # files only: a one-shot script never loads it

        payload = r.data if isinstance(r.data, bytes) else b"".join(r.data)
        body = {
            "path": r.path,
            "content": base64.b64encode(payload).decode(),
            "mode": r.mode,
            "encoding": "base64",
            "perms": r.perms,
            "make_parents": r.make_parents,
        }
        self._c.request("PUT", self._base, json=body)
        return self.stat(r.path)

    def list(self, path: str, depth: int = 1) -> list[FileInfo]:
        data = self._c.request("GET", f"{self._base}/list", params={"path": path, "depth": depth})
        return [_file_info(e) for e in data["entries"]]

    def stat(self, path: str) -> FileInfo:
        return _file_info(self._c.request("GET", f"{self._base}/stat", params={"path": path}))

    def exists(self, path: str) -> bool:
        try:
            from agentbox.errors import AgentboxError

            self.stat(path)
        except AgentboxError as e:
            if e.code == "file_not_found":
                return False
            raise
        return True

    def mkdir(self, path: str, parents: bool = True, exist_ok: bool = True) -> FileInfo:
        body = {"path": path, "parents": parents, "exist_ok": exist_ok}
        return _file_info(self._c.request("POST", f"{self._base}/mkdir", json=body))

    def move(self, src: str, dst: str, overwrite: bool = False) -> FileInfo:
        body = {"path": src, "destination": dst, "overwrite": overwrite}
        return _file_info(self._c.request("POST", f"{self._base}/move", json=body))

    def remove(self, path: str, recursive: bool = False) -> None:
        self._c.request("POST", f"{self._base}/remove", json={"path": path, "recursive": recursive})

    def edit(self, path: str, old: str, new: str, count: int | None = 1) -> int:
        body = {"path": path, "old": old, "new": new, "count": count}
        return int(self._c.request("POST", f"{self._base}/edit", json=body)["replacements"])

    def upload_tar(self, dest_dir: str, fileobj: IO[bytes]) -> int:
        data = self._c.request(
            "POST",
            f"{self._base}/upload",
            params={"dest": dest_dir},
            content=fileobj.read(),
            headers={"content-type": "application/x-tar"},
        )
        return int(data["entries"])

    def download(self, request: DownloadRequest) -> int:
        """Stream the tar into ``request.fileobj``; returns the number of entries."""
        r = request
        params = {"path": r.path, "include_unsafe": str(r.include_unsafe).lower()}
        return self._c.download(f"{self._base}/download", params, r.fileobj, r.withheld)


def _quoted(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


class RemoteVolumes:
    def __init__(self, client: Client) -> None:
        self.client = client

    def create(self, name: str, size: int | str) -> dict[str, Any]:
        body = {"name": name, "size": size}
        return dict(self.client.request("POST", "/v1/volumes", json=body))

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.client.request("GET", f"/v1/volumes/{_quoted(name)}"))

    def list(self) -> builtins.list[dict[str, Any]]:
        return [dict(v) for v in self.client.request("GET", "/v1/volumes")]

    def remove(self, name: str) -> None:
        self.client.request("DELETE", f"/v1/volumes/{_quoted(name)}")


class RemoteRuntime:
    """Duck-types the parts of ``Runtime`` the SDK and CLI use."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def create(self, spec: Mapping[str, object] | None = None) -> SandboxRecord:
        body = dict(spec or {})
        return _record(self.client.request("POST", "/v1/sandboxes", json=body))

    def get(self, sandbox_id: str) -> SandboxRecord:
        return _record(self.client.request("GET", f"/v1/sandboxes/{sandbox_id}"))

    def list(self) -> list[SandboxRecord]:
        return [_record(r) for r in self.client.request("GET", "/v1/sandboxes")]

    def destroy(self, sandbox_id: str) -> None:
        self.client.request("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def pause(self, sandbox_id: str) -> SandboxRecord:
        return _record(self.client.request("POST", f"/v1/sandboxes/{sandbox_id}/pause"))

    def resume(self, sandbox_id: str) -> SandboxRecord:
        return _record(self.client.request("POST", f"/v1/sandboxes/{sandbox_id}/resume"))

    def stop(self, sandbox_id: str) -> SandboxRecord:
        return _record(self.client.request("POST", f"/v1/sandboxes/{sandbox_id}/stop"))

    def fork(self, sandbox_id: str) -> SandboxRecord:
        return _record(self.client.request("POST", f"/v1/sandboxes/{sandbox_id}/fork"))

    def snapshot(self, sandbox_id: str, **options: Unpack[SnapshotOptions]) -> SnapshotInfo:
        body = {
            "redact": options.get("redact", False),
            "allowlist": options.get("allowlist"),
            "memory": options.get("memory", False),
        }
        from agentbox.runtime.snapshots import SnapshotInfo

        data = self.client.request("POST", f"/v1/sandboxes/{sandbox_id}/snapshots", json=body)
        return SnapshotInfo(**data)

    def restore(self, snapshot_id: str) -> SandboxRecord:
        return _record(self.client.request("POST", f"/v1/snapshots/{snapshot_id}/restore"))

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        from agentbox.runtime.snapshots import SnapshotInfo

        return [SnapshotInfo(**s) for s in self.client.request("GET", "/v1/snapshots")]

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.client.request("DELETE", f"/v1/snapshots/{snapshot_id}")

    def commands(self, sandbox_id: str) -> RemoteCommands:
        return RemoteCommands(self.client, sandbox_id)

    def processes(self, sandbox_id: str) -> RemoteProcesses:
        return RemoteProcesses(self.client, sandbox_id)

    def sessions(self, sandbox_id: str) -> RemoteSessions:
        return RemoteSessions(self.client, sandbox_id)

    def files(self, sandbox_id: str) -> RemoteFiles:
        return RemoteFiles(self.client, sandbox_id)

    @property
    def volumes(self) -> RemoteVolumes:
        return RemoteVolumes(self.client)
