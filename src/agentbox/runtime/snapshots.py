"""Snapshots: a sandbox's writable layer and /workspace, scanned for secrets, as a
content-addressed zstd tarball in an object store (a folder, or S3).

Taking one never stops the sandbox for long: its filesystem is frozen only while its disk
image is cloned (copy-on-write, O(1)); the clone is mounted read-only on the host and
scanned and archived from there while the sandbox carries on.

* **What is kept**: ``upper/`` (everything written outside /workspace and /tmp: installed
  packages, $HOME, /etc changes, overlay whiteouts and opaque directories) and
  ``workspace/``. Ownership is stored as the sandbox's own ids (1000 for the agent's
  files), so a restore maps it to the new sandbox's host ids. /tmp and processes are not
  kept.
* **Secret scan** (detect-secrets, ``storage.secretscan``) in the archive's own read of
  each file (``storage.scanarchive``: the bytes stored are the bytes scanned), before
  anything reaches the store: a finding refuses the snapshot with a report of path, line
  and kind (never the value), unless the caller redacts (each value replaced by
  ``[REDACTED:kind]`` in the stored copy) or allow-lists it.
* **Addressing**: the id is ``snap-`` + the first 32 hex digits of the SHA-256 of the
  uncompressed tar, so the same content is stored once; restore checks the digest. Two
  objects per snapshot: ``snapshots/<id>.tar.zst`` and ``snapshots/<id>.json`` (metadata).
* **Restore** builds a new sandbox from the same template (by digest) and extracts the
  archive into its fresh disk with tarfile's ``tar`` filter (no absolute paths, nothing
  resolving outside the disk) before anything runs on it. The home a snapshot was taken
  in keeps that template (a pin in ``templates/pins/``) until the snapshot is deleted
  through it, even when its name is rebuilt or removed meanwhile; another home restores
  it only if it has the same digest.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import json
import os
import secrets
import shutil
import stat
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from agentbox.errors import InvalidRequest, SecretsFound, SnapshotNotFound
from agentbox.hints import Hint
from agentbox.isolation import disk, diskpool
from agentbox.runtime import archive as tar_entries
from agentbox.runtime.host import SandboxHost
from agentbox.runtime.spec_input import spec_from
from agentbox.runtime.store import SandboxRecord
from agentbox.storage import hashedzstd, scanarchive, secretscan, zstdpipe
from agentbox.storage.forwardread import ForwardReader
from agentbox.storage.objectstore import ObjectStore

if TYPE_CHECKING:
    from agentbox.config.specs import SandboxSpec
    from agentbox.runtime.templates import Template, TemplateStore

KEPT = ("upper", "workspace")
# Snapshots are written by this module alone: a name or type it never makes was made by
# someone else (the store is not trusted), so exact names and the kept parts only.
_ENTRIES = tar_entries.EntryPolicy(
    "snapshot entry",
    "snapshots hold files, directories, links and overlay whiteouts only",
    special=frozenset({"whiteout"}),
    top=KEPT,
    exact=True,
    escape=InvalidRequest,
)
SANDBOX_ID = 1000  # the agent's uid and gid inside every sandbox
_OPAQUE = "trusted.overlay.opaque"
_PAX_OPAQUE = "SCHILY.xattr." + _OPAQUE
_ZSTD_LEVEL = 3


@dataclass
class SnapshotInfo:
    id: str
    sandbox: str
    template: str
    template_digest: str
    spec: dict[str, Any]
    created_at: float
    size: int  # compressed bytes in the store
    raw_size: int  # uncompressed tar bytes
    files: int
    sha256: str
    redacted: list[str] = field(default_factory=list)  # sandbox paths whose secrets went
    # A snapshot with memory (runtime.memory_snapshots): its checkpoint image's sha256,
    # size and the slot (host uid) its processes run as; None: files only.
    memory: dict[str, Any] | None = None
    # Files the secret scan did not wholly read: {"path", "reason"} (over its byte budget,
    # unreadable). Stored, returned and audited, so a hidden corner is never silent.
    unscanned: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def scan_audit(self) -> dict[str, Any]:
        """The audit record's account of what the secret scan did not read (bounded)."""
        return {"unscanned": self.unscanned[:20], "unscanned_count": len(self.unscanned)}


def data_key(snapshot_id: str) -> str:
    return f"snapshots/{snapshot_id}.tar.zst"


def meta_key(snapshot_id: str) -> str:
    return f"snapshots/{snapshot_id}.json"


def memory_key(snapshot_id: str) -> str:
    """A snapshot with memory's checkpoint image (runsc's, as it wrote it)."""
    return f"snapshots/{snapshot_id}.checkpoint.img"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(hashedzstd.CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Runtime(Protocol):
    """What snapshots use of ``runtime.runtime.Runtime``, which makes them (its
    ``snapshots()``): described here so that this module needs not import it."""

    home: Path

    @property
    def templates(self) -> TemplateStore: ...

    def get(self, sandbox_id: str) -> SandboxRecord: ...

    def create_filled(self, fill: Fill, *, actor: str = "local") -> SandboxRecord: ...


@dataclass(frozen=True)
class Fill:
    """A sandbox to create with its disk filled by ``populate(host, disk)`` before anything
    runs on it (``Runtime.create_filled``): a restore."""

    spec: SandboxSpec
    template: Template
    populate: Callable[[SandboxHost, Path], None]
    slot: int | None = None  # that slot (its uid), or a Conflict; None: any free one
    details: dict[str, Any] = field(default_factory=dict)  # for the "created" event


class Snapshots:
    def __init__(self, runtime: Runtime, store: ObjectStore) -> None:
        self.runtime = runtime
        self.store = store
        self.scratch = runtime.home / "lib" / "snapshot-tmp"
        # Bytes the secret scan reads at most per snapshot (holes are free); past it,
        # files are listed in SnapshotInfo.unscanned. None: every byte.
        self.scan_budget: int | None = secretscan.MAX_SCAN_BYTES

    # taking -------------------------------------------------------------------------------
    def create(
        self,
        sandbox_id: str,
        *,
        redact: bool = False,
        allowlist: secretscan.AllowList | None = None,
    ) -> SnapshotInfo:
        record = self.runtime.get(sandbox_id)
        if record.state not in ("running", "paused", "stopped"):
            raise InvalidRequest(f"sandbox {sandbox_id} is {record.state}; nothing to snapshot")
        return self.create_from(record, redact=redact, allowlist=allowlist)

    def create_from(
        self,
        record: SandboxRecord,
        *,
        redact: bool = False,
        allowlist: secretscan.AllowList | None = None,
        memory_image: Path | None = None,
    ) -> SnapshotInfo:
        """The snapshot of ``record``'s disk; with ``memory_image`` (a checkpoint of its
        processes, taken while nothing ran: runtime.memory_snapshots) that too."""
        sandbox_id = record.id
        source = SandboxHost(self.runtime.home, sandbox_id, record.slot)
        self.scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._frozen_view(source) as frozen:
            view = frozen.path
            if memory_image is not None:  # a secret in memory cannot be redacted out
                image_findings = self._scan_image(memory_image, allowlist)
                if image_findings:
                    raise SecretsFound(
                        f"snapshot of {sandbox_id} with memory refused: the secret scan "
                        f"found {len(image_findings)} secret(s) in its processes' memory "
                        "(which cannot be redacted); snapshot without --memory, or "
                        f"allow-list them.\n{secretscan.format_report(image_findings)}",
                        findings=[
                            {"path": f.path, "line": f.line, "kind": f.kind} for f in image_findings
                        ],
                    )
            staging = self.scratch / f"snap-{secrets.token_hex(8)}.tar.zst"
            try:
                outcome, digest, raw_size = self._archive(
                    view, source, staging, redact=redact, allowlist=allowlist
                )
                frozen.release()  # read: its unmount runs beside the store's fsync
                findings = outcome.findings
                if findings and not redact:
                    raise SecretsFound(
                        f"snapshot of {sandbox_id} refused: the secret scan found "
                        f"{len(findings)} secret(s).\n{secretscan.format_report(findings)}",
                        findings=[
                            {"path": f.path, "line": f.line, "kind": f.kind} for f in findings
                        ],
                    )
                memory = None
                snapshot_digest = digest
                if memory_image is not None:
                    memory = {
                        "sha256": _file_sha256(memory_image),
                        "size": memory_image.stat().st_size,
                        "slot": record.slot,
                    }
                    # The same files with other memory: another snapshot.
                    snapshot_digest = hashlib.sha256(
                        f"{digest}:{memory['sha256']}".encode()
                    ).hexdigest()
                info = SnapshotInfo(
                    id="snap-" + snapshot_digest[:32],
                    sandbox=sandbox_id,
                    template=record.template,
                    template_digest=record.template_digest,
                    spec=record.spec.model_dump(mode="json"),
                    created_at=time.time(),
                    size=staging.stat().st_size,
                    raw_size=raw_size,
                    files=outcome.entries,
                    sha256=digest,
                    redacted=sorted({f.path for f in findings}),
                    memory=memory,
                    unscanned=outcome.unscanned,
                )
                if not self.store.exists(data_key(info.id)):  # same content: stored once
                    self.store.put_file(data_key(info.id), staging, move=True)
                if memory_image is not None and not self.store.exists(memory_key(info.id)):
                    self.store.put_file(memory_key(info.id), memory_image)
                self._put_meta(info)
                # Its restore needs this very tree: kept here while the snapshot exists.
                self.runtime.templates.pin(info.id, info.template_digest)
            finally:
                staging.unlink(missing_ok=True)
        return info

    @contextlib.contextmanager
    def _frozen_view(self, source: SandboxHost) -> Iterator[_View]:
        """A read-only mount of a copy-on-write clone of the sandbox's disk, taken while
        its filesystem was frozen: one consistent instant, the sandbox running on. Gone
        (unmounted, the clone deleted) when the block ends."""
        pool = diskpool.ensure(self.runtime.home)
        name = f".snapshot-{secrets.token_hex(8)}"
        image, mountpoint = pool / f"{name}.img", self.scratch / name
        with diskpool.frozen(source.disk):
            disk.clone_file(source.image, image)
        try:
            disk.mount_disk(image, mountpoint, readonly=True, direct_io=True)  # read once
        except BaseException:
            image.unlink(missing_ok=True)
            raise
        view = _View(mountpoint, image)
        try:
            yield view
        finally:
            view.release()
            view.wait()

    def _scan_image(
        self, image: Path, allowlist: secretscan.AllowList | None
    ) -> list[secretscan.Finding]:
        findings = []
        for f in secretscan.scan_tree(image.parent):
            finding = secretscan.Finding("(memory) " + f.path, f.line, f.kind)
            if allowlist is None or not allowlist.allows(finding):
                findings.append(finding)
        return sorted(findings)

    def _archive(
        self,
        view: Path,
        source: SandboxHost,
        target: Path,
        *,
        redact: bool,
        allowlist: secretscan.AllowList | None,
    ) -> tuple[scanarchive.Outcome, str, int]:
        """Scan ``view``'s kept parts and write their tar.zst to ``target`` in one read of
        each file (``storage.scanarchive``); return the outcome, the tar's SHA-256 and
        its size. A secret to redact in a file too big to hold back until its scan ended
        costs a second run, which holds that file."""

        def ids(uid: int, gid: int) -> tuple[int, int]:
            return _inside_id(uid, source.host_uid), _inside_id(gid, source.host_gid)

        tree = scanarchive.Tree(view, KEPT, sandbox_path, ids, _opaque_header)
        hold: frozenset[str] = frozenset()
        for _ in range(2):
            with target.open("wb") as out, zstdpipe.writer(out, level=_ZSTD_LEVEL) as sink:
                outcome = scanarchive.archive(
                    tree, sink, allow=allowlist, redact=redact, budget=self.scan_budget, hold=hold
                )
                if not outcome.complete:
                    sink.abandon()
            if outcome.complete or (outcome.findings and not redact):
                return outcome, sink.sha256.hexdigest(), sink.size
            if outcome.hold <= hold:  # held this time and still not whole: it changed
                break
            hold = frozenset(outcome.hold)
        raise InvalidRequest(
            "the snapshot's files changed while they were read (their frozen copy "
            "cannot change: the host's disk is failing?); take the snapshot again"
        )

    # restoring ----------------------------------------------------------------------------
    def restore(
        self, snapshot_id: str, *, actor: str = "local", spec: dict[str, Any] | None = None
    ) -> SandboxRecord:
        """A new sandbox with the snapshot's files; ``spec``: fields that replace those of
        the snapshotted sandbox's spec (its lifetime, project, env, ...)."""
        info = self.get(snapshot_id)
        if info.memory is not None and (spec or {}).get("isolation", "gvisor") != "gvisor":
            raise InvalidRequest(
                f"snapshot {snapshot_id} holds running processes, which only isolation "
                "gvisor can restore; restore it without changing its isolation"
            )
        template = self.runtime.templates.exact(info.template, info.template_digest)
        self.scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.ExitStack() as stack:
            archive = stack.enter_context(self.store.reading(data_key(info.id), self.scratch))
            image_dir = None
            if info.memory is not None:
                image_dir = stack.enter_context(self._fetch_image(info))

            def fill(host: SandboxHost, target: Path) -> None:
                _extract(archive, target, host, info.sha256)
                if image_dir is not None:  # launch restores the processes, not boots
                    host.memory_image = image_dir  # type: ignore[attr-defined]

            # A memory snapshot's processes keep their uid: the slot that names it.
            slot = None if info.memory is None else int(info.memory["slot"])
            fill_spec = spec_from({**info.spec, **(spec or {})})
            return self.runtime.create_filled(
                Fill(fill_spec, template, fill, slot, {"snapshot": info.id}), actor=actor
            )
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _fetch_image(self, info: SnapshotInfo) -> Iterator[Path]:
        """A directory holding the snapshot's checkpoint image, its digest checked."""
        assert info.memory is not None
        image_dir = self.scratch / f"restore-{secrets.token_hex(8)}"
        image_dir.mkdir(mode=0o700)
        try:
            image = image_dir / "checkpoint.img"  # the name runsc restore reads
            self.store.get_file(memory_key(info.id), image)
            digest = hashlib.sha256()
            with image.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            if digest.hexdigest() != info.memory.get("sha256"):
                raise InvalidRequest("the snapshot's memory image does not match its digest")
            yield image_dir
        finally:
            shutil.rmtree(image_dir, ignore_errors=True)

    # listing ------------------------------------------------------------------------------
    def get(self, snapshot_id: str) -> SnapshotInfo:
        if not snapshot_id.startswith("snap-") or not snapshot_id[5:].isalnum():
            raise InvalidRequest(f"{snapshot_id!r} is not a snapshot id (snap-<hex>)")
        self.scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self.scratch / f"meta-{secrets.token_hex(8)}.json"
        try:
            try:
                self.store.get_file(meta_key(snapshot_id), staging)
            except SnapshotNotFound:
                raise SnapshotNotFound(
                    f"snapshot {snapshot_id} is not in {self.store.url}",
                    hint=Hint("snapshot_list", {}, "{call} to list them"),
                ) from None
            return SnapshotInfo(**json.loads(staging.read_text()))
        finally:
            staging.unlink(missing_ok=True)

    def list(self) -> list[SnapshotInfo]:
        out = []
        for obj in self.store.list("snapshots/"):
            if obj.key.endswith(".json"):
                with contextlib.suppress(SnapshotNotFound, ValueError, TypeError):
                    out.append(self.get(obj.key.removeprefix("snapshots/").removesuffix(".json")))
        return sorted(out, key=lambda s: s.created_at)

    def delete(self, snapshot_id: str) -> None:
        self.get(snapshot_id)  # a clear error for an unknown id
        self.store.delete(meta_key(snapshot_id))
        self.store.delete(data_key(snapshot_id))
        self.store.delete(memory_key(snapshot_id))
        self.runtime.templates.unpin(snapshot_id)

    def apply_retention(self, max_count: int | None, max_age: float | None) -> builtins.list[str]:
        """Delete the oldest snapshots beyond ``max_count`` and any older than ``max_age``
        seconds; returns the ids deleted."""
        doomed = beyond_retention(self.list(), max_count, max_age)
        for snapshot_id in doomed:
            self.delete(snapshot_id)
        return doomed

    def _put_meta(self, info: SnapshotInfo) -> None:
        staging = self.scratch / f"meta-{secrets.token_hex(8)}.json"
        try:
            staging.write_text(json.dumps(info.to_dict(), indent=1))
            self.store.put_file(meta_key(info.id), staging)
        finally:
            staging.unlink(missing_ok=True)


class _View:
    """A mounted clone (``_frozen_view``) and its removal, which may start before the
    block ends (``release``) and run beside what follows: at 1 GB its unmount took
    0.1-0.17 s (the clone's cached pages are freed), as long as the archive's fsync
    waits for the disk anyway."""

    def __init__(self, path: Path, image: Path) -> None:
        self.path = path
        self._image = image
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _remove(self) -> None:
        try:
            try:
                disk.unmount(self.path)
                with contextlib.suppress(OSError):
                    self.path.rmdir()
            finally:
                self._image.unlink(missing_ok=True)
        except BaseException as e:  # raised by ``wait``, in the caller
            self._error = e

    def release(self) -> None:
        """Start removing it, on a thread of its own (no more reads of ``path``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._remove, name="snapshot-unmount")
            self._thread.start()

    def wait(self) -> None:
        """Wait for its removal; its error, if any, raised here."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def beyond_retention(
    snapshots: list[SnapshotInfo], max_count: int | None, max_age: float | None
) -> list[str]:
    """Ids of ``snapshots`` (oldest first) a retention of ``max_count`` newest and
    ``max_age`` seconds would delete."""
    now = time.time()
    doomed = [s.id for s in snapshots if max_age is not None and now - s.created_at > max_age]
    if max_count is not None and len(snapshots) > max_count:
        doomed += [s.id for s in snapshots[: len(snapshots) - max_count]]
    return sorted(set(doomed))


def sandbox_path(part: str, rel: str) -> str:
    """Where a file of a kept part is inside the sandbox (what reports show)."""
    rel = rel.lstrip("/")
    return f"/workspace/{rel}" if part == "workspace" else f"/{rel}"


def _inside_id(host_id: int, sandbox_host_id: int) -> int:
    return SANDBOX_ID if host_id == sandbox_host_id else host_id


def _opaque_header(dir_fd: int) -> dict[str, str]:
    """An overlay opaque directory's mark, kept as a PAX xattr header."""
    with contextlib.suppress(OSError):
        if os.getxattr(dir_fd, _OPAQUE) == b"y":
            return {_PAX_OPAQUE: "y"}
    return {}


def _extract(archive: IO[bytes], target: Path, host: SandboxHost, sha256: str) -> None:
    """Unpack a snapshot into a fresh disk (nothing else writes to it meanwhile). Every
    entry is checked: only the kept parts, no absolute path or ``..``, never written
    through a symlink, no device but overlay whiteouts; the agent's files get this
    sandbox's host ids. The whole stream must match the snapshot's digest."""
    directories: list[tuple[Path, tarfile.TarInfo]] = []
    with zstdpipe.reader(archive) as hashing:
        stream = ForwardReader(io.BufferedReader(hashing, hashedzstd.CHUNK))
        with tarfile.open(fileobj=stream, mode="r:") as tar:  # see storage.forwardread
            for member in tar:
                entry = tar_entries.checked(member, _ENTRIES)
                path = _checked_path(target, entry.parts, member.name)
                _make(stream, member, path, target, entry.link)
                uid = host.host_uid if member.uid == SANDBOX_ID else member.uid
                gid = host.host_gid if member.gid == SANDBOX_ID else member.gid
                os.lchown(path, uid, gid)
                if member.isdir():
                    directories.append((path, member))  # times and modes after their files
                elif not member.issym():
                    os.chmod(path, member.mode & 0o1777)  # no setuid/setgid bits
                    os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
        while stream.read(hashedzstd.CHUNK):  # the tar's end padding is part of the digest
            continue
    if hashing.sha256.hexdigest() != sha256:
        raise InvalidRequest("the snapshot's content does not match its digest (damaged?)")
    for path, member in reversed(directories):
        if member.pax_headers.get(_PAX_OPAQUE) == "y":
            os.setxattr(path, _OPAQUE, b"y", follow_symlinks=False)
        os.chmod(path, member.mode & 0o1777)
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)


def _checked_path(target: Path, parts: tuple[str, ...], name: str) -> Path:
    """``target/PARTS`` for an archive entry whose name was checked (``_ENTRIES``),
    refusing parents that are not real directories (a symlink planted by an earlier
    entry)."""
    parent = target
    for part in parts[:-1]:
        parent = parent / part
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            os.mkdir(parent, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise InvalidRequest(f"snapshot entry {name!r} goes through a non-directory")
    return target.joinpath(*parts)


def _make(
    stream: ForwardReader,
    member: tarfile.TarInfo,
    path: Path,
    target: Path,
    link: tuple[str, ...] | None,
) -> None:
    if member.isdir():
        if not path.is_dir() or path.is_symlink():
            os.mkdir(path, 0o700)
    elif member.type in (tarfile.REGTYPE, tarfile.AREGTYPE):  # never sparse: none is written
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(path, flags, 0o600), "wb", buffering=0) as out:
            stream.seek(member.offset_data)  # where tarfile left it: right after the header
            if stream.copy_into(out, member.size, hashedzstd.CHUNK) != member.size:
                raise InvalidRequest(f"snapshot entry {member.name!r} is cut short (damaged?)")
    elif member.issym():
        os.symlink(member.linkname, path)  # resolved inside the sandbox, never here
    elif link is not None:
        other = _checked_path(target, link, member.linkname)
        if not stat.S_ISREG(os.lstat(other).st_mode):
            raise InvalidRequest(f"snapshot entry {member.name!r} links to a non-file")
        os.link(other, path, follow_symlinks=False)
    elif member.ischr():  # an overlay whiteout: the one device _ENTRIES lets through
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    else:  # sparse and contiguous files pass as regular for tarfile; a snapshot has none
        raise InvalidRequest(f"snapshot entry {member.name!r} has a type snapshots never hold")
