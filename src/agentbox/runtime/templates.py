"""Templates: the read-only root filesystems that sandboxes overlay.

Three kinds, one store:

* ``default`` — synthesised on first use, nothing downloaded: empty ``usr/`` (the sandbox
  bind-mounts the host's ``/usr`` there, ``host_usr=True``), usr-merge symlinks, a few
  directories and a synthesised ``/etc``. Nothing is ever copied from the host ``/etc``
  except the public CA bundle, the ``/etc/alternatives`` symlinks that point into
  ``/usr`` (without them ``awk``, ``editor``, ... would dangle) and the dynamic linker's
  cache ``/etc/ld.so.cache`` (an index of the libraries in the same ``/usr``; without it
  every program start probes ~40 directories for each library). Its digest hashes the
  synthesised content, so a change to the synthesis (or to the CA bundle) makes a new one.
* built — ``mmdebstrap --variant=apt --include=PKGS SUITE DIR`` run as root. When no
  mirror is given it uses the host's own Debian apt sources (``/etc/apt/sources.list`` and
  ``sources.list.d/``) and the host's apt proxy / validity settings, so a build works
  wherever the host's ``apt-get`` works. Digest = sha256 of the canonical recipe (format,
  variant, suite, sorted packages, mirror or the resolved sources, architecture): a
  second build of the same recipe is a cache hit.
* imported — a ``docker save`` tarball or an OCI image-layout tarball. Layers are applied
  entry by entry, every path resolved with ``openat2(RESOLVE_IN_ROOT)`` so symlinks planted
  by earlier layers stay inside the tree. Digest = sha256 of the tarball.

Every built or imported tree is then finished the same way: ``user`` (uid/gid 1000, home
``/home/user``) and ``/workspace`` exist, ``/etc/resolv.conf`` is empty, ``/etc/hostname``
says agentbox, and the tree is hardened: device nodes dropped, setuid/setgid bits and file
capabilities removed, every entry owned by root:root and writable by no group or other.
On the host no account but root can then alter a template that every sandbox trusts. The
sandbox loses nothing: its user namespace maps only the sandbox user, so it reads a template
through the "other" bits whoever owns a file, and it gets its writable ``/tmp`` and
``/home/user`` from its own disk (``/tmp`` and ``/var/tmp`` are 1755 in a template).

Storage layout (all under ``HOME/templates``)::

    names.json                 {"format": 1, "names": {"NAME": "sha256:HEX", ...}}
                               replaced atomically (temp file + rename) under .lock
    .lock                      flock(2) serialising names.json, digest commits, pins,
                               collection, and sandbox reservations (``reserving``)
    sha256/HEX/template.json   metadata: digest, kind, recipe/source, created_at, size_bytes
    sha256/HEX/rootfs/         the overlay lower directory (never modified once here)
    tmp/                       staging (0711: apt's _apt user may traverse, nobody may list):
                               builds land here and are renamed into sha256/ in one step;
                               a crashed build is swept later
    pins/SNAPSHOT-ID           the digest a snapshot taken here restores onto

A name points at a digest; several names may share one. A tree is in use while a name, a
sandbox record or a snapshot pin refers to its digest. Records come from the home's state
store (``runtime.store``), in every state: a running, paused, pooled or stopped sandbox
overlays the tree, and a fork or restore is made on its source's digest, not on what the
name means now. When a name is removed or re-pointed (a rebuild or re-import with new
content, a new default after the host's CA bundle or ``ld.so.cache`` changed) and when a
sandbox or snapshot goes, every tree nothing refers to is deleted. A create writes its
record under the store's lock after checking its tree is still there (``reserving``), so
a collection sees either the record or no user of the tree, never a create in between.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import errno
import fcntl
import hashlib
import io
import json
import logging
import os
import platform
import posixpath
import re
import secrets
import shlex
import shutil
import signal
import sqlite3
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from agentbox.errors import (
    HostUnsupported,
    InvalidConfig,
    InvalidRequest,
    PermissionDenied,
    SandboxError,
    TemplateNotFound,
)
from agentbox.fsutil import atomic_file
from agentbox.isolation import syscalls
from agentbox.runtime.store import Store

Progress = Callable[[str], None]
log = logging.getLogger(__name__)

DEFAULT_NAME = "default"
DEFAULT_SUITE = "bookworm"
MMDEBSTRAP = "mmdebstrap"  # looked up on PATH at build time; tests point it at a fake
USER_UID = 1000
USER_NAME = "user"

_STORE_FORMAT = 1
_DEFAULT_FORMAT = 2  # bump when the synthesis changes shape
_RECIPE_FORMAT = 1  # bump when the build or finishing steps change what a recipe makes
_VARIANT = "apt"
_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_HOST_ALTERNATIVES = Path("/etc/alternatives")
_LD_SO_CACHE = Path("/etc/ld.so.cache")
_HOST_APT_DIR = Path("/etc/apt")
_HOST_OS_RELEASE = Path("/etc/os-release")
_TAIL_LINES = 25
_CHUNK = 1 << 20

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_SUITE_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,40}$")
# A Debian package name, optionally pinned: python3, libc6=2.36-9, git/bookworm-backports.
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+|/[a-z0-9.-]+)?$")
_MIRROR_RE = re.compile(r"^https?://[^\s\"'\[\]]+$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_IN_ROOT = syscalls.RESOLVE_IN_ROOT | syscalls.RESOLVE_NO_MAGICLINKS
_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Template:
    name: str
    digest: str  # "sha256:<hex>" content address
    rootfs: Path  # read-only lower directory for the overlay
    host_usr: bool  # the sandbox bind-mounts the host /usr read-only over rootfs/usr
    created_at: float  # seconds since the epoch
    size_bytes: int  # apparent size of the regular files, hard links counted once

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "digest": self.digest,
            "rootfs": str(self.rootfs),
            "host_usr": self.host_usr,
            "created_at": self.created_at,
            "size_bytes": self.size_bytes,
        }


def _quiet(_: str) -> None:
    pass


class TemplateStore:
    """Names → content-addressed root filesystems under ``home / "templates"``."""

    def __init__(self, home: Path, sandboxes: Store | None = None) -> None:
        self.root = Path(home) / "templates"
        self._names_file = self.root / "names.json"
        self._lock_file = self.root / ".lock"
        self._digests = self.root / "sha256"
        self._staging = self.root / "tmp"
        self._pins = self.root / "pins"
        self._default_digest_file = self.root / "default-digest.json"
        self._state_db = Path(home) / "state.db"
        self._sandboxes = sandboxes  # the home's sandbox records; opened when first needed

    # ---- queries ---------------------------------------------------------------------------

    def get(self, name: str) -> Template:
        if name == DEFAULT_NAME:
            return self._ensure_default()
        _check_name(name)
        digest = self._read_names().get(name)
        if digest is None:
            raise TemplateNotFound(self._not_found_message(name), name=name)
        return self._template(name, digest)

    def exact(self, name: str, digest: str) -> Template:
        """The very template a sandbox was made from (a fork's upper layer only makes
        sense over the same lower one), even if ``name`` now points elsewhere."""
        if name == DEFAULT_NAME:
            current = self._ensure_default()
            if current.digest == digest:
                return current
        if not self._has_digest(digest):
            raise TemplateNotFound(
                f"template {name!r} at {digest}, which this sandbox or snapshot was made "
                "from, is no longer on this host (it was replaced and nothing here used it "
                "any more); for a built or imported one, building the same recipe or importing "
                "the same image again brings it back",
                name=name,
            )
        return self._template(name, digest)

    def list(self) -> list[Template]:
        self._ensure_default()
        out = []
        for name, digest in sorted(self._read_names().items()):
            with contextlib.suppress(TemplateNotFound):
                out.append(self._template(name, digest))
        return out

    # ---- building --------------------------------------------------------------------------

    def build(
        self,
        name: str,
        packages: builtins.list[str],
        *,
        suite: str = DEFAULT_SUITE,
        mirror: str | None = None,
        progress: Progress | None = None,
    ) -> Template:
        """Build a Debian template with mmdebstrap; same recipe, same digest, no rebuild."""
        say = progress or _quiet
        _check_new_name(name)
        pkgs = _check_packages(packages)
        if not _SUITE_RE.match(suite):
            raise InvalidRequest(f"suite {suite!r} is not a Debian suite name like bookworm")
        if mirror is not None and not _MIRROR_RE.match(mirror):
            raise InvalidRequest(
                f"mirror {mirror!r} must be an http:// or https:// URL, "
                "e.g. http://deb.debian.org/debian"
            )
        host_sources = None if mirror else host_debian_sources(suite)
        recipe = {
            "format": _RECIPE_FORMAT,
            "variant": _VARIANT,
            "suite": suite,
            "packages": pkgs,
            "mirror": mirror or host_sources or "mmdebstrap-default",
            "arch": platform.machine(),
        }
        digest = "sha256:" + _sha256_json(recipe)
        if self._has_digest(digest):
            say(f"cache hit: {name} is {digest} (same recipe already built)")
            self._set_name(name, digest)
            return self._template(name, digest)

        if os.geteuid() != 0:
            raise HostUnsupported(
                "building a template needs root (mmdebstrap --mode=root creates root-owned "
                "files and chroots); run `agentbox template build` as root"
            )
        exe = shutil.which(MMDEBSTRAP)
        if exe is None:
            raise HostUnsupported(
                "mmdebstrap is not installed; install it with `apt-get install mmdebstrap`"
            )
        started = time.monotonic()
        where = mirror or ("the host's apt sources" if host_sources else "deb.debian.org")
        say(f"building {name} ({digest}): {suite} from {where}, packages: {pkgs or 'none'}")
        with self._staging_dir("build") as staging:
            rootfs = staging / "rootfs"
            rootfs.mkdir(mode=0o755)
            if mirror:
                mirror_args = [mirror]
            elif host_sources:
                sources = staging / "debian.sources"  # the .sources suffix marks deb822
                sources.write_text(host_sources)
                mirror_args = [str(sources)]
            else:
                mirror_args = []
            cmd = [
                exe,
                "--mode=root",
                f"--variant={_VARIANT}",
                "--format=directory",
                "--verbose",  # apt/dpkg lines instead of progress bars: readable in a log
                *(f"--aptopt={opt}" for opt in _host_apt_options()),
                *([f"--include={','.join(pkgs)}"] if pkgs else []),
                "--",
                suite,
                str(rootfs),
                *mirror_args,
            ]
            _run_streaming(cmd, staging, say)
            say("finishing rootfs: user account, /workspace, hardening")
            # mmdebstrap leaves --aptopt values (maybe a host-only proxy) in the image
            with contextlib.suppress(FileNotFoundError):
                (rootfs / "etc/apt/apt.conf.d/99mmdebstrap").unlink()
            size = _finish_rootfs(rootfs, say)
            meta = {"kind": "debian", "recipe": recipe, "size_bytes": size}
            self._commit(staging, digest, meta, name)
        say(f"built {name} ({digest}) in {time.monotonic() - started:.1f}s")
        return self._template(name, digest)

    def import_image(
        self, name: str, tarball: Path, *, progress: Progress | None = None
    ) -> Template:
        """Import a ``docker save`` or OCI image-layout tarball; digest = sha256 of the file."""
        say = progress or _quiet
        _check_new_name(name)
        tarball = Path(tarball)
        if not tarball.is_file():
            raise InvalidRequest(f"image tarball {str(tarball)!r} does not exist or is not a file")
        digest = "sha256:" + _sha256_file(tarball)
        if self._has_digest(digest):
            say(f"cache hit: {name} is {digest} (this image was imported before)")
            self._set_name(name, digest)
            return self._template(name, digest)
        say(f"importing {tarball} as {name} ({digest})")
        with self._staging_dir("import") as staging:
            rootfs = staging / "rootfs"
            rootfs.mkdir(mode=0o755)
            try:
                with tarfile.open(tarball, "r:*") as image:
                    _apply_image(image, rootfs, say)
            except tarfile.TarError as exc:
                raise InvalidRequest(
                    f"{tarball} is not a readable image tarball ({exc}); "
                    "create one with `docker save IMAGE -o image.tar`"
                ) from exc
            except OSError as exc:  # disk full, I/O error: not the image's fault
                raise SandboxError(f"importing {tarball} failed: {exc}; nothing was kept") from exc
            size = _finish_rootfs(rootfs, say)
            meta = {"kind": "import", "source": tarball.name, "size_bytes": size}
            self._commit(staging, digest, meta, name)
        say(f"imported {name} ({digest})")
        return self._template(name, digest)

    def remove(self, name: str) -> None:
        """Forget ``name``; its root filesystem goes too unless another name, a sandbox
        or a snapshot still uses it (then it goes with the last of them)."""
        if name != DEFAULT_NAME:
            _check_name(name)
        with self._locked():
            names = self._read_names()
            if name not in names:
                raise TemplateNotFound(self._not_found_message(name), name=name)
            del names[name]
            self._write_names(names)
        from agentbox.runtime.template_tiers import set_default_tier  # a leaf module

        set_default_tier(self.root.parent, name, None)  # a new template of this name starts clean
        self._collect_garbage()

    # ---- users: sandboxes and snapshots ------------------------------------------------------

    @contextlib.contextmanager
    def reserving(self, template: Template) -> Iterator[None]:
        """Hold the store's lock while the caller writes a sandbox record on ``template``.

        Between resolving a name and writing its record a create is a user no collection
        can see: the tree is checked again under the lock that collection takes.
        """
        with self._locked():
            if not self._has_digest(template.digest):
                raise TemplateNotFound(
                    f"template {template.name!r} ({template.digest}) was replaced and deleted "
                    "while a sandbox was being created from it; create the sandbox again",
                    name=template.name,
                )
            yield

    def pin(self, key: str, digest: str) -> None:
        """Keep ``digest`` while ``key`` (a snapshot id taken here) may be restored."""
        if not _NAME_RE.match(key):
            raise InvalidRequest(f"{key!r} cannot name a template pin")
        with self._locked():
            self._pins.mkdir(mode=0o755, exist_ok=True)
            tmp = self._pins / f".{key}.{secrets.token_hex(6)}.tmp"
            tmp.write_text(digest)
            tmp.replace(self._pins / key)

    def unpin(self, key: str) -> None:
        """``key`` no longer needs its template; collect it if nothing else does."""
        with self._locked():
            (self._pins / key).unlink(missing_ok=True)
        self._collect_garbage()

    def release(self, digest: str) -> None:
        """A sandbox on ``digest`` is gone: collect the tree if that was its last user."""
        if digest not in self._read_names().values():
            self._collect_garbage()

    def _in_use(self) -> set[str]:
        """Digests that names, sandbox records and snapshot pins refer to (under the lock)."""
        if self._sandboxes is None:
            self._sandboxes = Store(self._state_db)
        used = set(self._read_names().values()) | self._sandboxes.template_digests()
        if self._pins.is_dir():
            pins = (p for p in self._pins.iterdir() if not p.name.startswith("."))
            used.update(p.read_text().strip() for p in pins)
        return used

    # ---- the default template ---------------------------------------------------------------

    def _ensure_default(self) -> Template:
        # The digest as a previous process computed it from the same host inputs: a create
        # then skips reading and hashing them (a first create in a process cost as much as
        # a second one); any change to them, or to this code, computes it again.
        inputs = _default_inputs_key()
        try:
            remembered = json.loads(self._default_digest_file.read_text())
        except (OSError, ValueError):
            remembered = None
        if isinstance(remembered, dict) and remembered.get("inputs") == inputs:
            digest = str(remembered.get("digest"))
            if self._read_names().get(DEFAULT_NAME) == digest and self._has_digest(digest):
                return self._template(DEFAULT_NAME, digest)
        template = self._synthesize_default()
        with atomic_file(self._default_digest_file, 0o644) as out:
            out.write(json.dumps({"inputs": inputs, "digest": template.digest}).encode())
        return template

    def _synthesize_default(self) -> Template:
        entries, digest = _default_synthesis()
        if self._read_names().get(DEFAULT_NAME) == digest and self._has_digest(digest):
            return self._template(DEFAULT_NAME, digest)
        if self._has_digest(digest):
            self._set_name(DEFAULT_NAME, digest)
        else:
            with self._staging_dir("default") as staging:
                _materialize(entries, staging / "rootfs")
                meta = {
                    "kind": "default",
                    "host_usr": True,
                    "size_bytes": sum(len(e.data) for e in entries),
                }
                self._commit(staging, digest, meta, DEFAULT_NAME)
        return self._template(DEFAULT_NAME, digest)

    # ---- storage ---------------------------------------------------------------------------

    def _digest_dir(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        if algo != "sha256" or not _HEX64_RE.match(hexdigest):
            raise InvalidConfig(f"{self._names_file} holds a malformed digest {digest!r}")
        return self._digests / hexdigest

    def _has_digest(self, digest: str) -> bool:
        return (self._digest_dir(digest) / "template.json").is_file()

    def _template(self, name: str, digest: str) -> Template:
        where = self._digest_dir(digest)
        try:
            meta = json.loads((where / "template.json").read_text())
            return Template(
                name=name,
                digest=digest,
                rootfs=where / "rootfs",
                host_usr=bool(meta.get("host_usr", False)),
                created_at=float(meta["created_at"]),
                size_bytes=int(meta["size_bytes"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TemplateNotFound(
                f"template {name!r} points at {digest}, whose files are missing or damaged "
                f"({exc!r}); remove it with `agentbox template rm {name}` and build it again",
                name=name,
            ) from exc

    def _commit(self, staging: Path, digest: str, meta: dict[str, Any], name: str) -> None:
        """Publish a staged tree under its digest (one rename; first writer wins) and point
        ``name`` at it, in one locked step so garbage collection never sees it unnamed."""
        doc = {"digest": digest, "created_at": time.time(), "host_usr": False, **meta}
        (staging / "template.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        (staging / "template.json").chmod(0o644)
        staging.chmod(0o755)
        final = self._digest_dir(digest)
        with self._locked():
            if not final.exists():
                self._digests.mkdir(mode=0o755, exist_ok=True)
                (staging / ".lock").unlink()
                staging.rename(final)
            moved = self._map_name(name, digest)
        if moved:
            self._collect_garbage()

    def _read_names(self) -> dict[str, str]:
        try:
            doc = json.loads(self._names_file.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise InvalidConfig(
                f"{self._names_file} is not valid JSON ({exc}); fix it or delete it "
                "(templates stay on disk under sha256/ and can be imported or built again)"
            ) from exc
        names = doc.get("names") if isinstance(doc, dict) else None
        if not isinstance(names, dict):
            raise InvalidConfig(f"{self._names_file} has no 'names' object; fix or delete it")
        return {str(k): str(v) for k, v in names.items()}

    def _write_names(self, names: dict[str, str]) -> None:
        data = json.dumps({"format": _STORE_FORMAT, "names": dict(sorted(names.items()))}, indent=2)
        tmp = self._names_file.with_name(f".names.{secrets.token_hex(6)}.tmp")
        with open(tmp, "w") as f:
            f.write(data + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.chmod(0o644)
        tmp.replace(self._names_file)

    def _set_name(self, name: str, digest: str) -> None:
        with self._locked():
            if not self._has_digest(digest):
                raise SandboxError(
                    f"template {digest} was removed while {name!r} was being pointed at it; "
                    "run the command again"
                )
            moved = self._map_name(name, digest)
        if moved:
            self._collect_garbage()

    def _map_name(self, name: str, digest: str) -> bool:
        """names[name] = digest (call under the lock); True if it pointed elsewhere before."""
        names = self._read_names()
        old = names.get(name)
        if old == digest:
            return False
        names[name] = digest
        self._write_names(names)
        return old is not None

    def _collect_garbage(self) -> None:
        """Delete the trees nothing uses (``_in_use``): deleting the lower layer of a
        sandbox's overlay would empty its ``/``."""
        doomed = []
        with self._locked():
            if not self._digests.is_dir():
                return
            try:
                in_use = self._in_use()
            except sqlite3.Error as exc:
                # Without the records any tree may be a sandbox's root: keep them all.
                log.warning("template collection skipped: cannot read %s: %s", self._state_db, exc)
                return
            for entry in self._digests.iterdir():
                if f"sha256:{entry.name}" in in_use:
                    continue
                # Renamed away under the lock so no reader sees a half-deleted tree.
                self._staging.mkdir(mode=0o711, exist_ok=True)
                trash = self._staging / f"trash-{secrets.token_hex(6)}"
                entry.rename(trash)
                doomed.append(trash)
        for trash in doomed:
            _remove_tree(trash)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except PermissionError as exc:
            raise PermissionDenied(
                f"cannot write the template store {self.root} ({exc.strerror}); run as root "
                "or point AGENTBOX_HOME at a directory you own"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _staging_dir(self, kind: str) -> Iterator[Path]:
        """A private directory next to sha256/, deleted on any failure.

        Holding flock on its ``.lock`` marks it live; a sweep removes the ones whose owner died.
        """
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._staging.mkdir(mode=0o711, exist_ok=True)
        self._sweep_staging()
        path = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=self._staging))
        # Traversable so apt can drop to its _apt user for downloads (its own sandbox).
        path.chmod(0o711)
        self._staging.chmod(0o711)
        lock = os.open(path / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield path
        except BaseException:
            # A cleanup problem must not hide why the build failed; the sweep retries it.
            with contextlib.suppress(Exception):
                _remove_tree(path)
            raise
        else:
            if path.exists():  # another writer committed the same digest first
                _remove_tree(path)
        finally:
            os.close(lock)

    def _sweep_staging(self) -> None:
        for entry in self._staging.iterdir():
            try:
                fd = os.open(entry / ".lock", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                # Trash, or a staging dir in its first instant: only old ones are stale.
                if time.time() - entry.lstat().st_mtime > 3600:
                    with contextlib.suppress(SandboxError):
                        _remove_tree(entry)
                continue
            except NotADirectoryError:
                entry.unlink()
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live build
            finally:
                os.close(fd)
            with contextlib.suppress(SandboxError):  # never block a new build; retried later
                _remove_tree(entry)

    def _not_found_message(self, name: str) -> str:
        available = ", ".join(sorted({DEFAULT_NAME, *self._read_names()}))
        return (
            f"no template named {name!r} (available: {available}); build one with "
            f"`agentbox template build {name} --packages python3,git` or import an image "
            f"with `agentbox template import {name} IMAGE.tar`"
        )


# ---- validation ---------------------------------------------------------------------------


def _check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise InvalidRequest(
            f"template name {name!r} must be 1-63 characters of a-z, 0-9, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def _check_new_name(name: str) -> None:
    _check_name(name)
    if name == DEFAULT_NAME:
        raise InvalidRequest(
            "'default' is synthesised by agentbox and cannot be built or imported; "
            "choose another name"
        )


def _check_packages(packages: list[str]) -> list[str]:
    pkgs = sorted({p.strip() for p in packages if p.strip()})
    for p in pkgs:
        # Refuses apt patterns and paths: --include=./x.deb would read host files.
        if not _PACKAGE_RE.match(p):
            raise InvalidRequest(
                f"{p!r} is not a Debian package name (like python3, git=1:2.39.5-0+deb12u2 "
                "or git/bookworm-backports)"
            )
    return pkgs


# ---- hashing ------------------------------------------------------------------------------


def _sha256_json(doc: object) -> str:
    return hashlib.sha256(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---- the default template -----------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    path: str
    kind: Literal["dir", "file", "symlink"]
    mode: int = 0o755
    data: bytes = b""
    target: str = ""


_PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    f"{USER_NAME}:x:{USER_UID}:{USER_UID}::/home/{USER_NAME}:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP = f"root:x:0:\n{USER_NAME}:x:{USER_UID}:\nnogroup:x:65534:\n"
_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
_NSSWITCH = (
    "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"
    "networks: files\nprotocols: files\nservices: files\n"
)
_OS_RELEASE = (
    'PRETTY_NAME="agentbox sandbox"\nNAME="agentbox"\nID=agentbox\nVERSION_ID="1"\n'
    'HOME_URL="https://github.com/agentbox"\n'
)
_PROFILE = (
    "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    "export LANG=C.UTF-8\n"
    'export HOME="${HOME:-/home/user}"\n'
)


_default_cache: tuple[tuple[object, ...], list[_Entry], str] | None = None


def _default_synthesis() -> tuple[list[_Entry], str]:
    """The default template's entries and digest, recomputed only when a host input changed.

    Every sandbox creation asks for the default template: re-reading the CA bundle and the
    alternatives each time would cost milliseconds.
    """
    global _default_cache
    key = tuple(_stat_key(p) for p in (_CA_BUNDLE, _HOST_ALTERNATIVES, _LD_SO_CACHE))
    if _default_cache is None or _default_cache[0] != key:
        entries = _default_entries()
        _default_cache = (key, entries, "sha256:" + _digest_entries(entries))
    return _default_cache[1], _default_cache[2]


def _default_inputs_key() -> str:
    """What the default template is made from, cheaply: the host files' stat keys and the
    source of this module (which holds the rest of its content)."""
    stats = [_stat_key(p) for p in (_CA_BUNDLE, _HOST_ALTERNATIVES, _LD_SO_CACHE)]
    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return _sha256_json([_DEFAULT_FORMAT, source, stats])


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _default_entries() -> list[_Entry]:
    """The default rootfs as data; its hash is the default template's digest."""
    dirs = ["usr", "proc", "dev", "tmp", "run", "home", "var", "var/tmp", "etc", ".agentbox"]
    out = [_Entry(d, "dir") for d in dirs]
    # Mount points and the read-only base of $HOME: the sandbox's own disk makes them writable.
    out += [
        _Entry("root", "dir", 0o700),
        _Entry(f"home/{USER_NAME}", "dir"),
        _Entry("workspace", "dir"),
    ]
    out += [_Entry(n, "symlink", target=f"usr/{n}") for n in ("bin", "sbin", "lib", "lib64")]
    files = {
        "etc/passwd": _PASSWD,
        "etc/group": _GROUP,
        "etc/hosts": _HOSTS,
        "etc/hostname": "agentbox\n",
        "etc/nsswitch.conf": _NSSWITCH,
        "etc/resolv.conf": "",  # the sandbox's network setup provides its own resolver
        "etc/os-release": _OS_RELEASE,
        "etc/profile": _PROFILE,
    }
    # Where the sandbox's init is bind-mounted (runtime.host.INIT_PATH): in the template,
    # a create need not write it into each sandbox's upper layer.
    out.append(_Entry(".agentbox/init", "file", 0o644, data=b""))
    out += [_Entry(p, "file", 0o644, data=text.encode()) for p, text in files.items()]
    if _CA_BUNDLE.is_file():  # public data; without it nothing can verify https
        out += [_Entry("etc/ssl", "dir"), _Entry("etc/ssl/certs", "dir")]
        out.append(
            _Entry("etc/ssl/certs/ca-certificates.crt", "file", 0o644, data=_CA_BUNDLE.read_bytes())
        )
    if _LD_SO_CACHE.is_file():
        out.append(_Entry("etc/ld.so.cache", "file", 0o644, data=_LD_SO_CACHE.read_bytes()))
    alternatives = _host_alternatives()
    if alternatives:
        out.append(_Entry("etc/alternatives", "dir"))
        out += [_Entry(f"etc/alternatives/{n}", "symlink", target=t) for n, t in alternatives]
    return out


def _host_alternatives() -> list[tuple[str, str]]:
    """Host /etc/alternatives links that point into /usr: names only, no host file content."""
    try:
        links = sorted(_HOST_ALTERNATIVES.iterdir())
    except OSError:
        return []
    out = []
    for link in links:
        try:
            target = str(link.readlink())
        except OSError:
            continue
        if target.startswith("/usr/") and ".." not in target.split("/"):
            out.append((link.name, target))
    return out


def _digest_entries(entries: list[_Entry]) -> str:
    doc = [_DEFAULT_FORMAT] + [
        [e.path, e.kind, e.mode, hashlib.sha256(e.data).hexdigest(), e.target] for e in entries
    ]
    return _sha256_json(doc)


def _materialize(entries: list[_Entry], rootfs: Path) -> None:
    rootfs.mkdir(mode=0o755)
    for e in entries:
        path = rootfs / e.path
        if e.kind == "dir":
            path.mkdir(mode=e.mode)
        elif e.kind == "symlink":
            path.symlink_to(e.target)
        else:
            path.write_bytes(e.data)
        if e.kind != "symlink":
            path.chmod(e.mode)  # not subject to umask
        if os.geteuid() == 0:
            os.lchown(path, 0, 0)


# ---- building with mmdebstrap --------------------------------------------------------------


def host_debian_sources(
    suite: str, apt_dir: Path = _HOST_APT_DIR, os_release: Path = _HOST_OS_RELEASE
) -> str | None:
    """The host's Debian apt sources, as deb822 text for ``suite``; None if there are none.

    A source counts when its suites are the host's codename or ``CODENAME-*`` (updates,
    security, backports): third-party repositories never enter a template. For the host's
    own suite every such source is kept; for another suite only the main archive's URI is
    reused, since ``-updates``/``-security`` do not exist for every suite.
    """
    codename = _os_release_codename(os_release)
    if codename is None:
        return None
    stanzas = []
    for src in _read_apt_sources(apt_dir):
        if "deb" not in src["types"] or not src["suites"]:
            continue
        if not all(s == codename or s.startswith(codename + "-") for s in src["suites"]):
            continue
        if suite == codename:
            suites = src["suites"]
        elif codename in src["suites"]:
            suites = [suite]
        else:
            continue
        lines = [
            "Types: deb",
            f"URIs: {' '.join(src['uris'])}",
            f"Suites: {' '.join(suites)}",
            f"Components: {' '.join(src['components'] or ['main'])}",
        ]
        signed_by = src["signed_by"]
        if signed_by and "\n" not in signed_by and Path(signed_by).is_file():
            lines.append(f"Signed-By: {signed_by}")
        stanzas.append("\n".join(lines) + "\n")
    return "\n".join(stanzas) if stanzas else None


def _os_release_codename(path: Path) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "VERSION_CODENAME":
            value = value.strip().strip("\"'")
            return value if _SUITE_RE.match(value) else None
    return None


def _read_apt_sources(apt_dir: Path) -> list[dict[str, Any]]:
    """Entries of sources.list (one-line) and sources.list.d/*.list, *.sources (deb822)."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    out: list[dict[str, Any]] = []
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        out += _parse_deb822(text) if f.suffix == ".sources" else _parse_one_line(text)
    return out


def _parse_one_line(text: str) -> list[dict[str, Any]]:
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        options: dict[str, str] = {}
        opts = re.match(r"^(\S+)\s+\[([^\]]*)\]\s+(.*)$", line)
        if opts:
            for item in opts.group(2).split():
                key, _, value = item.partition("=")
                options[key.lower()] = value
            words = [opts.group(1), *opts.group(3).split()]
        else:
            words = line.split()
        if len(words) < 3:
            continue
        out.append(
            {
                "types": [words[0]],
                "uris": [words[1]],
                "suites": [words[2]],
                "components": words[3:],
                "signed_by": options.get("signed-by", ""),
            }
        )
    return out


def _parse_deb822(text: str) -> list[dict[str, Any]]:
    out = []
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if not fields or fields.get("enabled", "yes").lower() == "no":
            continue
        out.append(
            {
                "types": fields.get("types", "").split(),
                "uris": fields.get("uris", "").split(),
                "suites": fields.get("suites", "").split(),
                "components": fields.get("components", "").split(),
                "signed_by": fields.get("signed-by", ""),
            }
        )
    return out


def _host_apt_options() -> list[str]:
    """How the host's apt reaches the archive (proxy, snapshot validity), for mmdebstrap.

    mmdebstrap runs apt with its own configuration, so without these a host behind an apt
    proxy or on a snapshot mirror could not build.
    """
    keys = {
        "HTTP_PROXY": "Acquire::http::Proxy",
        "HTTPS_PROXY": "Acquire::https::Proxy",
        "VALID_UNTIL": "Acquire::Check-Valid-Until",
        "CHECK_DATE": "Acquire::Check-Date",
    }
    exe = shutil.which("apt-config")
    if exe is None:
        return []
    args = [exe, "shell"]
    for var, key in keys.items():
        args += [var, key]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    options = []
    for line in out.splitlines():
        var, _, quoted = line.partition("=")
        words = shlex.split(quoted) if quoted else []
        value = words[0] if words else ""
        if var in keys and value and '"' not in value:
            options.append(f'{keys[var]} "{value}"')
    return options


def _run_streaming(cmd: list[str], staging: Path, say: Progress) -> None:
    """Run mmdebstrap, each output line to ``say``; a failure quotes the output's tail."""
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    env = {**os.environ, "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    env["TMPDIR"] = str(staging)  # any scratch space stays inside what we clean up
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group, so we can stop all of it
    )
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            for line in raw.rstrip("\n").split("\r"):
                if line.strip():
                    tail.append(line)
                    say(line)
        code = proc.wait()
    except BaseException:
        _stop_group(proc)
        raise
    finally:
        proc.stdout.close()
    if code != 0:
        output = "\n".join(f"  {line}" for line in tail) or "  (no output)"
        raise SandboxError(
            f"mmdebstrap failed with exit code {code}; nothing was kept. Check the suite, "
            f"the package names and that the Debian archive is reachable. Last output:\n{output}",
            exit_code=code,
            command=shlex.join(cmd),
        )


def _stop_group(proc: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ---- importing images ---------------------------------------------------------------------


def _apply_image(image: tarfile.TarFile, rootfs: Path, say: Progress) -> None:
    members = {m.name.removeprefix("./"): m for m in image.getmembers()}
    try:
        layers = _image_layers(image, members)
    except (KeyError, TypeError, AttributeError) as exc:  # JSON of the wrong shape
        raise InvalidRequest(f"the image's manifest or index is malformed ({exc!r})") from exc
    stats = _Stats()
    with _Tree(rootfs) as tree:
        for i, (path, media_type) in enumerate(layers, 1):
            say(f"layer {i}/{len(layers)}: {path}")
            if media_type.endswith("+zstd"):
                raise InvalidRequest(
                    f"layer {path} is zstd-compressed, which this Python cannot read; "
                    "re-export the image with gzip or uncompressed layers"
                )
            member = members.get(path)
            blob = image.extractfile(member) if member is not None else None
            if blob is None:
                raise InvalidRequest(f"the image names layer {path!r}, which is not in the tarball")
            expected = path.rsplit("/", 1)[-1] if path.startswith("blobs/sha256/") else None
            _apply_layer(tree, blob, path, expected, stats)
    for line in stats.report():
        say(line)


def _image_layers(
    image: tarfile.TarFile, members: dict[str, tarfile.TarInfo]
) -> list[tuple[str, str]]:
    """Layer paths (inside the tarball) in application order, with their media types."""

    def load(path: str) -> Any:
        member = members.get(path)
        f = image.extractfile(member) if member is not None else None
        if f is None:
            raise InvalidRequest(f"the image tarball has no {path}")
        try:
            return json.load(f)
        except ValueError as exc:
            raise InvalidRequest(f"{path} in the image tarball is not JSON: {exc}") from exc

    if "manifest.json" in members:  # docker save (also written by newer docker alongside OCI)
        manifest = load("manifest.json")
        if not isinstance(manifest, list) or not manifest or "Layers" not in manifest[0]:
            raise InvalidRequest("manifest.json in the image tarball lists no image with Layers")
        return [(str(p).removeprefix("./"), "") for p in manifest[0]["Layers"]]
    if "oci-layout" in members and "index.json" in members:
        doc = load("index.json")
        for _ in range(4):  # index → (nested index →) manifest
            if "layers" in doc:
                return [
                    (_blob_path(d["digest"]), str(d.get("mediaType", ""))) for d in doc["layers"]
                ]
            manifests = doc.get("manifests") or []
            if not manifests:
                raise InvalidRequest("the OCI index in the image tarball lists no manifest")
            doc = load(_blob_path(_pick_manifest(manifests)["digest"]))
        raise InvalidRequest("the OCI image index nests too deeply")
    raise InvalidRequest(
        "the tarball is neither a `docker save` image (manifest.json) nor an OCI image "
        "layout (oci-layout + index.json)"
    )


def _blob_path(digest: object) -> str:
    algo, _, hexdigest = str(digest).partition(":")
    if algo != "sha256" or not _HEX64_RE.match(hexdigest):
        raise InvalidRequest(f"unsupported or malformed blob digest {digest!r}")
    return f"blobs/sha256/{hexdigest}"


def _pick_manifest(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    for m in manifests:
        plat = m.get("platform") or {}
        if plat.get("os") == "linux" and plat.get("architecture") == arch:
            return m
    return manifests[0]


class _HashingReader(io.RawIOBase):
    """Passes bytes through, hashing them, so a layer is verified while it is applied."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        buffer[: len(data)] = data
        self.hash.update(data)
        return len(data)


@dataclass
class _Stats:
    unsafe: list[str] = field(default_factory=list)
    devices: int = 0

    def report(self) -> list[str]:
        lines = [f"skipped unsafe entry {name!r}" for name in self.unsafe[:20]]
        if len(self.unsafe) > 20:
            lines.append(f"... and {len(self.unsafe) - 20} more unsafe entries")
        if self.devices:
            lines.append(f"dropped {self.devices} device nodes (the sandbox has its own /dev)")
        return lines


def _safe_relpath(name: str) -> str | None:
    """``name`` as a relative path inside the tree, or None if it is absolute or climbs."""
    if name.startswith("/") or "\x00" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None
    return "/".join(parts)


def _apply_layer(
    tree: _Tree, blob: IO[bytes], path: str, expected: str | None, stats: _Stats
) -> None:
    reader = _HashingReader(blob)
    # Paths written by this layer: an opaque marker hides only what lower layers put there.
    seen: set[str] = set()
    try:
        with tarfile.open(fileobj=io.BufferedReader(reader, _CHUNK), mode="r|*") as layer:
            for m in layer:
                try:
                    _apply_member(tree, layer, m, seen, stats)
                except _Unsafe:
                    stats.unsafe.append(m.name)
    except tarfile.TarError as exc:
        raise InvalidRequest(
            f"layer {path} is not a tar archive (gzip or uncompressed) or is damaged: {exc}"
        ) from exc
    while reader.read(_CHUNK):  # hash what tarfile left unread (end padding)
        pass
    if expected is not None and reader.hash.hexdigest() != expected:
        raise InvalidRequest(
            f"layer {path} does not match its digest (got sha256:{reader.hash.hexdigest()}); "
            "the image tarball is damaged"
        )


class _Unsafe(Exception):
    """An entry that would leave the tree or cannot be placed; it is skipped."""


# What a hostile or sloppy layer can cause: a path through a file, a dangling symlink, a loop.
_PLACEMENT_ERRNOS = {
    errno.ENOTDIR, errno.ELOOP, errno.EXDEV, errno.EEXIST, errno.ENOENT, errno.EISDIR,
    errno.EMLINK, errno.ENAMETOOLONG,
}  # fmt: skip


def _apply_member(
    tree: _Tree, layer: tarfile.TarFile, m: tarfile.TarInfo, seen: set[str], stats: _Stats
) -> None:
    rel = _safe_relpath(m.name)
    if rel is None:
        raise _Unsafe
    if not rel:
        return  # the layer's root entry
    parent_rel, base = posixpath.split(rel)
    if base.startswith(".wh."):
        parent = tree.open_dir(parent_rel, create=False)
        if parent is None:
            return
        try:
            if base == ".wh..wh..opq":
                _clear_unseen(parent, parent_rel, seen)
            elif not base.startswith(".wh..wh.") and base[4:] not in ("", ".", ".."):
                _clear(parent, base[4:])
        finally:
            os.close(parent)
        return
    if m.ischr() or m.isblk():
        stats.devices += 1
        return
    parts = rel.split("/")
    seen.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    parent = tree.open_dir(parent_rel, create=True)
    if parent is None:
        raise _Unsafe
    try:
        _place(tree, layer, m, parent, base)
    except OSError as exc:
        if exc.errno not in _PLACEMENT_ERRNOS:
            raise  # ENOSPC, EIO, ...: the import fails instead of silently losing files
        raise _Unsafe from exc
    finally:
        os.close(parent)


def _place(tree: _Tree, layer: tarfile.TarFile, m: tarfile.TarInfo, parent: int, base: str) -> None:
    """Create one entry named ``base`` in the directory ``parent``, never following it."""
    # Setuid/setgid bits go here; owners and write bits are settled by _harden afterwards.
    mode = m.mode & (0o1777 if m.isdir() else 0o777)
    if m.isdir():
        try:
            st = os.stat(base, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                _clear(parent, base)
                os.mkdir(base, 0o700, dir_fd=parent)
        except FileNotFoundError:
            os.mkdir(base, 0o700, dir_fd=parent)
        fd = os.open(base, _DIR_NOFOLLOW, dir_fd=parent)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return
    _clear(parent, base)
    if m.isreg():
        src = layer.extractfile(m)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(base, flags, 0o600, dir_fd=parent)
        with open(fd, "wb") as out:
            if src is not None:
                shutil.copyfileobj(src, out, _CHUNK)
            os.fchmod(fd, mode)
            os.utime(fd, (m.mtime, m.mtime))
    elif m.issym():
        os.symlink(m.linkname, base, dir_fd=parent)  # resolved later inside the sandbox's root
    elif m.islnk():
        target = _safe_relpath(m.linkname)
        if not target:
            raise _Unsafe
        target_parent, target_base = posixpath.split(target)
        src_dir = tree.open_dir(target_parent, create=False)
        if src_dir is None:
            raise _Unsafe
        try:
            st = os.stat(target_base, dir_fd=src_dir, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise _Unsafe
            os.link(target_base, base, src_dir_fd=src_dir, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(src_dir)
    elif m.isfifo():
        os.mkfifo(base, mode, dir_fd=parent)


def _clear(parent: int, name: str) -> None:
    """Remove ``name`` in ``parent`` whatever it is, never following a symlink."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=parent)  # fd-based: immune to symlink swaps
    else:
        os.unlink(name, dir_fd=parent)


def _clear_unseen(dirfd: int, rel: str, seen: set[str]) -> None:
    for name in os.listdir(dirfd):
        child = f"{rel}/{name}" if rel else name
        if child not in seen:
            _clear(dirfd, name)
            continue
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, _DIR_NOFOLLOW, dir_fd=dirfd)
            try:
                _clear_unseen(sub, child, seen)
            finally:
                os.close(sub)


class _Tree:
    """A directory tree whose paths resolve as if it were ``/`` (openat2 RESOLVE_IN_ROOT).

    A symlink ``etc -> /host/etc`` planted in the tree then means ``<tree>/host/etc``, and
    ``..`` stops at the tree's root: nothing can be reached outside it.
    """

    def __init__(self, root: Path) -> None:
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def __enter__(self) -> _Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def open_dir(self, rel: str, *, create: bool) -> int | None:
        """An fd for directory ``rel``; missing ones are made (0755) when ``create``.

        Returns None when it is missing and not created; raises _Unsafe when it cannot be
        a directory (a file, a dangling symlink, a loop).
        """
        try:
            return self._resolve(rel)
        except FileNotFoundError:
            if not create:
                return None
        # Walk down from the root, resolving each prefix afresh (so symlinks stay in the
        # tree) and making what is missing inside the directory resolved just before.
        parent = os.dup(self.fd)
        try:
            parts = rel.split("/")
            for i, part in enumerate(parts, 1):
                try:
                    fd = self._resolve("/".join(parts[:i]))
                except FileNotFoundError:
                    try:
                        os.mkdir(part, 0o755, dir_fd=parent)
                        fd = os.open(part, _DIR_NOFOLLOW, dir_fd=parent)
                    except OSError as exc:  # EEXIST: a dangling symlink sits there
                        raise _Unsafe from exc
                os.close(parent)
                parent = fd
        except BaseException:
            os.close(parent)
            raise
        return parent

    def _resolve(self, rel: str) -> int:
        try:
            return syscalls.openat2(self.fd, rel or ".", os.O_RDONLY | os.O_DIRECTORY, 0, _IN_ROOT)
        except FileNotFoundError:
            raise
        except OSError as exc:  # ENOTDIR, ELOOP, EXDEV: not a usable directory
            raise _Unsafe from exc

    def is_file(self, rel: str) -> bool:
        try:
            fd = syscalls.openat2(self.fd, rel, os.O_PATH, 0, _IN_ROOT)
        except OSError:
            return False
        try:
            return stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def read(self, rel: str) -> bytes | None:
        try:
            fd = syscalls.openat2(self.fd, rel, os.O_RDONLY | os.O_NONBLOCK, 0, _IN_ROOT)
        except OSError:
            return None
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return f.read()

    def write(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """Replace ``rel`` with a root-owned file: write a temp file, rename over the name."""
        parent_rel, base = posixpath.split(rel)
        parent = self.open_dir(parent_rel, create=True)
        assert parent is not None
        tmp = f".agentbox-{secrets.token_hex(6)}"
        try:
            st = os.stat(base, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(base, dir_fd=parent)
        except FileNotFoundError:
            pass
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600, dir_fd=parent)
            with open(fd, "wb") as f:
                f.write(data)
                if os.geteuid() == 0:
                    os.fchown(fd, 0, 0)
                os.fchmod(fd, mode)
            os.rename(tmp, base, src_dir_fd=parent, dst_dir_fd=parent)  # replaces, never follows
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)
            os.close(parent)

    def ensure_dir(self, rel: str, mode: int) -> None:
        fd = self.open_dir(rel, create=True)
        assert fd is not None
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


# ---- finishing a built or imported rootfs ------------------------------------------------------


def _finish_rootfs(rootfs: Path, say: Progress) -> int:
    """Add what every template needs, harden it; returns its size in bytes."""
    with _Tree(rootfs) as tree:
        _ensure_user(tree)
        tree.ensure_dir(f"home/{USER_NAME}", 0o755)
        tree.ensure_dir("workspace", 0o755)
        tree.write("etc/resolv.conf", b"")  # mmdebstrap copies the host's; never ship that
        tree.write("etc/hostname", b"agentbox\n")  # likewise
        if tree.read("etc/hosts") is None:
            tree.write("etc/hosts", _HOSTS.encode())
    return _harden(rootfs, say)


def _ensure_user(tree: _Tree) -> None:
    """``user`` with uid/gid 1000 and home /home/user, in passwd, group and shadow."""
    shell = "/bin/bash" if tree.is_file("bin/bash") else "/bin/sh"
    # A scratch image may have no passwd at all: root comes first then.
    starts = {"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n", "etc/group": "root:x:0:\n"}
    entries = {
        "etc/passwd": f"{USER_NAME}:x:{USER_UID}:{USER_UID}::/home/{USER_NAME}:{shell}",
        "etc/group": f"{USER_NAME}:x:{USER_UID}:",
        "etc/shadow": f"{USER_NAME}:!:19000:0:99999:7:::",  # no password: locked
        "etc/gshadow": f"{USER_NAME}:!::",
    }
    for rel, entry in entries.items():
        old = tree.read(rel)
        if old is None and rel not in starts:
            continue  # images without shadow files (busybox) manage fine without them
        text = old.decode(errors="replace") if old is not None else starts[rel]
        lines = text.splitlines()
        if entry in lines:
            continue
        kept = [line for line in lines if not line.startswith(f"{USER_NAME}:")]
        new = "\n".join([*kept, entry]) + "\n"
        tree.write(rel, new.encode(), 0o640 if "shadow" in rel else 0o644)


def _harden(rootfs: Path, say: Progress) -> int:
    """Root owns everything, only root writes, no devices/setuid/setgid/capabilities.

    Returns the apparent size of the regular files (hard links counted once).
    """
    as_root = os.geteuid() == 0
    size = dropped = stripped = 0
    seen_inodes: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames, dirfd in os.fwalk(rootfs, follow_symlinks=False):
        for name in dirnames + filenames:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            kind = stat.S_IFMT(st.st_mode)
            if kind in (stat.S_IFCHR, stat.S_IFBLK):
                os.unlink(name, dir_fd=dirfd)
                dropped += 1
                continue
            if as_root and (st.st_uid, st.st_gid) != (0, 0):
                os.chown(name, 0, 0, dir_fd=dirfd, follow_symlinks=False)
            if kind == stat.S_IFLNK:
                continue
            mode = stat.S_IMODE(st.st_mode)
            new = mode & ~(stat.S_IWGRP | stat.S_IWOTH)
            if kind == stat.S_IFREG:
                new &= ~(stat.S_ISUID | stat.S_ISGID)
                stripped += bool(mode & (stat.S_ISUID | stat.S_ISGID))
                if (st.st_dev, st.st_ino) not in seen_inodes:
                    seen_inodes.add((st.st_dev, st.st_ino))
                    size += st.st_size
                with contextlib.suppress(OSError):  # ENODATA: the usual case
                    # xattr calls take no dir_fd; the staging tree is private to us
                    os.removexattr(
                        f"{dirpath}/{name}", "security.capability", follow_symlinks=False
                    )
            # Always: chown above may have cleared setuid bits behind our back.
            # Not a symlink (checked above) and nothing else writes this private tree.
            os.chmod(name, new, dir_fd=dirfd)
    if dropped or stripped:
        say(f"hardened: dropped {dropped} device nodes, cleared setuid/setgid on {stripped} files")
    return size


# ---- removal ------------------------------------------------------------------------------


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [_unescape(line.split()[4]) for line in f if line.strip()]


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _remove_tree(path: Path) -> None:
    """rm -rf that first detaches mounts left inside (an interrupted mmdebstrap's /proc, /dev).

    Deleting through a leftover bind mount of the host's /dev would delete host files.
    """
    prefix = str(path.resolve()) + "/"
    for point in sorted(
        (p for p in _mount_points() if p.startswith(prefix)), key=len, reverse=True
    ):
        with contextlib.suppress(OSError):
            syscalls.umount(point)
    if any(p.startswith(prefix) for p in _mount_points()):
        raise SandboxError(f"refusing to delete {path}: something is still mounted inside it")
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise SandboxError(f"could not delete {path}: {exc}; delete it by hand") from exc
