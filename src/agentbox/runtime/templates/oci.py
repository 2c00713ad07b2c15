"""Importing a ``docker save`` or OCI image-layout tarball: the manifest picked, every
layer's digest checked while it is read, and each entry applied in order (whiteouts,
hard links, symlinks) with every path resolved inside the tree, so a link planted by an
earlier layer cannot send a later entry outside it."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agentbox.errors import AgentboxError, InvalidRequest
from agentbox.runtime import archive
from agentbox.runtime.templates.harden import _DIR_NOFOLLOW, Progress, _Tree, _Unsafe

_CHUNK = 1 << 20
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


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
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
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


# Image layers as docker and OCI tools write them: fifos kept, device nodes counted and
# dropped (the sandbox has its own /dev); whiteouts are files named .wh.* (_apply_member).
_LAYER_ENTRIES = archive.EntryPolicy(
    "layer entry",
    "layers hold files, directories, links, fifos and devices",
    special=frozenset({"fifo", "device", "whiteout"}),
)


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


# What a hostile or sloppy layer can cause: a path through a file, a dangling symlink, a loop.
_PLACEMENT_ERRNOS = {
    errno.ENOTDIR, errno.ELOOP, errno.EXDEV, errno.EEXIST, errno.ENOENT, errno.EISDIR,
    errno.EMLINK, errno.ENAMETOOLONG,
}  # fmt: skip


def _apply_member(
    tree: _Tree, layer: tarfile.TarFile, m: tarfile.TarInfo, seen: set[str], stats: _Stats
) -> None:
    try:
        entry = archive.checked(m, _LAYER_ENTRIES)
    except AgentboxError as exc:
        raise _Unsafe from exc
    rel = "/".join(entry.parts)
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
        _place(tree, layer, m, parent, base, entry.link)
    except OSError as exc:
        if exc.errno not in _PLACEMENT_ERRNOS:
            raise  # ENOSPC, EIO, ...: the import fails instead of silently losing files
        raise _Unsafe from exc
    finally:
        os.close(parent)


def _place(
    tree: _Tree,
    layer: tarfile.TarFile,
    m: tarfile.TarInfo,
    parent: int,
    base: str,
    link: tuple[str, ...] | None,
) -> None:
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
    elif link is not None:
        target = "/".join(link)
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
