"""envd (``E2B_SANDBOX_URL``): process and filesystem RPCs and ``/files``, per sandbox.

One port serves every sandbox: requests are routed by their ``E2b-Sandbox-Id`` header
and authenticated by ``X-Access-Token``. Every operation is a ``Gateway.call_tool`` of
agentbox's own tools (process_start, fs_read, ...), so policy, approvals, limits,
redaction and the audit trail apply exactly as over MCP or ``/v1``; a denial reaches the
SDK as a Connect error carrying agentbox's message.

Output of a started process is streamed by following its output files (the tool call
that started it was checked and audited; the chunks are redacted as they go).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import posixpath
import secrets
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentbox.errors import (
    AgentboxError,
    FileExists,
    FileNotFound,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    ProcessNotFound,
    SandboxNotRunning,
    Unauthenticated,
)
from agentbox.gateway.e2b import connect
from agentbox.gateway.e2b.access import Caller, E2BAccess, gone
from agentbox.gateway.e2b.connect import ConnectError
from agentbox.gateway.e2b.models import (
    FILESYSTEM_SERVICE,
    HOME,
    PROCESS_SERVICE,
    SIGNALS,
    command_of,
    e2b_error,
    ended,
    entry_info,
    file_metadata,
    file_signature,
    metadata_of,
    pid_of,
    pty_size,
    sandbox_path,
    set_file_metadata,
)
from agentbox.gateway.e2b.timeouts import TimeoutPauses
from agentbox.gateway.service import Gateway
from agentbox.runtime.processes import ProcessOutput
from agentbox.runtime.watches import MAX_DEPTH as MAX_WATCH_DEPTH
from agentbox.runtime.watches import DirWatch, Watches

log = logging.getLogger(__name__)
Unary = Callable[["Call", dict[str, Any]], Awaitable[dict[str, Any]]]
Streaming = Callable[["Call", dict[str, Any]], AsyncIterator[dict[str, Any]]]
ClientStreaming = Callable[["Call", list[dict[str, Any]]], Awaitable[dict[str, Any]]]
_CHUNK = 64 * 1024
_KEEPALIVE_S = 50.0
_POLL_MIN_S, _POLL_MAX_S = 0.002, 0.05
# Ambiguous on purpose: the SDKs then ask /health whether the sandbox ended.
_SANDBOX_WENT = "the stream ended before the command did: the sandbox went"
_MAX_WATCHERS = 256


class Call:
    """One envd request: which sandbox, as whom, until when."""

    def __init__(self, gateway: Gateway, caller: Caller, sandbox_id: str, deadline: float | None):
        self.gateway, self.caller, self.sandbox_id = gateway, caller, sandbox_id
        self.deadline = deadline

    async def tool(self, name: str, **args: Any) -> dict[str, Any]:
        args = {k: v for k, v in args.items() if v is not None}
        outcome = await self.gateway.call_tool(
            self.caller.principal(self.sandbox_id), name, {**args, "sandbox_id": self.sandbox_id}
        )
        return outcome.result


class Envd:
    def __init__(self, gateway: Gateway, access: E2BAccess, pauses: TimeoutPauses) -> None:
        self.gateway, self.access, self.pauses = gateway, access, pauses
        self.unary: dict[str, Unary] = {
            f"{PROCESS_SERVICE}/List": self.list_processes,
            f"{PROCESS_SERVICE}/SendInput": self.send_input,
            f"{PROCESS_SERVICE}/SendSignal": self.send_signal,
            f"{PROCESS_SERVICE}/CloseStdin": self.close_stdin,
            f"{PROCESS_SERVICE}/Update": self.update,
            f"{FILESYSTEM_SERVICE}/Stat": self.stat,
            f"{FILESYSTEM_SERVICE}/ListDir": self.list_dir,
            f"{FILESYSTEM_SERVICE}/MakeDir": self.make_dir,
            f"{FILESYSTEM_SERVICE}/Move": self.move,
            f"{FILESYSTEM_SERVICE}/Remove": self.remove,
            f"{FILESYSTEM_SERVICE}/CreateWatcher": self.create_watcher,
            f"{FILESYSTEM_SERVICE}/GetWatcherEvents": self.get_watcher_events,
            f"{FILESYSTEM_SERVICE}/RemoveWatcher": self.remove_watcher,
        }
        self.watchers: dict[str, Watch] = {}
        self.dir_watches = Watches()
        self.streams = 0  # WatchDir streams open
        self.streaming: dict[str, Streaming] = {
            f"{PROCESS_SERVICE}/Start": self.start,
            f"{PROCESS_SERVICE}/Connect": self.connect,
            f"{FILESYSTEM_SERVICE}/WatchDir": self.watch_dir,
        }
        # Client streaming: every request message, one response message.
        self.client_streaming: dict[str, ClientStreaming] = {
            f"{PROCESS_SERVICE}/StreamInput": self.stream_input,
        }

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/files", self.files, methods=["GET", "POST"]),
            Route("/{service}/{method}", self.rpc, methods=["POST"]),
        ]

    def _signed(self, request: Request) -> Call:
        """A signed download_url/upload_url: no headers, so the sandbox is the one whose
        envd token makes the signature (expired or forged ones are refused)."""
        query = request.query_params
        operation = "read" if request.method == "GET" else "write"
        expiration = query.get("signature_expiration")
        args = (query.get("path", ""), operation, query.get("username", ""))
        for sandbox_id, owned in self.access.all_owned().items():
            token = self.access.envd_token(sandbox_id)
            wanted = file_signature(*args, token, expiration)
            if hmac.compare_digest(wanted, query.get("signature", "")):
                if expiration is not None and (
                    not expiration.isdigit() or int(expiration) < time.time()
                ):
                    raise ConnectError("unauthenticated", "signature is already expired")
                return Call(self.gateway, owned.caller, sandbox_id, None)
        raise Unauthenticated("the URL's signature matches no sandbox")

    async def _call(self, request: Request) -> Call:
        sandbox_id = request.headers.get("e2b-sandbox-id")
        if sandbox_id is None and "signature" in request.query_params:
            call = self._signed(request)
        else:
            caller = self.access.envd_caller(sandbox_id, request.headers.get("x-access-token"))
            assert sandbox_id is not None
            timeout_ms = request.headers.get("connect-timeout-ms")
            deadline = None
            if timeout_ms and timeout_ms.isdigit() and int(timeout_ms) > 0:
                deadline = time.monotonic() + int(timeout_ms) / 1000
            call = Call(self.gateway, caller, sandbox_id, deadline)
        await self._awake(call)
        return call

    async def _awake(self, call: Call) -> None:
        """A sandbox paused at its E2B timeout (``on_timeout: pause``) is woken by a call
        if made with ``autoResume`` and its memory kept; else the call is refused until a
        connect resumes it. (Other pauses, agentbox's idle one included, end on any call.)"""
        pausing = await asyncio.to_thread(self.access.pausing, call.sandbox_id)
        if pausing is None:
            return
        runtime = self.gateway.runtime
        record = await asyncio.to_thread(runtime.store.get, call.sandbox_id)
        if record is None or record.state not in ("paused", "stopped"):
            return
        if pausing.pause_at is not None:  # paused by agentbox (idle), not by E2B: as ever
            return
        if not (pausing.auto_resume and record.state == "paused"):
            raise SandboxNotRunning(
                f"sandbox {call.sandbox_id} is paused: resume it with Sandbox.connect()"
            )
        actor = call.caller.principal(call.sandbox_id).actor
        await asyncio.to_thread(runtime.resume, call.sandbox_id, reason="activity", actor=actor)
        self.pauses.arm(pausing, pausing.timeout_s)
        self.gateway.lifecycle_changed()

    # Connect RPC -------------------------------------------------------------------------
    async def rpc(self, request: Request) -> Response:
        name = f"{request.path_params['service']}/{request.path_params['method']}"
        if name in self.streaming:
            return await self._streaming(request, self.streaming[name])
        if name in self.client_streaming:
            return await self._client_streaming(request, self.client_streaming[name])
        try:
            handler = self.unary.get(name)
            if handler is None:
                raise ConnectError("unimplemented", f"{name} is not implemented by agentbox")
            call = await self._call(request)
            message = connect.parse(await request.body())
            return JSONResponse(await handler(call, message), media_type=connect.UNARY_TYPE)
        except (AgentboxError, ConnectError) as e:
            return connect.unary_error(e)
        except Exception as e:  # a malformed message: Connect's "internal", logged here
            log.exception("envd %s failed", name)
            return connect.unary_error(e)

    async def _streaming(self, request: Request, handler: Streaming) -> Response:
        try:
            call = await self._call(request)
            messages = connect.read_envelopes(await request.body())
            events = handler(call, messages[0] if messages else {})
            first = await anext(events)  # errors before the first message: the stream's end
        except Exception as e:
            if not isinstance(e, (AgentboxError, ConnectError)):
                log.exception("envd stream failed")
            error = e

            async def failed() -> AsyncIterator[bytes]:
                yield connect.end_stream(error)

            return StreamingResponse(failed(), media_type=connect.STREAM_TYPE)

        async def frames() -> AsyncIterator[bytes]:
            yield connect.envelope(first)
            try:
                async for event in events:
                    yield connect.envelope(event)
            except Exception as e:
                if not isinstance(e, (AgentboxError, ConnectError)):
                    log.exception("envd stream failed")
                yield connect.end_stream(e)
                return
            yield connect.end_stream()

        return StreamingResponse(frames(), media_type=connect.STREAM_TYPE)

    async def _client_streaming(self, request: Request, handler: ClientStreaming) -> Response:
        """The request's messages (the whole body: the client ends its stream first) to
        ``handler``; its answer and the end of the stream, or the error as that end."""
        try:
            call = await self._call(request)
            messages = connect.read_envelopes(await request.body())
            reply = connect.envelope(await handler(call, messages))
            end = connect.end_stream()
        except Exception as e:
            if not isinstance(e, (AgentboxError, ConnectError)):
                log.exception("envd stream failed")
            reply, end = b"", connect.end_stream(e)
        return Response(reply + end, media_type=connect.STREAM_TYPE)

    # process.Process ---------------------------------------------------------------------
    async def start(self, call: Call, message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        process = message.get("process") or {}
        pty = message.get("pty")
        result = await call.tool(
            "process_start",
            command=command_of(process),
            cwd=sandbox_path(process.get("cwd") or HOME),
            env=process.get("envs") or None,
            stdin=bool(message.get("stdin", False)) and pty is None,
            pty=None if pty is None else pty_size(pty),
        )
        process_id = str(result["process_id"])
        yield {"event": {"start": {"pid": pid_of(process_id)}}}
        async for event in self._follow(call, process_id, 0, 0):
            yield event

    async def connect(self, call: Call, message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        process_id = await self._process_id(call, message)
        table = self.gateway.runtime.processes(call.sandbox_id)
        sizes = await asyncio.to_thread(_sizes, table, process_id)
        yield {"event": {"start": {"pid": pid_of(process_id)}}}
        async for event in self._follow(call, process_id, *sizes):
            yield event

    async def _follow(
        self, call: Call, process_id: str, out_at: int, err_at: int
    ) -> AsyncIterator[dict[str, Any]]:
        """Data events as the output files grow, then the end event (exit code)."""
        table = self.gateway.runtime.processes(call.sandbox_id)
        redact = self.gateway.redactor.redact
        offsets = {"stdout": out_at, "stderr": err_at}
        delay, quiet = _POLL_MIN_S, 0.0
        terminal: bool | None = None  # a terminal's output is the ``pty`` data

        def read(stream: str) -> ProcessOutput:
            try:
                return table.read_output(process_id, stream, offsets[stream], _CHUNK)
            except (NotFound, SandboxNotRunning, OSError):  # its disk went with the sandbox
                raise ConnectError("unavailable", _SANDBOX_WENT) from None

        while True:
            try:
                info = await asyncio.to_thread(table.get, process_id)
            except (NotFound, SandboxNotRunning, OSError):
                raise ConnectError("unavailable", _SANDBOX_WENT) from None
            terminal = info.terminal if terminal is None else terminal
            got = False
            for stream in ("stdout", "stderr"):
                while True:
                    chunk = await asyncio.to_thread(read, stream)
                    if not chunk.data:
                        break
                    offsets[stream] = chunk.next_offset
                    got = True
                    text = redact(chunk.data.decode("utf-8", "replace"))
                    data = base64.b64encode(text.encode()).decode()
                    kind = "pty" if terminal and stream == "stdout" else stream
                    yield {"event": {"data": {kind: data}}}
            if not info.running:  # output read after the exit was seen: nothing is lost
                record = await asyncio.to_thread(self.gateway.runtime.store.get, call.sandbox_id)
                if record is None or record.state != "running":  # killed with its sandbox
                    raise ConnectError("unavailable", _SANDBOX_WENT)
                code = info.exit_code if info.exit_code is not None else -1
                yield {"event": {"end": _end(code)}}
                return
            if call.deadline is not None and time.monotonic() >= call.deadline:
                await asyncio.to_thread(table.signal, process_id, "SIGKILL")
                raise ConnectError("deadline_exceeded", "the command ran past its timeout")
            delay = _POLL_MIN_S if got else min(delay * 2, _POLL_MAX_S)
            quiet = 0.0 if got else quiet + delay
            if quiet >= _KEEPALIVE_S:
                quiet = 0.0
                yield {"event": {"keepalive": {}}}
            await asyncio.sleep(delay)

    async def _process_id(self, call: Call, message: dict[str, Any]) -> str:
        """The agentbox handle of a running process's ProcessSelector (pid; tags are not
        kept). An ended one is not found, as envd answers."""
        selector = message.get("process") or {}
        if "pid" not in selector:
            raise ConnectError("not_found", "only pid selectors are supported (tags are not)")
        pid = int(selector["pid"])
        listed = await call.tool("process_list")
        for entry in listed["processes"]:
            if entry["running"] and pid_of(str(entry["id"])) == pid:
                return str(entry["id"])
        raise ProcessNotFound(f"process {pid} not found")

    async def list_processes(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        listed = await call.tool("process_list")
        return {
            "processes": [
                {
                    "config": {"cmd": "/bin/bash", "args": ["-l", "-c", p["argv"][-1]]},
                    "pid": pid_of(str(p["id"])),
                }
                for p in listed["processes"]
                if p["running"]
            ]
        }

    async def send_input(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        process_id = await self._process_id(call, message)
        await call.tool("process_write", process_id=process_id, data=_input(message))
        return {}

    async def stream_input(self, call: Call, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """A start event (the process), then data events, sent as one process_write: the
        order holds and the audit trail gets one record per stream, not per chunk."""
        if not messages or "start" not in messages[0]:
            raise ConnectError("invalid_argument", "the input stream must begin with a start event")
        process_id = await self._process_id(call, messages[0]["start"])
        text = "".join(_input(m["data"]) for m in messages[1:] if "data" in m)
        if text:
            await call.tool("process_write", process_id=process_id, data=text)
        return {}

    async def close_stdin(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        process_id = await self._process_id(call, message)
        await call.tool("process_write", process_id=process_id, eof=True)
        return {}

    async def update(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        """PTY resize: the program on the terminal gets SIGWINCH."""
        process_id = await self._process_id(call, message)
        pty = message.get("pty")
        if pty is None:  # nothing to change
            return {}
        await call.tool("process_resize", process_id=process_id, **pty_size(pty))
        return {}

    async def send_signal(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        process_id = await self._process_id(call, message)
        signal = SIGNALS.get(str(message.get("signal")))
        if signal is None:
            raise ConnectError("invalid_argument", f"unknown signal {message.get('signal')!r}")
        await call.tool("process_signal", process_id=process_id, signal=signal)
        return {}

    # filesystem.Filesystem ---------------------------------------------------------------
    async def _entry(self, call: Call, info: dict[str, Any]) -> dict[str, Any]:
        """EntryInfo, with the file's metadata (envd 0.6.2: its ``user.e2b.*`` xattrs)."""
        entry = entry_info(info)
        if info.get("type") == "file":
            files = self.gateway.runtime.files(call.sandbox_id)
            with contextlib.suppress(AgentboxError):  # gone since: no metadata to show
                metadata = await asyncio.to_thread(file_metadata, files, str(info["path"]))
                if metadata:
                    entry["metadata"] = metadata
        return entry

    async def stat(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        return {"entry": await self._entry(call, await call.tool("fs_stat", path=_path(message)))}

    async def list_dir(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        depth = max(1, int(message.get("depth") or 1))
        listed = await call.tool("fs_list", path=_path(message), depth=depth)
        return {"entries": [await self._entry(call, e) for e in listed["entries"]]}

    async def make_dir(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        path = _path(message)
        files = self.gateway.runtime.files(call.sandbox_id)
        existed = await asyncio.to_thread(files.exists, path)
        entry = await call.tool("fs_mkdir", path=path)  # checked and audited either way
        await self._settle(call)
        if existed:
            raise FileExists(f"{path} already exists")
        return {"entry": await self._entry(call, entry)}

    async def move(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        source = sandbox_path(str(message.get("source", "")))
        destination = sandbox_path(str(message.get("destination", "")))
        entry = await call.tool("fs_move", path=source, destination=destination, overwrite=True)
        await self._settle(call)
        return {"entry": await self._entry(call, entry)}

    async def remove(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        with contextlib.suppress(FileNotFound):  # envd: removing what is not there is done
            await call.tool("fs_remove", path=_path(message), recursive=True)
        await self._settle(call)
        return {}

    # watching: the kernel's events (runtime/watches.py), as envd's fsnotify reports them --
    async def _watch(
        self, call: Call, message: dict[str, Any], on_event: Callable[[], None] | None = None
    ) -> Watch:
        path, recursive = _path(message), bool(message.get("recursive"))
        await call.tool("fs_list", path=path, depth=1)  # the read policy, audited once
        files = self.gateway.runtime.files(call.sandbox_id)
        depth = MAX_WATCH_DEPTH if recursive else 0
        watch = await asyncio.to_thread(self.dir_watches.add, files, path, depth, on_event)
        return Watch(call.sandbox_id, watch, bool(message.get("includeEntry")))

    async def _settle(self, call: Call) -> None:
        """After a change made here: its events are read (and a new directory is covered
        by the recursive watches) before the reply, as the caller's next call expects."""
        if any(w.sandbox_id == call.sandbox_id for w in self.watchers.values()) or self.streams:
            await asyncio.to_thread(self.dir_watches.drain)

    async def create_watcher(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        watch = await self._watch(call, message)
        if len(self.watchers) >= _MAX_WATCHERS:
            self.dir_watches.remove(self.watchers.pop(next(iter(self.watchers))).watch)
        watcher_id = f"{call.sandbox_id}/{secrets.token_hex(8)}"
        self.watchers[watcher_id] = watch
        return {"watcherId": watcher_id}

    def _watcher_of(self, call: Call, message: dict[str, Any]) -> tuple[str, Watch]:
        watcher_id = str(message.get("watcherId", ""))
        watch = self.watchers.get(watcher_id)
        if watch is None or not watcher_id.startswith(call.sandbox_id + "/"):
            raise ConnectError("not_found", f"watcher {watcher_id!r} not found")
        return watcher_id, watch

    async def get_watcher_events(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        _, watch = self._watcher_of(call, message)
        await asyncio.to_thread(self.dir_watches.drain)
        return {"events": await asyncio.to_thread(watch.events, self.dir_watches)}

    async def remove_watcher(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        watcher_id, watch = self._watcher_of(call, message)
        del self.watchers[watcher_id]
        self.dir_watches.remove(watch.watch)
        return {}

    async def watch_dir(self, call: Call, message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()

        def wake() -> None:  # from the watches' reader thread
            loop.call_soon_threadsafe(ready.set)

        watch = await self._watch(call, message, wake)
        self.streams += 1
        try:
            yield {"start": {}}
            while True:
                wait = _KEEPALIVE_S
                if call.deadline is not None:
                    wait = min(wait, call.deadline - time.monotonic())
                    if wait <= 0:
                        return
                try:
                    await asyncio.wait_for(ready.wait(), wait)
                except TimeoutError:
                    if call.deadline is None or time.monotonic() < call.deadline:
                        yield {"keepalive": {}}
                    continue
                ready.clear()
                for event in await asyncio.to_thread(watch.events, self.dir_watches):
                    yield {"filesystem": event}
        finally:
            self.streams -= 1
            self.dir_watches.remove(watch.watch)

    # HTTP: /health, /files ---------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """204 while the sandbox runs; 502 once it ended, as E2B's proxy answers (the SDKs
        tell a killed sandbox from a network fault by it)."""
        sandbox_id = request.headers.get("e2b-sandbox-id") or ""
        token = request.headers.get("x-access-token") or ""
        if not hmac.compare_digest(token, self.access.envd_token(sandbox_id)):
            return _http_error(Unauthenticated("missing or wrong X-Access-Token"))
        try:
            record = self.gateway.runtime.get(sandbox_id)
        except AgentboxError:
            record = None
        if record is not None and record.state == "running" and not ended(record.expires_at):
            return Response(status_code=204)
        return _http_error(gone(sandbox_id))

    async def files(self, request: Request) -> Response:
        try:
            call = await self._call(request)
            if request.method == "GET":
                return await self._download(call, request)
            return await self._upload(call, request)
        except (AgentboxError, ConnectError) as e:
            return _http_error(e)

    async def _download(self, call: Call, request: Request) -> Response:
        path = sandbox_path(request.query_params.get("path", ""))
        result = await call.tool("fs_read", path=path)
        if result["truncated"]:
            raise LimitExceeded(
                f"{path} is {result['size']} bytes, over the fs.read max_bytes of this gateway"
            )
        content = str(result["content"])
        data = base64.b64decode(content) if result["encoding"] == "base64" else content.encode()
        return Response(data, media_type="application/octet-stream")

    async def _upload(self, call: Call, request: Request) -> Response:
        metadata = metadata_of(request.headers.items())  # one map for every file
        default = request.query_params.get("path")
        written = []
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            async with request.form() as form:
                for _, part in form.multi_items():
                    if not isinstance(part, UploadFile):
                        continue
                    target = default if default and len(form) == 1 else part.filename
                    data = await part.read()
                    written.append(await self._write(call, target or "", data, metadata))
        else:
            body = await request.body()
            if request.headers.get("content-encoding", "").lower() == "gzip":
                body = self._gunzip(body)
            written.append(await self._write(call, default or "", body, metadata))
        return JSONResponse(written)

    def _gunzip(self, data: bytes) -> bytes:
        """A gzip upload, decompressed no further than fs.write allows (no gzip bombs)."""
        cap = self.gateway.write_policy.max_bytes or self.gateway.settings.gateway.max_body_bytes
        inflater = zlib.decompressobj(wbits=31)
        try:
            out = inflater.decompress(data, cap + 1)
        except zlib.error as e:
            raise InvalidRequest(f"the gzip body is corrupt: {e}") from None
        if len(out) > cap or inflater.unconsumed_tail:
            raise LimitExceeded(f"the upload is over {cap} bytes once decompressed")
        return out

    async def _write(
        self, call: Call, target: str, data: bytes, metadata: dict[str, str]
    ) -> dict[str, Any]:
        path = sandbox_path(target)
        content = base64.b64encode(data).decode()
        parent = posixpath.dirname(path)
        # E2B makes missing parents; an existing one is left alone (no write to judge).
        if not await asyncio.to_thread(self.gateway.runtime.files(call.sandbox_id).exists, parent):
            await call.tool("fs_mkdir", path=parent)
            await self._settle(call)  # a recursive watch covers it before the file comes
        await call.tool("fs_write", path=path, content=content, encoding="base64")
        # The write was judged and audited; its metadata replaces the file's (none: cleared).
        files = self.gateway.runtime.files(call.sandbox_id)
        await asyncio.to_thread(set_file_metadata, files, path, metadata)
        await self._settle(call)
        written = {"name": posixpath.basename(path), "type": "file", "path": path}
        return {**written, "metadata": metadata} if metadata else written


@dataclass
class Watch:
    """A watch of one sandbox's directory, for E2B: its events as FilesystemEvent messages."""

    sandbox_id: str
    watch: DirWatch
    include_entry: bool

    def events(self, hub: Watches) -> list[dict[str, Any]]:
        events = []
        for event in hub.take(self.watch):
            message: dict[str, Any] = {
                "name": posixpath.relpath(event.path, self.watch.path),
                "type": f"EVENT_TYPE_{event.kind.upper()}",
            }
            if self.include_entry:  # envd 0.6.3: best effort, where the entry still is
                with contextlib.suppress(AgentboxError):
                    message["entry"] = entry_info(self.watch.files.stat(event.path).to_dict())
            events.append(message)
        return events


def _path(message: dict[str, Any]) -> str:
    return sandbox_path(str(message.get("path", "")))


def _input(message: dict[str, Any]) -> str:
    """The text of a ProcessInput (``stdin`` or ``pty``, base64 bytes)."""
    given = message.get("input") or {}
    data = given.get("stdin", given.get("pty"))
    if not isinstance(data, str):
        raise ConnectError("invalid_argument", "the input has neither stdin nor pty data")
    return base64.b64decode(data).decode("utf-8", "replace")


def _end(code: int) -> dict[str, Any]:
    status = f"exit status {code}" if code >= 0 else f"signal: {-code}"
    return {"exitCode": code, "exited": True, "status": status}


def _sizes(table: Any, process_id: str) -> tuple[int, int]:
    out_dir = table.root / process_id
    return (out_dir / "stdout").stat().st_size, (out_dir / "stderr").stat().st_size


def _http_error(e: Exception) -> Response:
    error = connect.as_connect(e)
    # E2B's proxy answers 502 for a sandbox that is gone; the SDKs read it so.
    status = 502 if error.code == "unavailable" else connect.HTTP_STATUS[error.code]
    return JSONResponse(e2b_error(status, error.message), status_code=status)
