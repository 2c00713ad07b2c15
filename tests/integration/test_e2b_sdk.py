"""The unmodified E2B Python SDK (``e2b<3``) against a real gateway's ``/e2b`` front door.

Only the three variables an E2B user sets change: ``E2B_API_URL``, ``E2B_SANDBOX_URL``
(both the gateway's ``/e2b``) and ``E2B_API_KEY`` (a project key of ``e2b.api_keys``).
"""

from __future__ import annotations

import asyncio
import datetime
import gzip
import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FilesystemEvent,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry

from gateway_harness import RunningGateway, running_gateway

BOOT_ID = "/proc/sys/kernel/random/boot_id"
KEY_A, KEY_B = "ka-" + secrets.token_hex(16), "kb-" + secrets.token_hex(16)
E2B_YAML = """
e2b:
  api_keys:
    - {name: team-a, project: alpha, key_env: E2B_TEST_KEY_A}
    - {name: team-b, project: beta, key_env: E2B_TEST_KEY_B}
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    env = {"E2B_TEST_KEY_A": KEY_A, "E2B_TEST_KEY_B": KEY_B}
    with running_gateway(
        agentbox_home, tmp_path_factory.mktemp("e2b"), "20s", env=env, extra_yaml=E2B_YAML
    ) as running:
        yield running


@pytest.fixture
def e2b_env(gw: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """What an E2B user changes: the three variables."""
    monkeypatch.setenv("E2B_API_URL", f"{gw.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gw.url}/e2b")
    monkeypatch.setenv("E2B_API_KEY", KEY_A)


def audit_records(gw: RunningGateway) -> list[dict[str, object]]:
    return [json.loads(line) for line in gw.audit_path.read_text().splitlines()]


def test_sync_sdk_commands_files_lifecycle(e2b_env: None) -> None:
    tag = secrets.token_hex(4)
    sb = Sandbox.create(timeout=300, metadata={"suite": tag}, envs={"SANDBOX_WIDE": "yes"})
    try:
        r = sb.commands.run("echo out; echo err >&2; pwd; echo $GREETING", envs={"GREETING": "hi"})
        assert (r.stdout, r.stderr, r.exit_code) == ("out\n/home/user\nhi\n", "err\n", 0)
        assert sb.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
        with pytest.raises(CommandExitException) as failed:
            sb.commands.run("echo nope >&2; exit 3")
        assert (failed.value.exit_code, failed.value.stderr) == (3, "nope\n")

        streamed: list[str] = []
        handle = sb.commands.run("sleep 0.2; echo done", background=True)
        assert handle.pid > 0
        assert handle.pid in [p.pid for p in sb.commands.list()]
        assert handle.wait(on_stdout=streamed.append).stdout == "done\n"
        assert "".join(streamed) == "done\n"
        sleeper = sb.commands.run("sleep 60", background=True)
        assert sb.commands.kill(sleeper.pid)
        with pytest.raises(CommandExitException):
            sleeper.wait()
        assert not sb.commands.kill(sleeper.pid)  # gone: False, as E2B answers

        info = sb.files.write("/workspace/notes/a.txt", "alpha")
        assert (info.name, info.path) == ("a.txt", "/workspace/notes/a.txt")
        sb.files.write("/workspace/notes/b.bin", bytes(range(256)))
        assert sb.files.read("/workspace/notes/a.txt") == "alpha"
        assert bytes(sb.files.read("/workspace/notes/b.bin", format="bytes")) == bytes(range(256))
        names = sorted(e.name for e in sb.files.list("/workspace/notes"))
        assert names == ["a.txt", "b.bin"]
        assert sb.files.exists("/workspace/notes/a.txt")
        assert sb.files.make_dir("/workspace/new")
        assert not sb.files.make_dir("/workspace/new")  # already there
        moved = sb.files.rename("/workspace/notes/a.txt", "/workspace/new/a.txt")
        assert moved.path == "/workspace/new/a.txt"
        assert sb.files.get_info("/workspace/new/a.txt").size == 5
        sb.files.remove("/workspace/new")
        assert not sb.files.exists("/workspace/new/a.txt")
        sb.commands.run("echo home > notes.txt")  # in the user's home, as on E2B
        assert sb.files.read("notes.txt") == "home\n"  # relative: from the home too

        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
        assert [s.sandbox_id for s in listed] == [sb.sandbox_id]
        assert listed[0].metadata == {"suite": tag}
        sb.set_timeout(600)
        assert sb.get_info().template_id == "base"
        again = Sandbox.connect(sb.sandbox_id)
        assert again.commands.run("echo again").stdout == "again\n"
        assert sb.is_running()
    finally:
        sb.kill()
    assert not Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
    assert not Sandbox.kill(sb.sandbox_id)  # already gone


def test_async_sdk(e2b_env: None) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(timeout=120)
        try:
            r = await sb.commands.run("echo async; echo e >&2")
            assert (r.stdout, r.stderr, r.exit_code) == ("async\n", "e\n", 0)
            with pytest.raises(CommandExitException):
                await sb.commands.run("false")
            handle = await sb.commands.run("sleep 0.1; echo bg", background=True)
            assert (await handle.wait()).stdout == "bg\n"
            await sb.files.write("/workspace/x.txt", "async file")
            assert await sb.files.read("/workspace/x.txt") == "async file"
            assert [e.name for e in await sb.files.list("/workspace")] == ["x.txt"]
            await sb.files.remove("/workspace/x.txt")
            assert not await sb.files.exists("/workspace/x.txt")
            paginator = AsyncSandbox.list()
            assert sb.sandbox_id in [s.sandbox_id for s in await paginator.next_items()]
        finally:
            await sb.kill()

    asyncio.run(main())


def test_policy_denials_reach_the_sdk_and_the_audit_names_the_key(
    e2b_env: None, gw: RunningGateway
) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        with pytest.raises(SandboxException, match=r"policy_denied.*curl"):
            sb.commands.run("curl http://example.com")
        with pytest.raises(SandboxException, match="policy_denied"):
            sb.files.write("/workspace/.mcp.json", "{}")  # a protected path
        with pytest.raises(SandboxException, match="policy_denied"):
            sb.files.write("/etc/x", "outside the fs.write root")
        sb.commands.run("true")
    finally:
        sb.kill()
    mine = [r for r in audit_records(gw) if r.get("sandbox") == sb.sandbox_id]
    assert {r["actor"] for r in mine} == {"token:e2b-key:team-a"}
    decisions = [(r["tool"], r["decision"]) for r in mine]
    assert (None, "sandbox_created") in decisions
    assert ("process_start", "denied") in decisions
    assert ("fs_write", "denied") in decisions
    assert ("process_start", "allowed") in decisions
    assert (None, "sandbox_destroyed") in decisions


def test_a_key_reaches_only_its_projects_sandboxes(e2b_env: None, gw: RunningGateway) -> None:
    sb = Sandbox.create(timeout=120)  # team-a, project alpha
    try:
        with pytest.raises(NotFoundException):
            Sandbox.connect(sb.sandbox_id, api_key=KEY_B)
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sb.sandbox_id, api_key=KEY_B)
        assert not Sandbox.kill(sb.sandbox_id, api_key=KEY_B)
        assert sb.sandbox_id not in [s.sandbox_id for s in Sandbox.list(api_key=KEY_B).next_items()]
        with pytest.raises(AuthenticationException):
            Sandbox.list(api_key="not-a-key-" + secrets.token_hex(8)).next_items()
        # The operator token is a key for every project.
        assert (
            Sandbox.get_info(sb.sandbox_id, api_key=gw.operator_token).sandbox_id == sb.sandbox_id
        )
        # Another sandbox's envd token does not open this one.
        other = Sandbox.create(timeout=120, api_key=KEY_B)
        try:
            forged = Sandbox(
                sandbox_id=sb.sandbox_id,
                sandbox_domain=None,
                envd_version=sb._envd_version,
                envd_access_token=other._envd_access_token,
                connection_config=other.connection_config.__class__(
                    extra_sandbox_headers={
                        "E2b-Sandbox-Id": sb.sandbox_id,
                        "X-Access-Token": str(other._envd_access_token),
                    }
                ),
            )
            with pytest.raises(AuthenticationException):
                forged.commands.run("echo should not run")
        finally:
            other.kill()
        assert sb.commands.run("echo still mine").stdout == "still mine\n"
    finally:
        sb.kill()


def test_pause_connect_resumes_and_metrics(e2b_env: None) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        sb.files.write("/workspace/kept.txt", "kept")
        metrics = sb.get_metrics()
        assert len(metrics) == 1 and metrics[0].mem_total > 0
        assert sb.pause()
        assert Sandbox.get_info(sb.sandbox_id).state.value == "paused"
        resumed = Sandbox.connect(sb.sandbox_id)
        assert Sandbox.get_info(sb.sandbox_id).state.value == "running"
        assert resumed.files.read("/workspace/kept.txt") == "kept"
    finally:
        sb.kill()


def test_list_pages_with_next_token(e2b_env: None) -> None:
    tag = secrets.token_hex(4)
    boxes = [Sandbox.create(timeout=120, metadata={"page": tag}) for _ in range(3)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"page": tag}), limit=2)
        first = paginator.next_items()
        assert len(first) == 2 and paginator.has_next
        second = paginator.next_items()
        assert len(second) == 1 and not paginator.has_next
        seen = {s.sandbox_id for s in first + second}
        assert seen == {b.sandbox_id for b in boxes}
    finally:
        for b in boxes:
            b.kill()


SERVICE = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "host": self.headers.get("Host"),
                           "token": self.headers.get("e2b-traffic-access-token")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8765), H).serve_forever()
"""


def test_get_host_reaches_a_port_with_the_sandbox_token(e2b_env: None, gw: RunningGateway) -> None:
    sb = Sandbox.create(timeout=120)
    other = Sandbox.create(timeout=120)
    try:
        sb.commands.run(f"python3 -c '{SERVICE}'", background=True, timeout=0)
        host = sb.get_host(8765)
        assert host == f"8765-{sb.sandbox_id}.e2b.localhost"
        token = {"e2b-traffic-access-token": str(sb.traffic_access_token)}
        with gw.client(headers={"Host": f"{host}:{gw.port}"}) as client:
            deadline = time.monotonic() + 10
            while (r := client.get("/items?x=1", headers=token)).status_code == 404:
                assert time.monotonic() < deadline, r.text  # the service is still starting
                time.sleep(0.05)
            assert r.status_code == 200, r.text
            seen = r.json()
            assert seen["path"] == "/items?x=1" and seen["token"] is None  # not forwarded
            assert client.get("/").status_code == 401  # no token: ports are never public
            wrong = {"e2b-traffic-access-token": str(other.traffic_access_token)}
            assert client.get("/", headers=wrong).status_code == 401
    finally:
        sb.kill()
        other.kill()
    ports = [r for r in audit_records(gw) if r.get("tool") == "ports"]
    assert ports and ports[-1]["actor"] == "token:e2b-key:team-a"


def test_watch_dir_sync_and_async(e2b_env: None) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        sb.files.make_dir("/workspace/w")
        handle = sb.files.watch_dir("/workspace/w")
        sb.files.write("/workspace/w/new.txt", "1")
        events = handle.get_new_events()  # the kernel's events, each step: create, chmod, write
        assert [(e.name, e.type.value) for e in events] == [
            ("new.txt", "create"), ("new.txt", "chmod"), ("new.txt", "write")
        ]  # fmt: skip
        sb.files.write("/workspace/w/new.txt", "12")
        sb.files.remove("/workspace/w/new.txt")
        # the truncate and the write may come as one write event or two, as on E2B
        assert _steps(handle.get_new_events()) == [("new.txt", "write"), ("new.txt", "remove")]
        handle.stop()

        async def watch() -> list[tuple[str, str]]:
            asb = await AsyncSandbox.connect(sb.sandbox_id)
            seen: asyncio.Queue[FilesystemEvent] = asyncio.Queue()
            watcher = await asb.files.watch_dir("/workspace/w", seen.put_nowait, recursive=True)
            await asb.files.write("/workspace/w/sub/deep.txt", "x")  # the parent is made too
            got = [await asyncio.wait_for(seen.get(), 30)]
            while (got[-1].name, got[-1].type.value) != ("sub/deep.txt", "write"):
                got.append(await asyncio.wait_for(seen.get(), 30))
            await watcher.stop()
            return _steps(got)

        assert asyncio.run(watch()) == [
            ("sub", "create"), ("sub", "chmod"),
            ("sub/deep.txt", "create"), ("sub/deep.txt", "chmod"), ("sub/deep.txt", "write"),
        ]  # fmt: skip
    finally:
        sb.kill()


def _steps(events: Iterable[FilesystemEvent]) -> list[tuple[str, str]]:
    """(name, type) of each event, a repeat of the one before it counted once."""
    return _steps_of((e.name, e.type.value) for e in events)


def _steps_of(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    steps: list[tuple[str, str]] = []
    for pair in pairs:
        if not steps or steps[-1] != pair:
            steps.append(pair)
    return steps


def test_watch_sees_the_sandboxs_own_changes_never_through_symlinks(e2b_env: None) -> None:
    """Changes made by a program in the sandbox, each kind in order, in new subdirectories
    too; a symlink in the watched tree (to the sandbox's / or a directory beside) is an
    entry, never watched through."""
    sb = Sandbox.create(timeout=120)
    try:
        # python3: the test gateway's allow list has no ln, chmod, mv or touch
        sb.commands.run(
            'mkdir -p /workspace/w /workspace/beside && python3 -c "import os; '
            "os.symlink('/', '/workspace/w/root'); "
            "os.symlink('/workspace/beside', '/workspace/w/beside')\""
        )
        handle = sb.files.watch_dir("/workspace/w", recursive=True, include_entry=True)
        sb.commands.run("cd /workspace/w && mkdir -p a/b && echo one > a/b/f")
        # A quick program can make a file before the new directory's watch comes: the
        # file is then announced as created when it does, and its write may come first.
        made = [s for s in _steps(handle.get_new_events()) if s != ("a/b/f", "write")]
        assert _steps_of(made) == [("a", "create"), ("a/b", "create"), ("a/b/f", "create")]
        sb.commands.run(  # the watches of a and a/b are in place now: every step is seen
            'cd /workspace/w && python3 -c "import os; '
            "os.chmod('a/b/f', 0o600); os.rename('a/b/f', 'a/g'); os.remove('a/g'); "
            "[open(p, 'w').close() for p in ('/workspace/beside/x', '/tmp/y', '/workspace/z')]\""
        )
        assert _steps(handle.get_new_events()) == [
            ("a/b/f", "chmod"), ("a/b/f", "rename"), ("a/g", "create"), ("a/g", "remove")
        ]  # fmt: skip
        handle.stop()
        # entry info (envd 0.6.3): where the entry still is; a symlink is the link itself
        handle = sb.files.watch_dir("/workspace/w", include_entry=True)
        sb.files.write("/workspace/w/a/h", "hello")
        sb.files.remove("/workspace/w/a/h")
        sb.files.write("/workspace/w/e.txt", "entry")
        events = handle.get_new_events()
        created = next(e for e in events if (e.name, e.type.value) == ("e.txt", "create"))
        assert created.entry is not None
        assert (created.entry.path, created.entry.size) == ("/workspace/w/e.txt", 5)
        assert not [e for e in events if e.name.startswith("a/")]  # not recursive
        handle.stop()
    finally:
        sb.kill()


def _until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)


def test_lifecycle_on_timeout_pause_sync(e2b_env: None, gw: RunningGateway) -> None:
    """on_timeout "pause": the timeout pauses with memory (a process lives on), calls wait
    for a connect unless auto_resume; keep_memory False keeps only the files."""
    sb = Sandbox.create(timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        sb.files.write("/workspace/kept.txt", "kept")
        boot_id = sb.commands.run(f"cat {BOOT_ID}").stdout
        assert boot_id != Path(BOOT_ID).read_text()  # its own, never the host's
        sleeper = sb.commands.run("sleep 600", background=True)
        sb.set_timeout(0)  # the timeout is now: paused, not killed
        _until(lambda: not sb.is_running(), "paused at its timeout")
        assert sb.get_info().state == SandboxState.PAUSED
        with pytest.raises(SandboxException, match="paused"):
            sb.commands.run("true")  # no auto_resume: a call does not wake it
        again = Sandbox.connect(sb.sandbox_id)
        assert again.get_info().state == SandboxState.RUNNING
        assert sleeper.pid in [p.pid for p in again.commands.list()]  # its memory was kept
        assert again.commands.run(f"cat {BOOT_ID}").stdout == boot_id  # not a new boot
        assert again.files.read("/workspace/kept.txt") == "kept"

        assert again.pause(keep_memory=False)  # the filesystem only: agentbox stops it
        assert not again.is_running()
        back = Sandbox.connect(sb.sandbox_id)
        assert back.files.read("/workspace/kept.txt") == "kept"
        assert sleeper.pid not in [p.pid for p in back.commands.list()]
        assert back.commands.run(f"cat {BOOT_ID}").stdout != boot_id  # started again: a boot
    finally:
        sb.kill()
    paused = [r for r in audit_records(gw) if r.get("decision") == "sandbox_paused"]
    assert (paused[-1]["sandbox"], paused[-1]["keep_memory"]) == (sb.sandbox_id, False)


def test_lifecycle_auto_resume_async(e2b_env: None) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(
            timeout=120,
            lifecycle={"on_timeout": {"action": "pause", "keep_memory": True}, "auto_resume": True},
        )
        try:
            await sb.set_timeout(0)
            deadline = time.monotonic() + 30
            while (await sb.get_info()).state != SandboxState.PAUSED:
                assert time.monotonic() < deadline, "not paused at its timeout"
                await asyncio.sleep(0.05)
            # auto_resume: a call wakes it, and its timeout runs again from then
            assert (await sb.commands.run("echo awake")).stdout == "awake\n"
            assert (await sb.get_info()).state == SandboxState.RUNNING
        finally:
            await sb.kill()

    asyncio.run(main())


def test_snapshots_sync_scoped_to_the_project(e2b_env: None, gw: RunningGateway) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        sb.files.write("/workspace/snap.txt", "in the snapshot")
        sb.commands.run("echo home too > /home/user/home.txt")  # the writable layer: kept
        snap = sb.create_snapshot(name="nightly")
        assert snap.snapshot_id.startswith("snap-") and snap.names == ["nightly"]
        listed = Sandbox.list_snapshots(sandbox_id=sb.sandbox_id).next_items()
        assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
        assert Sandbox.list_snapshots(name="nightly").next_items()[0].names == ["nightly"]
        # another project's key: no such snapshot to list, restore or delete
        assert snap.snapshot_id not in [
            s.snapshot_id for s in Sandbox.list_snapshots(api_key=KEY_B).next_items()
        ]
        with pytest.raises(SandboxException, match="not found"):
            Sandbox.create(snap.snapshot_id, api_key=KEY_B)
        assert not Sandbox.delete_snapshot(snap.snapshot_id, api_key=KEY_B)

        restored = Sandbox.create(snap.snapshot_id, timeout=60, envs={"FROM": "snap"})
        try:
            assert restored.files.read("/workspace/snap.txt") == "in the snapshot"
            assert restored.commands.run("cat /home/user/home.txt").stdout == "home too\n"
            assert restored.commands.run("echo $FROM").stdout == "snap\n"
        finally:
            restored.kill()
        assert Sandbox.delete_snapshot(snap.snapshot_id)
        assert not Sandbox.delete_snapshot(snap.snapshot_id)  # already gone
    finally:
        sb.kill()
    records = audit_records(gw)
    made = [r for r in records if r.get("decision") == "snapshot_created"]
    assert made[-1]["actor"] == "token:e2b-key:team-a"
    assert any(r.get("snapshot") == snap.snapshot_id and r.get("decision") == "sandbox_created"
               for r in records)  # fmt: skip


def test_snapshots_async(e2b_env: None) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(timeout=120)
        try:
            await sb.files.write("/workspace/a.txt", "async snapshot")
            snap = await AsyncSandbox.create_snapshot(sb.sandbox_id)
            other = await AsyncSandbox.create(snap.snapshot_id, timeout=60)
            try:
                assert await other.files.read("/workspace/a.txt") == "async snapshot"
            finally:
                await other.kill()
            assert await AsyncSandbox.delete_snapshot(snap.snapshot_id)
        finally:
            await sb.kill()

    asyncio.run(main())


def test_fork_sync_and_async(e2b_env: None, gw: RunningGateway) -> None:
    sb = Sandbox.create(timeout=120, metadata={"kind": "source"})
    try:
        sb.files.write("/workspace/state.txt", "before")
        (fork,) = sb.fork(timeout=60)
        assert isinstance(fork, Sandbox) and fork.sandbox_id != sb.sandbox_id
        try:
            assert fork.files.read("/workspace/state.txt") == "before"
            fork.files.write("/workspace/state.txt", "in the fork")
            assert sb.files.read("/workspace/state.txt") == "before"
            assert fork.get_info().metadata == {"kind": "source"}
            # another project's key: no such sandbox to fork
            with pytest.raises(NotFoundException):
                Sandbox.fork(sb.sandbox_id, api_key=KEY_B)

            async def main() -> list[str]:
                forks = await AsyncSandbox.fork(sb.sandbox_id, count=2, timeout=60)
                ids = [f.sandbox_id for f in forks if isinstance(f, AsyncSandbox)]
                for f in forks:
                    assert isinstance(f, AsyncSandbox)
                    await f.kill()
                return ids

            assert len(set(asyncio.run(main()))) == 2
        finally:
            fork.kill()
    finally:
        sb.kill()
    made = [r for r in audit_records(gw)
            if r.get("forked_from") == sb.sandbox_id and r["decision"] == "sandbox_created"]  # fmt: skip
    assert len(made) == 3 and {r["actor"] for r in made} == {"token:e2b-key:team-a"}


def test_file_metadata_sync_and_async(e2b_env: None) -> None:
    """envd 0.6.2 metadata: user.e2b.* xattrs of the file, however they were set."""
    sb = Sandbox.create(timeout=60)
    try:
        info = sb.files.write("/workspace/m.txt", "x", metadata={"Owner": "me", "step": "1"})
        assert info.metadata == {"owner": "me", "step": "1"}  # keys lowercased, as envd does
        assert sb.files.get_info("/workspace/m.txt").metadata == {"owner": "me", "step": "1"}
        listed = {e.name: e.metadata for e in sb.files.list("/workspace")}
        assert listed["m.txt"] == {"owner": "me", "step": "1"}
        moved = sb.files.rename("/workspace/m.txt", "/workspace/n.txt")
        assert moved.metadata == {"owner": "me", "step": "1"}
        assert sb.files.write("/workspace/n.txt", "y").metadata is None  # overwritten: cleared
        assert sb.files.get_info("/workspace/n.txt").metadata is None
        sb.commands.run(  # set in the sandbox: the same metadata
            "python3 -c \"import os; os.setxattr('/workspace/n.txt', 'user.e2b.by', b'shell')\""
        )
        assert sb.files.get_info("/workspace/n.txt").metadata == {"by": "shell"}

        async def main() -> None:
            asb = await AsyncSandbox.connect(sb.sandbox_id)
            infos = await asb.files.write_files(
                [WriteEntry(path="/workspace/a1", data="1"), WriteEntry(path="/workspace/a2",
                 data="2")], metadata={"batch": "b"},
            )  # fmt: skip
            assert [i.metadata for i in infos] == [{"batch": "b"}, {"batch": "b"}]
            assert (await asb.files.get_info("/workspace/a2")).metadata == {"batch": "b"}

        asyncio.run(main())
    finally:
        sb.kill()


def test_details_the_sdk_relies_on(e2b_env: None) -> None:
    """What E2B's own suite checks and a first cut got wrong (each was a failing test)."""
    sb = Sandbox.create(timeout=120, metadata={"details": "1"})
    try:
        sb.files.make_dir("/workspace/d")
        sb.files.write("/workspace/d/f.txt", "x")
        assert sb.files.get_info("/workspace/d").permissions == "drwxr-xr-x"
        assert sb.files.get_info("/workspace/d/f.txt").permissions.startswith("-rw")
        sb.commands.run("python3 -c \"import os; os.symlink('f.txt', '/workspace/d/link')\"")
        assert sb.files.get_info("/workspace/d/link").symlink_target == "/workspace/d/f.txt"
        sb.files.remove("/workspace/d/never-was")  # envd: nothing to remove is fine
        sb.files.write("/workspace/d/z.txt", "zipped", gzip=True)  # Content-Encoding: gzip
        assert sb.files.read("/workspace/d/z.txt") == "zipped"
        newer = Sandbox.create(timeout=120, metadata={"details": "1"})
        try:
            listed = Sandbox.list(query=SandboxQuery(metadata={"details": "1"})).next_items()
            assert [s.sandbox_id for s in listed] == [
                newer.sandbox_id,
                sb.sandbox_id,
            ]  # newest first
            started = sb.get_info().started_at
            after = Sandbox.list(
                query=SandboxQuery(metadata={"details": "1"}, started_after=started)
            )
            assert sb.sandbox_id in [s.sandbox_id for s in after.next_items()]
            later = SandboxQuery(
                metadata={"details": "1"}, started_after=newer.get_info().started_at
            )
            assert [s.sandbox_id for s in Sandbox.list(query=later).next_items()] == [
                newer.sandbox_id
            ]
        finally:
            newer.kill()
        past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=2)
        assert sb.get_metrics(start=past, end=past + datetime.timedelta(minutes=1)) == []
        sleeper = sb.commands.run("sleep 60", background=True)
        sb.kill()
        with pytest.raises(TimeoutException, match="sandbox was killed or reached its end of life"):
            sleeper.wait()
    finally:
        sb.kill()


def test_a_shortened_timeout_ends_the_sandbox(e2b_env: None) -> None:
    sb = Sandbox.create(timeout=120)
    set_at = time.time()
    sb.set_timeout(1)
    time.sleep(max(0.0, set_at + 1.2 - time.time()))  # the end is an instant of the clock
    # Gone for the SDK at once, not at the next lifecycle sweep.
    assert not sb.is_running()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sb.sandbox_id)


def test_a_gzip_upload_is_bounded_once_decompressed(e2b_env: None, gw: RunningGateway) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        bomb = gzip.compress(b"\0" * (17 << 20))  # 17 MiB: past fs.write's 16 MiB default
        headers = {"E2b-Sandbox-Id": sb.sandbox_id, "X-Access-Token": str(sb._envd_access_token),
                   "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}  # fmt: skip
        with gw.client(headers=headers) as envd:
            r = envd.post("/e2b/files", params={"path": "/workspace/bomb"}, content=bomb)
        assert r.status_code == 429 and "decompressed" in r.json()["message"], r.text
        assert not sb.files.exists("/workspace/bomb")
    finally:
        sb.kill()


def test_malformed_envd_messages_get_connect_errors(e2b_env: None, gw: RunningGateway) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        headers = {"E2b-Sandbox-Id": sb.sandbox_id, "X-Access-Token": str(sb._envd_access_token)}
        with gw.client(headers=headers) as envd:
            r = envd.post("/e2b/process.Process/SendSignal", json={"process": {"pid": "x"}})
            assert (r.status_code, r.json()["code"]) == (500, "internal"), r.text
            r = envd.post("/e2b/filesystem.Filesystem/Stat", content=b"[1]",
                          headers={"Content-Type": "application/json"})  # fmt: skip
            assert (r.status_code, r.json()["code"]) == (400, "invalid_argument"), r.text
            r = envd.post("/e2b/process.Process/Nope", json={})
            assert (r.status_code, r.json()["code"]) == (501, "unimplemented"), r.text
    finally:
        sb.kill()


def test_signed_file_urls(e2b_env: None, gw: RunningGateway) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        sb.files.write("/workspace/signed.txt", "signed content")
        url = sb.download_url("/workspace/signed.txt")
        assert url.startswith(f"{gw.url}/files?") and "signature=v1_" in url
        with gw.client() as anonymous:  # no token, no sandbox header: the signature says it
            assert anonymous.get(url).text == "signed content"
            timed = sb.download_url("/workspace/signed.txt", use_signature_expiration=60)
            assert anonymous.get(timed).text == "signed content"
            expired = sb.download_url("/workspace/signed.txt", use_signature_expiration=-10)
            assert anonymous.get(expired).status_code == 401
            forged = url.replace("signed.txt", "other.txt")
            assert anonymous.get(forged).status_code == 401
            upload = sb.upload_url("/workspace/up.txt")
            r = anonymous.post(upload, files={"file": ("up.txt", b"uploaded")})
            assert r.status_code == 200, r.text
        assert sb.files.read("/workspace/up.txt") == "uploaded"
    finally:
        sb.kill()


def test_network_options_are_mapped_or_refused(e2b_env: None, gw: RunningGateway) -> None:
    """deny_out=[ALL_TRAFFIC] is network none; options agentbox cannot honour are refused
    naming the field, and nothing is created (a caller asking for a restriction never gets
    a sandbox without it)."""
    from e2b.sandbox.network import ALL_TRAFFIC

    sb = Sandbox.create(timeout=120, network={"deny_out": [ALL_TRAFFIC]})
    try:
        with gw.operator() as op:
            shown = op.get(f"/v1/sandboxes/{sb.sandbox_id}").json()
        assert shown["network"]["mode"] == "none"
    finally:
        sb.kill()
    with gw.operator() as op:
        before = len(op.get("/v1/sandboxes").json())
    for options, field in (
        ({"allow_out": ["8.8.8.8"], "deny_out": [ALL_TRAFFIC]}, "allowOut"),
        ({"deny_out": ["10.0.0.0/8"]}, "denyOut"),
        ({"allow_public_traffic": True}, "allowPublicTraffic"),
    ):
        with pytest.raises(Exception, match=f"network.{field}") as refused:
            Sandbox.create(timeout=120, network=options)  # type: ignore[arg-type]
        assert "agentbox" in str(refused.value)
    with gw.operator() as op:
        assert len(op.get("/v1/sandboxes").json()) == before
