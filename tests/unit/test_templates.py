"""TemplateStore: the default template, safe image import, builds (with a fake mmdebstrap),
names and removal, host apt sources, and the `template` CLI group."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import re
import stat
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentbox.cli.template_commands import template as template_cli
from agentbox.config.specs import SandboxSpec
from agentbox.errors import HostUnsupported, InvalidRequest, SandboxError, TemplateNotFound
from agentbox.runtime.store import Store
from agentbox.runtime.templates import Template, TemplateStore, host_debian_sources
from agentbox.runtime.templates import debian as template_debian
from agentbox.runtime.templates import default as template_default

AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="needs root: chown, mknod, mount")


@pytest.fixture
def store(tmp_path: Path) -> TemplateStore:
    return TemplateStore(tmp_path / "home")


# ---- helpers: trees and tarballs -------------------------------------------------------------


def walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under root (relative path, lstat), never following symlinks."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            yield str(path.relative_to(root)), path.lstat()


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Contents of a tree: file bytes, symlink targets, "dir" for directories."""
    out: dict[str, bytes | str] = {}
    for rel, st in walk(root):
        path = root / rel
        if stat.S_ISLNK(st.st_mode):
            out[rel] = "-> " + os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = "dir"
        else:
            out[rel] = path.read_bytes()
    return out


def assert_hardened(rootfs: Path) -> None:
    """The invariants every template keeps on the host."""
    for rel, st in walk(rootfs):
        mode = st.st_mode
        assert not stat.S_ISCHR(mode) and not stat.S_ISBLK(mode), f"device node {rel}"
        if AS_ROOT:
            assert (st.st_uid, st.st_gid) == (0, 0), f"{rel} not owned by root"
        if stat.S_ISLNK(mode):
            continue
        assert not mode & (stat.S_IWGRP | stat.S_IWOTH), f"{rel} writable by group/other"
        if stat.S_ISREG(mode):
            assert not mode & (stat.S_ISUID | stat.S_ISGID), f"{rel} is setuid/setgid"


def _info(name: str, kind: bytes, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mtime = 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def f(name: str, data: bytes = b"", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.REGTYPE, mode=mode, size=len(data)), data


def d(name: str, mode: int = 0o755) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.DIRTYPE, mode=mode), b""


def sym(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.SYMTYPE, linkname=target, mode=0o777), b""


def hard(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.LNKTYPE, linkname=target, mode=0o644), b""


def dev(name: str) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666), b""


def tar_bytes(entries: list[tuple[tarfile.TarInfo, bytes]], *, gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if gz else raw


def write_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, data in files.items():
            info, _ = f(name, data)
            tf.addfile(info, io.BytesIO(data))
    return path


def hostile_layers(outside: Path) -> list[list[tuple[tarfile.TarInfo, bytes]]]:
    """Two layers exercising every rule of safe application."""
    layer1 = [
        d("etc"),
        f("etc/keep.txt", b"keep"),
        f("etc/gone.txt", b"gone"),
        sym("etc/link", str(outside / "target")),  # a symlink a later file lands on
        hard("etc/hard", "etc/keep.txt"),
        hard("etc/hard-out", "../outside/secret"),  # a hard link leaving the tree
        d("opaque"),
        f("opaque/old.txt", b"old"),
        d("opaque/sub"),
        f("opaque/sub/deep.txt", b"deep"),
        sym("evil", str(outside)),  # planted: absolute path to a real host directory
        sym("evilrel", "../../../../../../../../" + str(outside).lstrip("/")),
        d("usr"),
        d("usr/lib"),
        sym("lib", "/usr/lib"),  # an absolute in-image symlink (usr-merge)
        d("usr/bin"),
        f("usr/bin/suid", b"#!/bin/sh\n", mode=0o4755),
        f("usr/bin/sgid", b"#!/bin/sh\n", mode=0o2755),
        d("tmp", mode=0o1777),
        f("etc/world-writable", b"w", mode=0o666),
        d("dev"),
        dev("dev/evil"),
        f("../escape.txt", b"escaped"),
        f("/abs.txt", b"absolute"),
        f("./dotted/../../escape2.txt", b"escaped"),
    ]
    layer2 = [
        f("etc/.wh.gone.txt"),
        d("opaque"),
        f("opaque/.wh..wh..opq"),
        f("opaque/new.txt", b"new"),
        f("evil/pwned", b"pwned"),  # write through the planted symlink
        f("evilrel/pwned2", b"pwned"),
        f("etc/link", b"replaced"),  # must replace the symlink, not write its target
        f("lib/libfoo.so", b"elf"),  # through lib -> /usr/lib, resolved inside the tree
        hard("usr/bin/suid-link", "usr/bin/suid"),
    ]
    return [layer1, layer2]


def docker_save(path: Path, layers: list[bytes]) -> Path:
    manifest = [{"Config": "config.json", "RepoTags": ["t:1"], "Layers": []}]
    with tarfile.open(path, "w") as tf:
        for i, data in enumerate(layers):
            name = f"{i:064x}/layer.tar"
            manifest[0]["Layers"].append(name)  # type: ignore[attr-defined]
            info, _ = f(name, data)
            tf.addfile(info, io.BytesIO(data))
        for name, data in {
            "config.json": b"{}",
            "manifest.json": json.dumps(manifest).encode(),
        }.items():
            info, _ = f(name, data)
            tf.addfile(info, io.BytesIO(data))
    return path


def oci_layout(path: Path, layers: list[tuple[bytes, str]], *, lie: bool = False) -> Path:
    """An OCI image-layout tarball; ``lie`` stores a layer under a wrong digest."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return "sha256:" + digest

    descs = [{"mediaType": mt, "digest": blob(data), "size": len(data)} for data, mt in layers]
    if lie:
        real = descs[0]["digest"].split(":")[1]
        blobs[real] = blobs[real] + b"tampered"
    config = blob(b"{}")
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config},
            "layers": descs,
        }
    ).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": blob(manifest),
                "size": len(manifest),
            }
        ],
    }
    files = {f"blobs/sha256/{k}": v for k, v in blobs.items()}
    files["oci-layout"] = b'{"imageLayoutVersion": "1.0.0"}'
    files["index.json"] = json.dumps(index).encode()
    return write_tar(path, files)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory a hostile image aims at."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret").write_text("host secret")
    (out / "target").write_text("original")
    return out


def check_hostile_result(
    t: Template, outside_before: dict[str, bytes | str], outside: Path
) -> None:
    root = t.rootfs
    assert snapshot(outside) == outside_before, "something was written outside the rootfs"
    assert not (outside.parent / "escape.txt").exists()
    assert not (outside.parent / "escape2.txt").exists()
    assert not (outside.parent / "home" / "escape.txt").exists()
    # normal files, whiteout, opaque directory
    assert (root / "etc/keep.txt").read_bytes() == b"keep"
    assert not (root / "etc/gone.txt").exists()
    assert sorted(os.listdir(root / "opaque")) == ["new.txt"]
    # unsafe names skipped entirely, not "sanitised" into the tree
    for name in ("escape.txt", "abs.txt", "escape2.txt", "etc/hard-out"):
        assert not (root / name).exists(), name
    # the symlink at etc/link was replaced by a file; its host target untouched
    assert not (root / "etc/link").is_symlink()
    assert (root / "etc/link").read_bytes() == b"replaced"
    # writes through planted symlinks never left the tree (and found no directory in it)
    assert "pwned" not in str(snapshot(root))
    # an absolute in-image symlink resolves inside the tree
    assert (root / "usr/lib/libfoo.so").read_bytes() == b"elf"
    # hard links stay inside the tree
    assert (root / "etc/hard").stat().st_ino == (root / "etc/keep.txt").stat().st_ino
    assert (root / "usr/bin/suid-link").stat().st_ino == (root / "usr/bin/suid").stat().st_ino
    # setuid/setgid stripped, execute kept; devices dropped; nothing writable by others
    assert stat.S_IMODE((root / "usr/bin/suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "usr/bin/sgid").stat().st_mode) == 0o755
    assert not (root / "dev/evil").exists()
    assert stat.S_IMODE((root / "etc/world-writable").stat().st_mode) == 0o644
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1755
    # what every template gets
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert passwd[0].startswith("root:x:0:0:")
    assert "user:x:1000:1000::/home/user:/bin/sh" in passwd
    assert "user:x:1000:" in (root / "etc/group").read_text().splitlines()
    assert (root / "workspace").is_dir() and (root / "home/user").is_dir()
    assert (root / "etc/resolv.conf").read_bytes() == b""
    assert_hardened(root)


# ---- the default template ------------------------------------------------------------------


def test_default_template_is_a_small_synthesised_rootfs(store: TemplateStore) -> None:
    t = store.get("default")
    root = t.rootfs
    assert t.name == "default" and t.host_usr is True
    assert t.digest.startswith("sha256:") and len(t.digest) == 71
    assert root == store.root / "sha256" / t.digest.split(":")[1] / "rootfs"
    assert list((root / "usr").iterdir()) == []  # mount point for the host's /usr
    for link in ("bin", "sbin", "lib", "lib64"):
        assert os.readlink(root / link) == f"usr/{link}"
    for directory in ("proc", "dev", "tmp", "run", "workspace", "home/user", "root", "var/tmp"):
        assert (root / directory).is_dir() and not (root / directory).is_symlink()
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert any(line.startswith("root:x:0:0:") for line in passwd)
    assert "user:x:1000:1000::/home/user:/bin/bash" in passwd
    assert "user:x:1000:" in (root / "etc/group").read_text()
    assert "localhost" in (root / "etc/hosts").read_text()
    assert "files" in (root / "etc/nsswitch.conf").read_text()
    assert (root / "etc/resolv.conf").read_bytes() == b""
    assert "agentbox" in (root / "etc/os-release").read_text()
    assert "PATH=" in (root / "etc/profile").read_text()
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if ca.is_file():
        assert (root / "etc/ssl/certs/ca-certificates.crt").read_bytes() == ca.read_bytes()
    # the dynamic linker's index of the same /usr: without it each exec probes ~40 paths
    assert (root / "etc/ld.so.cache").read_bytes() == Path("/etc/ld.so.cache").read_bytes()
    for rel, st in walk(root):
        if not stat.S_ISLNK(st.st_mode):
            assert stat.S_IMODE(st.st_mode) in (0o644, 0o755, 0o700), rel
    assert_hardened(root)


def test_default_template_leaks_nothing_from_host_etc(store: TemplateStore) -> None:
    root = store.get("default").rootfs
    etc = snapshot(root / "etc")
    blob = b"\n".join(v if isinstance(v, bytes) else v.encode() for v in etc.values())
    assert not any(name in etc for name in ("shadow", "gshadow", "machine-id", "ssh", "sudoers"))
    hostname = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else ""
    if len(hostname) >= 3 and hostname != "agentbox":
        assert hostname.encode() not in blob
    if Path("/etc/shadow").exists():
        for line in Path("/etc/shadow").read_text().splitlines():
            secret = line.split(":")[1] if ":" in line else ""
            if len(secret) > 3:  # a real hash, not "*" or "!"
                assert secret.encode() not in blob
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()}
    ours = {line.split(":")[0] for line in (root / "etc/passwd").read_text().splitlines()}
    assert ours - {"root", "user", "nobody"} == set()
    assert not (host_users - {"root", "user", "nobody"}) & ours
    # alternatives are names pointing into /usr, never copies of host files
    for rel, st in walk(root / "etc/alternatives") if (root / "etc/alternatives").exists() else []:
        assert stat.S_ISLNK(st.st_mode)
        assert os.readlink(root / "etc/alternatives" / rel).startswith("/usr/")


def test_default_digest_is_the_hash_of_its_content(
    tmp_path: Path, store: TemplateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = store.get("default")
    assert store.get("default") == first
    assert TemplateStore(tmp_path / "other-home").get("default").digest == first.digest
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(template_default, "_CA_BUNDLE", bundle)
    changed = store.get("default")
    assert changed.digest != first.digest
    assert (
        changed.rootfs / "etc/ssl/certs/ca-certificates.crt"
    ).read_bytes() == bundle.read_bytes()
    names = json.loads((store.root / "names.json").read_text())
    assert names == {"format": 1, "names": {"default": changed.digest}}


def test_a_new_process_reuses_the_default_digest_until_an_input_changes(
    tmp_path: Path, store: TemplateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_text("first\n")
    monkeypatch.setattr(template_default, "_CA_BUNDLE", bundle)
    first = store.get("default")
    computed: list[int] = []
    real_entries = template_default._default_entries

    def counting_entries() -> list[template_default._Entry]:
        computed.append(1)
        return real_entries()

    # A fresh process: no in-memory cache, a new store on the same home.
    monkeypatch.setattr(template_default, "_default_cache", None)
    monkeypatch.setattr(template_default, "_default_entries", counting_entries)
    assert TemplateStore(store.root.parent).get("default") == first
    assert computed == []  # served from what the first process remembered
    bundle.write_text("second, longer\n")  # the host's CA bundle is updated
    changed = TemplateStore(store.root.parent).get("default")
    assert computed == [1] and changed.digest != first.digest
    assert (changed.rootfs / "etc/ssl/certs/ca-certificates.crt").read_text() == "second, longer\n"


def test_unknown_template_says_what_exists_and_how_to_make_one(store: TemplateStore) -> None:
    with pytest.raises(TemplateNotFound) as err:
        store.get("nope")
    message = err.value.message
    assert "nope" in message and "default" in message
    assert "agentbox template build nope" in message and "agentbox template import" in message


def test_list_includes_default_on_a_fresh_host(store: TemplateStore) -> None:
    assert [t.name for t in store.list()] == ["default"]
    assert json.dumps(store.list()[0].to_dict())  # JSON-serialisable


@pytest.mark.parametrize("name", ["", "Bad", "a b", "../x", "x/y", "-x", "a" * 64])
def test_bad_names_are_refused(store: TemplateStore, tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidRequest):
        store.import_image(name, write_tar(tmp_path / "x.tar", {"a": b""}))


def test_default_cannot_be_replaced(store: TemplateStore, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="default"):
        store.import_image("default", write_tar(tmp_path / "x.tar", {"a": b""}))


# ---- importing images -----------------------------------------------------------------------


def test_docker_save_import_is_safe(store: TemplateStore, tmp_path: Path, outside: Path) -> None:
    before = snapshot(outside)
    image = docker_save(
        tmp_path / "image.tar", [tar_bytes(layer) for layer in hostile_layers(outside)]
    )
    progress: list[str] = []
    t = store.import_image("hostile", image, progress=progress.append)
    assert t.digest == "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
    assert t.host_usr is False and t.size_bytes > 0
    check_hostile_result(t, before, outside)
    report = "\n".join(progress)
    assert "skipped unsafe entry '../escape.txt'" in report
    assert "'/abs.txt'" in report and "'evil/pwned'" in report
    assert "dropped 1 device nodes" in report


def test_oci_layout_import_gzip_and_plain_layers(
    store: TemplateStore, tmp_path: Path, outside: Path
) -> None:
    before = snapshot(outside)
    layer1, layer2 = hostile_layers(outside)
    image = oci_layout(
        tmp_path / "oci.tar",
        [
            (tar_bytes(layer1, gz=True), "application/vnd.oci.image.layer.v1.tar+gzip"),
            (tar_bytes(layer2), "application/vnd.oci.image.layer.v1.tar"),
        ],
    )
    t = store.import_image("oci", image)
    check_hostile_result(t, before, outside)


def test_oci_index_of_manifests_picks_this_host_platform(
    store: TemplateStore, tmp_path: Path
) -> None:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> str:
        blobs[hashlib.sha256(data).hexdigest()] = data
        return "sha256:" + hashlib.sha256(data).hexdigest()

    manifests = []
    for plat in ("other-arch", arch):
        layer = tar_bytes([f("platform", plat.encode())], gz=True)
        manifest = json.dumps(
            {"schemaVersion": 2, "layers": [{"digest": blob(layer), "mediaType": "x+gzip"}]}
        ).encode()
        manifests.append(
            {"digest": blob(manifest), "platform": {"os": "linux", "architecture": plat}}
        )
    inner = json.dumps({"schemaVersion": 2, "manifests": manifests}).encode()
    index = {"schemaVersion": 2, "manifests": [{"digest": blob(inner)}]}
    files = {f"blobs/sha256/{k}": v for k, v in blobs.items()}
    files |= {"oci-layout": b"{}", "index.json": json.dumps(index).encode()}
    t = store.import_image("multi", write_tar(tmp_path / "multi.tar", files))
    assert (t.rootfs / "platform").read_text() == arch


def test_docker_save_symlinked_duplicate_layer(store: TemplateStore, tmp_path: Path) -> None:
    """docker save stores a repeated layer once and symlinks the second copy."""
    layer = tar_bytes([f("counter", b"x")])
    image = tmp_path / "dup.tar"
    manifest = [{"Config": "c.json", "Layers": ["aa/layer.tar", "bb/layer.tar"]}]
    with tarfile.open(image, "w") as tf:
        info, _ = f("aa/layer.tar", layer)
        tf.addfile(info, io.BytesIO(layer))
        tf.addfile(sym("bb/layer.tar", "../aa/layer.tar")[0])
        data = json.dumps(manifest).encode()
        tf.addfile(f("manifest.json", data)[0], io.BytesIO(data))
    t = store.import_image("dup", image)
    assert (t.rootfs / "counter").read_bytes() == b"x"


def test_oci_layer_not_matching_its_digest_is_refused(store: TemplateStore, tmp_path: Path) -> None:
    layer = tar_bytes([f("hello", b"hi")])
    image = oci_layout(
        tmp_path / "bad.tar", [(layer, "application/vnd.oci.image.layer.v1.tar")], lie=True
    )
    with pytest.raises(InvalidRequest, match="does not match its digest"):
        store.import_image("bad", image)
    assert list((store.root / "tmp").iterdir()) == []
    assert not (store.root / "sha256").exists() or list((store.root / "sha256").iterdir()) == []


def test_zstd_layers_are_refused_clearly(store: TemplateStore, tmp_path: Path) -> None:
    layer = b"\x28\xb5\x2f\xfd" + b"\x00" * 64
    image = oci_layout(tmp_path / "z.tar", [(layer, "application/vnd.oci.image.layer.v1.tar+zstd")])
    with pytest.raises(InvalidRequest, match="zstd"):
        store.import_image("z", image)


def test_existing_user_and_passwd_are_kept(store: TemplateStore, tmp_path: Path) -> None:
    passwd = b"root:x:0:0:root:/root:/bin/ash\nnode:x:1000:1000::/home/node:/bin/sh\n"
    layer = tar_bytes([d("etc"), f("etc/passwd", passwd), d("bin"), f("bin/bash", b"", 0o755)])
    t = store.import_image("node", docker_save(tmp_path / "n.tar", [layer]))
    lines = (t.rootfs / "etc/passwd").read_text().splitlines()
    assert lines[:2] == passwd.decode().splitlines()
    assert lines[2] == "user:x:1000:1000::/home/user:/bin/bash"


def test_passwd_symlinked_out_of_the_tree_is_replaced_not_followed(
    store: TemplateStore, tmp_path: Path, outside: Path
) -> None:
    before = snapshot(outside)
    layer = tar_bytes([d("etc"), sym("etc/passwd", str(outside / "target"))])
    t = store.import_image("sneaky", docker_save(tmp_path / "s.tar", [layer]))
    assert snapshot(outside) == before
    assert not (t.rootfs / "etc/passwd").is_symlink()
    assert "user:x:1000:1000" in (t.rootfs / "etc/passwd").read_text()


@pytest.mark.parametrize(
    "files",
    [
        {"random.txt": b"hello"},  # a tar, but no image in it
        {"manifest.json": b"not json"},
        {"manifest.json": b"[]"},
        {"manifest.json": b'[{"Layers": ["missing/layer.tar"]}]'},
        {"manifest.json": b'{"Layers": 1}'},
        {"oci-layout": b"{}", "index.json": b'{"manifests": [{"size": 1}]}'},
        {"oci-layout": b"{}", "index.json": b"[1, 2]"},
    ],
)
def test_broken_images_fail_and_leave_nothing(
    store: TemplateStore, tmp_path: Path, files: dict[str, bytes]
) -> None:
    with pytest.raises(InvalidRequest):
        store.import_image("broken", write_tar(tmp_path / "b.tar", files))
    assert list((store.root / "tmp").iterdir()) == []
    assert (
        "broken" not in (store.root / "names.json").read_text()
        if (store.root / "names.json").exists()
        else True
    )


def test_not_a_tarball(store: TemplateStore, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(InvalidRequest, match="docker save"):
        store.import_image("junk", junk)
    with pytest.raises(InvalidRequest, match="does not exist"):
        store.import_image("junk", tmp_path / "missing.tar")


# ---- names, sharing, removal ----------------------------------------------------------------


def test_names_share_digests_and_removal_keeps_shared_trees(
    store: TemplateStore, tmp_path: Path
) -> None:
    image = docker_save(tmp_path / "i.tar", [tar_bytes([f("hello", b"hi")])])
    progress: list[str] = []
    a = store.import_image("a", image)
    b = store.import_image("b", image, progress=progress.append)
    assert a.digest == b.digest and a.rootfs == b.rootfs
    assert progress[0].startswith("cache hit")
    store.remove("a")
    assert b.rootfs.is_dir()
    assert store.get("b").digest == b.digest
    with pytest.raises(TemplateNotFound):
        store.get("a")
    store.remove("b")
    assert not b.rootfs.parent.exists()
    assert [t.name for t in store.list()] == ["default"]
    with pytest.raises(TemplateNotFound):
        store.remove("b")


def test_renaming_a_name_to_new_content_frees_the_old_tree(
    store: TemplateStore, tmp_path: Path
) -> None:
    old = store.import_image("x", docker_save(tmp_path / "1.tar", [tar_bytes([f("v", b"1")])]))
    new = store.import_image("x", docker_save(tmp_path / "2.tar", [tar_bytes([f("v", b"2")])]))
    assert old.digest != new.digest
    assert not old.rootfs.exists()
    assert (store.get("x").rootfs / "v").read_bytes() == b"2"


def test_a_tree_stays_while_a_sandbox_record_or_a_snapshot_pin_uses_it(
    store: TemplateStore, tmp_path: Path
) -> None:
    old = store.import_image("x", docker_save(tmp_path / "1.tar", [tar_bytes([f("v", b"1")])]))
    records = Store(store.root.parent / "state.db")
    records.reserve("sb-1", "x", old.digest, SandboxSpec(), None, 8)
    new = store.import_image("x", docker_save(tmp_path / "2.tar", [tar_bytes([f("v", b"2")])]))
    assert new.digest != old.digest
    assert (old.rootfs / "v").read_bytes() == b"1"  # re-pointed, still the sandbox's root
    assert store.exact("x", old.digest) == Template(
        "x", old.digest, old.rootfs, False, old.created_at, old.size_bytes
    )
    store.pin("snap-1", old.digest)
    records.delete("sb-1")
    store.release(old.digest)
    assert old.rootfs.is_dir()  # the snapshot restores onto it
    store.remove("x")  # no name, no record, still pinned
    assert old.rootfs.is_dir() and not new.rootfs.exists()
    store.unpin("snap-1")
    assert list((store.root / "sha256").iterdir()) == []
    with pytest.raises(TemplateNotFound, match="no longer on this host"):
        store.exact("x", old.digest)


def test_unreadable_sandbox_records_keep_every_tree(store: TemplateStore, tmp_path: Path) -> None:
    t = store.import_image("x", docker_save(tmp_path / "1.tar", [tar_bytes([f("v", b"1")])]))
    (store.root.parent / "state.db").write_bytes(b"not a database, " * 512)
    store.remove("x")  # maybe a sandbox's root: nothing is deleted blind
    assert t.rootfs.is_dir()


def test_a_reservation_on_a_collected_tree_is_refused(store: TemplateStore, tmp_path: Path) -> None:
    t = store.import_image("x", docker_save(tmp_path / "1.tar", [tar_bytes([f("v", b"1")])]))
    store.remove("x")  # between a create's get and its record
    with pytest.raises(TemplateNotFound, match="create the sandbox again"), store.reserving(t):
        raise AssertionError("a record must not be written on a deleted tree")


def test_stale_staging_from_a_crash_is_swept(store: TemplateStore, tmp_path: Path) -> None:
    crashed = store.root / "tmp" / "build-crashed"
    (crashed / "rootfs").mkdir(parents=True)
    (crashed / ".lock").touch()  # nobody holds its lock any more
    store.import_image("x", docker_save(tmp_path / "1.tar", [tar_bytes([f("v", b"1")])]))
    assert not crashed.exists()


# ---- building (fake mmdebstrap) -------------------------------------------------------------

FAKE_MMDEBSTRAP = """\
#!/usr/bin/env python3
import json, os, sys
from pathlib import Path
log = Path(os.environ["FAKE_LOG"])
with log.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_MOUNT"):  # an interrupted mmdebstrap can leave its mounts behind
    target = Path(sys.argv[sys.argv.index("--") + 2]) / "proc"
    target.mkdir(parents=True)
    os.system(f"mount -t tmpfs agentbox-test {target}")
if os.environ.get("FAKE_FAIL"):
    for i in range(40):
        print(f"Get:{i} http://deb.debian.org/debian bookworm/main thing", flush=True)
    print("E: Unable to locate package nosuchpkg", file=sys.stderr, flush=True)
    sys.exit(100)
args = sys.argv[sys.argv.index("--") + 1:]
root = Path(args[1])
print("I: running apt-get update...", flush=True)
print("Setting up python3 (3.11) ...", file=sys.stderr, flush=True)
for d in ("etc/apt/apt.conf.d", "usr/bin", "dev", "tmp", "home"):
    (root / d).mkdir(parents=True, exist_ok=True)
(root / "bin").symlink_to("usr/bin")
(root / "usr/bin/bash").write_text("")
(root / "usr/bin/su").write_text("")
os.chmod(root / "usr/bin/su", 0o4755)
os.chmod(root / "tmp", 0o1777)
os.mknod(root / "dev/null", 0o666 | 0o020000, os.makedev(1, 3))
(root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\\n")
(root / "etc/group").write_text("root:x:0:\\n")
(root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\\n")
(root / "etc/resolv.conf").write_text("nameserver 10.9.9.9\\n")  # what mmdebstrap copies
(root / "etc/hostname").write_text("buildhost\\n")
(root / "etc/apt/apt.conf.d/99mmdebstrap").write_text('Acquire::http::Proxy "x";\\n')
print("I: success in 0.1 seconds", flush=True)
"""


@pytest.fixture
def fake_mmdebstrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    exe = tmp_path / "bin" / "mmdebstrap"
    exe.parent.mkdir()
    exe.write_text(FAKE_MMDEBSTRAP)
    exe.chmod(0o755)
    log = tmp_path / "mmdebstrap.log"
    monkeypatch.setattr(template_debian, "MMDEBSTRAP", str(exe))
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


@needs_root
def test_build_runs_mmdebstrap_streams_progress_and_finishes_the_tree(
    store: TemplateStore, fake_mmdebstrap: Path
) -> None:
    progress: list[str] = []
    t = store.build("py", ["python3", "git", "python3"], progress=progress.append)
    argv = json.loads(fake_mmdebstrap.read_text().splitlines()[0])
    assert "--mode=root" in argv and "--variant=apt" in argv and "--verbose" in argv
    assert "--include=git,python3" in argv
    assert argv[argv.index("--") + 1] == "bookworm"
    assert "Setting up python3 (3.11) ..." in progress  # stderr lines reach progress too
    assert any(line.startswith("built py") for line in progress)
    root = t.rootfs
    assert "user:x:1000:1000::/home/user:/bin/bash" in (root / "etc/passwd").read_text()
    assert "user:!:" in (root / "etc/shadow").read_text()
    assert (root / "etc/resolv.conf").read_bytes() == b""
    assert (root / "etc/hostname").read_text() == "agentbox\n"
    assert not (root / "dev/null").exists()
    assert not (root / "etc/apt/apt.conf.d/99mmdebstrap").exists()
    assert (root / "workspace").is_dir()
    assert_hardened(root)
    meta = json.loads((root.parent / "template.json").read_text())
    assert meta["recipe"]["packages"] == ["git", "python3"]


@needs_root
def test_same_recipe_is_a_cache_hit(store: TemplateStore, fake_mmdebstrap: Path) -> None:
    first = store.build("py", ["python3", "git"])
    progress: list[str] = []
    again = store.build("py-too", ["git", "python3"], progress=progress.append)
    assert again.digest == first.digest and again.rootfs == first.rootfs
    assert progress[0].startswith("cache hit")
    assert len(fake_mmdebstrap.read_text().splitlines()) == 1  # ran once
    other = store.build("py3", ["python3"], suite="trixie")
    assert other.digest != first.digest


@needs_root
def test_failed_build_leaves_nothing_and_quotes_the_output(
    store: TemplateStore, fake_mmdebstrap: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(SandboxError) as err:
        store.build("broken", ["nosuchpkg"])
    assert "E: Unable to locate package nosuchpkg" in err.value.message
    assert "exit code 100" in err.value.message
    assert "Get:0 " not in err.value.message  # only the tail
    assert list((store.root / "tmp").iterdir()) == []
    assert not (store.root / "sha256").exists()
    with pytest.raises(TemplateNotFound):
        store.get("broken")


@needs_root
def test_failed_build_unmounts_what_it_left_before_deleting(
    store: TemplateStore, fake_mmdebstrap: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL", "1")
    monkeypatch.setenv("FAKE_MOUNT", "1")
    with pytest.raises(SandboxError):
        store.build("broken", ["git"])
    assert str(store.root) not in Path("/proc/self/mountinfo").read_text()
    assert list((store.root / "tmp").iterdir()) == []


@pytest.mark.parametrize(
    ("packages", "suite", "mirror"),
    [
        (["./evil.deb"], "bookworm", None),  # a local path would read host files
        (["?priority(required)"], "bookworm", None),
        (["a,b"], "bookworm", None),
        (["git"], "../x", None),
        (["git"], "bookworm", "file:///etc"),
        (["git"], "bookworm", "http://x y"),
    ],
)
def test_build_refuses_bad_recipes(
    store: TemplateStore, packages: list[str], suite: str, mirror: str | None
) -> None:
    with pytest.raises(InvalidRequest):
        store.build("x", packages, suite=suite, mirror=mirror)


@needs_root
def test_missing_mmdebstrap_says_how_to_install_it(
    store: TemplateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(template_debian, "MMDEBSTRAP", "/nonexistent/mmdebstrap")
    with pytest.raises(HostUnsupported, match="apt-get install mmdebstrap"):
        store.build("x", ["git"])


# ---- host apt sources ---------------------------------------------------------------------


def test_host_sources_keep_debian_entries_only(tmp_path: Path) -> None:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    key = tmp_path / "debian.gpg"
    key.write_bytes(b"key")
    (apt / "sources.list.d" / "debian.sources").write_text(
        textwrap.dedent(f"""\
            Types: deb
            # a comment
            URIs: http://mirror.example/debian
            Suites: bookworm bookworm-updates
            Components: main contrib
            Signed-By: {key}

            Types: deb
            URIs: http://mirror.example/debian-security
            Suites: bookworm-security
            Components: main
            Signed-By: {key}

            Types: deb
            URIs: http://off.example/debian
            Suites: bookworm
            Components: main
            Enabled: no
            """)
    )
    (apt / "sources.list").write_text(
        "deb [arch=amd64 signed-by=/nope.gpg] http://one.example/debian bookworm main\n"
        "deb-src http://one.example/debian bookworm main\n"
    )
    (apt / "sources.list.d" / "cloud.list").write_text(
        "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
    )
    (apt / "sources.list.d" / "node.sources.disabled-by-farm").write_text(
        "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: bookworm\n"
    )
    release = tmp_path / "os-release"
    release.write_text('NAME="Debian"\nVERSION_CODENAME=bookworm\n')

    same = host_debian_sources("bookworm", apt, release)
    assert same is not None
    assert "URIs: http://one.example/debian\nSuites: bookworm\nComponents: main\n" in same
    assert "/nope.gpg" not in same  # a keyring that does not exist is not passed on
    assert f"Suites: bookworm bookworm-updates\nComponents: main contrib\nSigned-By: {key}" in same
    assert "URIs: http://mirror.example/debian-security\nSuites: bookworm-security" in same
    for absent in ("google", "nodesource", "off.example", "deb-src"):
        assert absent not in same

    other = host_debian_sources("trixie", apt, release)
    assert other is not None
    assert "Suites: trixie\n" in other
    assert "security" not in other and "updates" not in other
    assert "mirror.example/debian\n" in other

    release.write_text('NAME="Alpine"\n')
    assert host_debian_sources("bookworm", apt, release) is None


# ---- CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("AGENTBOX_HOME", str(tmp_path / "clihome"))
    return CliRunner(mix_stderr=False)


def test_cli_ls_import_rm(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(template_cli, ["ls", "--json"])
    assert result.exit_code == 0, result.stderr
    assert [t["name"] for t in json.loads(result.stdout)] == ["default"]

    image = docker_save(tmp_path / "i.tar", [tar_bytes([f("hello", b"hi")])])
    result = cli.invoke(template_cli, ["import", "hello", str(image)])
    assert result.exit_code == 0, result.stderr
    name, digest = result.stdout.split()
    assert name == "hello" and digest.startswith("sha256:")
    assert "importing" in result.stderr

    result = cli.invoke(template_cli, ["import", "hello2", str(image), "--json"])
    assert json.loads(result.stdout)["digest"] == digest

    table = cli.invoke(template_cli, ["ls"]).stdout
    assert "NAME" in table and "hello" in table and "(host /usr)" in table

    assert cli.invoke(template_cli, ["rm", "hello"]).exit_code == 0
    result = cli.invoke(template_cli, ["rm", "hello"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error[template_not_found]: no template named 'hello'")
    assert "Traceback" not in result.stderr


def test_cli_errors_are_one_line(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(template_cli, ["import", "x", str(tmp_path / "missing.tar")])
    assert result.exit_code == 1
    assert re.match(r"error\[\w+\]: image tarball", result.stderr), result.stderr
    result = cli.invoke(template_cli, ["build", "x", "--packages", "./evil.deb"])
    assert result.exit_code == 1 and "is not a Debian package name" in result.stderr


@needs_root
def test_cli_build(cli: CliRunner, fake_mmdebstrap: Path) -> None:
    result = cli.invoke(template_cli, ["build", "py", "--packages", "python3,git"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("py sha256:")
    assert "Setting up python3" in result.stderr  # progress on stderr, not stdout
    result = cli.invoke(template_cli, ["build", "py", "--packages", "git,python3", "--json"])
    doc = json.loads(result.stdout)
    assert doc["name"] == "py" and doc["host_usr"] is False
    assert "cache hit" in result.stderr


@pytest.mark.parametrize("command", [[], ["ls"], ["build"], ["import"], ["rm"]])
def test_cli_help_has_examples(cli: CliRunner, command: list[str]) -> None:
    result = cli.invoke(template_cli, [*command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.stdout and "agentbox template" in result.stdout
