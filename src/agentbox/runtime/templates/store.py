"""Templates: the read-only root filesystems that sandboxes overlay. This module is the
store (names, digests, reservations, collection); each kind is made in its own module
(:mod:`.default`, :mod:`.debian`, :mod:`.oci`) and finished by :mod:`.harden`.

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
import contextlib
import errno
import fcntl
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox.digest import token_hex
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
from agentbox.runtime.templates.default import (
    _default_inputs_key,
    _default_synthesis,
    _materialize,
    _sha256_json,
)
from agentbox.runtime.templates.harden import Progress, _finish_rootfs

# Not imported here: debian (mmdebstrap builds), oci (image import: tar readers), logging
# (one rare warning). A create loads this module and needs none; each import is paid where
# it is used.
_CHUNK = 1 << 20
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")  # a sha256 digest's hex part

DEFAULT_NAME = "default"

_STORE_FORMAT = 1

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class Template:
    """A named template: its content address and the tree sandboxes overlay."""

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
        suite: str | None = None,
        mirror: str | None = None,
        progress: Progress | None = None,
    ) -> Template:
        """Build a Debian template with mmdebstrap; same recipe, same digest, no rebuild.
        ``suite``: the Debian suite (default ``debian.DEFAULT_SUITE``)."""
        from agentbox.runtime.templates import debian
        from agentbox.runtime.templates.debian import (
            _MIRROR_RE,
            _RECIPE_FORMAT,
            _SUITE_RE,
            _VARIANT,
            _check_packages,
            _host_apt_options,
            _run_streaming,
            host_debian_sources,
        )

        suite = debian.DEFAULT_SUITE if suite is None else suite
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
            "arch": os.uname().machine,
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
        import shutil  # here, as tempfile below: builds and collections, never a create

        exe = shutil.which(debian.MMDEBSTRAP)  # looked up when called: tests set it
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
            import tarfile

            from agentbox.runtime.templates.oci import _apply_image

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
            tmp = self._pins / f".{key}.{token_hex(6)}.tmp"
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
        tmp = self._names_file.with_name(f".names.{token_hex(6)}.tmp")
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
                import logging

                logging.getLogger(__name__).warning(
                    "template collection skipped: cannot read %s: %s", self._state_db, exc
                )
                return
            for entry in self._digests.iterdir():
                if f"sha256:{entry.name}" in in_use:
                    continue
                # Renamed away under the lock so no reader sees a half-deleted tree.
                self._staging.mkdir(mode=0o711, exist_ok=True)
                trash = self._staging / f"trash-{token_hex(6)}"
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
        import tempfile

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


# ---- hashing ------------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    import hashlib  # here: OpenSSL's is the fast one for files, but no create needs it

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---- the default template -----------------------------------------------------------------


# ---- building with mmdebstrap --------------------------------------------------------------


# ---- importing images ---------------------------------------------------------------------


# ---- finishing a built or imported rootfs ------------------------------------------------------


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
    import shutil

    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise SandboxError(f"could not delete {path}: {exc}; delete it by hand") from exc
