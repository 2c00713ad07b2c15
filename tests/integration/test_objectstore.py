"""The snapshot blob stores: a folder on this host, and S3 as spoken by a real moto server
on loopback (started here; no other address is ever contacted)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from agentbox.errors import InvalidConfig, InvalidRequest, SandboxError, SnapshotNotFound
from agentbox.storage import objectstore
from agentbox.storage.objectstore import (
    FolderStore,
    ObjectInfo,
    ObjectStore,
    S3Store,
    open_store,
)
from s3kit import free_port

BAD_KEYS = [
    "",
    "/abs",
    "a//b",
    "a/",
    "../x",
    "a/../b",
    "a/./b",
    ".",
    "a b",
    "ä",
    "a\nb",
    "a~partial",
    "x" * 1025,
    "x" * 201,
]


def leftovers(*dirs: Path) -> list[Path]:
    """Temp files a writer left behind (their names end in ~partial)."""
    return [p for d in dirs for p in d.rglob("*") if p.name.endswith("~partial")]


def round_trip(store: ObjectStore, tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    key = "blobs/ab/ab" + "0" * 62
    assert not store.exists(key)
    store.put_file(key, src)
    store.put_file("manifests/one.json", src)
    assert store.exists(key)
    dest_dir = tmp_path / "out"
    dest_dir.mkdir(exist_ok=True)
    store.get_file(key, dest_dir / "copy.bin")
    assert (dest_dir / "copy.bin").read_bytes() == data
    with store.reading(key, dest_dir) as f:  # restore reads this way: in place when local
        assert f.read() == data
    assert sorted(p.name for p in dest_dir.iterdir()) == ["copy.bin"]  # no staging left
    listed = store.list()
    assert [o.key for o in listed] == [key, "manifests/one.json"]
    assert all(isinstance(o, ObjectInfo) and o.size == size for o in listed)
    assert all(abs(o.modified - time.time()) < 300 for o in listed)
    assert [o.key for o in store.list("blobs/")] == [key]
    assert [o.key for o in store.list("blobs/ab/ab00")] == [key]
    assert [o.key for o in store.list("manifests/o")] == ["manifests/one.json"]
    assert store.list("nothing/") == []
    store.delete(key)
    store.delete(key)  # idempotent
    assert not store.exists(key)
    with pytest.raises(SnapshotNotFound, match="no object"):
        store.get_file(key, dest_dir / "gone.bin")
    with pytest.raises(SnapshotNotFound, match="no object"), store.reading(key, dest_dir):
        pass
    assert not (dest_dir / "gone.bin").exists()
    assert [o.key for o in store.list()] == ["manifests/one.json"]
    assert leftovers(dest_dir) == []


def refuses_bad_keys(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x")
    for key in BAD_KEYS:
        for call in (
            lambda k: store.put_file(k, src),
            lambda k: store.get_file(k, tmp_path / "dest"),
            store.exists,
            store.delete,
        ):
            with pytest.raises(InvalidRequest, match="A-Z a-z 0-9"):
                call(key)
    for prefix in ("../", "/x", "a//"):
        with pytest.raises(InvalidRequest):
            store.list(prefix)


# --- the folder store -------------------------------------------------------------------


def test_folder_store_round_trip(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "store")
    round_trip(store, tmp_path, 300_000)
    assert leftovers(tmp_path / "store") == []


def test_folder_store_refuses_bad_keys(tmp_path: Path) -> None:
    refuses_bad_keys(FolderStore(tmp_path / "store"), tmp_path)


def test_folder_store_directories_are_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = open_store(None, home)
    assert isinstance(store, FolderStore) and store.root == home / "snapshots"
    src = tmp_path / "src"
    src.write_bytes(b"x")
    store.put_file("a/b/c", src)
    for d in (home, home / "snapshots", home / "snapshots/a", home / "snapshots/a/b"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert stat.S_IMODE((home / "snapshots/a/b/c").stat().st_mode) == 0o600


def test_a_failed_write_leaves_the_old_object_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FolderStore(tmp_path / "store")
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(b"old content")
    new.write_bytes(b"new content" * 1000)
    store.put_file("k", old)

    def disk_full(src: Any, dst: Any, length: int = 0) -> None:
        dst.write(src.read(100))
        raise OSError(28, "No space left on device")

    def disk_full_in_kernel(src: int, dst: int, count: int, *args: Any) -> int:
        os.write(dst, b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(objectstore.shutil, "copyfileobj", disk_full)
    monkeypatch.setattr(objectstore.os, "copy_file_range", disk_full_in_kernel)
    with pytest.raises(SandboxError, match="No space left"):
        store.put_file("k", new)
    with pytest.raises(SandboxError, match="No space left"):
        store.get_file("k", tmp_path / "dest")
    monkeypatch.undo()
    assert (tmp_path / "store/k").read_bytes() == b"old content"
    assert not (tmp_path / "dest").exists()
    assert leftovers(tmp_path) == []
    assert [o.key for o in store.list()] == ["k"]


def test_folder_store_ignores_what_is_not_an_object(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "dir").mkdir(parents=True)
    (root / "dir/.x.abc~partial").write_bytes(b"half")
    (root / "link").symlink_to("/etc/passwd")
    store = FolderStore(root)
    assert store.list() == []
    assert not store.exists("dir")
    store.delete("dir")  # a directory is no object: nothing to delete
    with pytest.raises(SnapshotNotFound):
        store.get_file("dir", tmp_path / "dest")
    assert FolderStore(tmp_path / "never-made").list() == []


def test_open_store_urls(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/my%20store", tmp_path)
    assert isinstance(store, FolderStore) and store.root == tmp_path / "my store"
    assert store.url == (tmp_path / "my store").as_uri()
    for url in ("http://example.invalid/x", "file://host/x", "file:relative", "s3:///x"):
        with pytest.raises(InvalidConfig):
            open_store(url, tmp_path)
    with pytest.raises(InvalidConfig) as caught:
        open_store("s3://AKIDEXAMPLE:hunter2secret@bucket/p", tmp_path)
    assert "hunter2secret" not in caught.value.message


# --- S3 through a moto server on loopback (tests/s3kit.py) ------------------------------


def test_s3_store_round_trip_of_a_multipart_file(bucket: str, tmp_path: Path, s3_env: str) -> None:
    import boto3.session

    store = open_store(f"s3://{bucket}/team/snaps/", tmp_path)
    assert isinstance(store, S3Store) and store.url == f"s3://{bucket}/team/snaps"
    round_trip(store, tmp_path, 9 * 1024**2)  # over boto's 8 MiB multipart threshold
    raw = boto3.session.Session().client("s3", endpoint_url=s3_env)
    names = [o["Key"] for o in raw.list_objects_v2(Bucket=bucket)["Contents"]]
    assert names == ["team/snaps/manifests/one.json"]


def test_s3_store_without_prefix_skips_foreign_objects(
    bucket: str, tmp_path: Path, s3_env: str
) -> None:
    import boto3.session

    raw = boto3.session.Session().client("s3", endpoint_url=s3_env)
    raw.put_object(Bucket=bucket, Key="not a key", Body=b"x")
    store = open_store(f"s3://{bucket}", tmp_path)
    src = tmp_path / "src"
    src.write_bytes(b"hello")
    store.put_file("a", src)
    assert store.list() == [ObjectInfo("a", 5, store.list()[0].modified)]


def test_s3_store_refuses_bad_keys(bucket: str, tmp_path: Path) -> None:
    refuses_bad_keys(S3Store(bucket), tmp_path)


def test_s3_missing_bucket_is_named(s3_env: str, tmp_path: Path) -> None:
    store = S3Store("no-such-bucket-here", "p")
    src = tmp_path / "src"
    src.write_bytes(b"x")
    calls = (
        lambda: store.put_file("k", src),
        lambda: store.get_file("k", tmp_path / "dest"),
        lambda: store.exists("k"),
        lambda: store.list(),
        lambda: store.delete("k"),
    )
    for call in calls:
        with pytest.raises(SandboxError) as caught:
            call()
        assert "bucket 'no-such-bucket-here' does not exist" in caught.value.message
        assert s3_env in caught.value.message
    assert leftovers(tmp_path) == [] and not (tmp_path / "dest").exists()


def test_s3_unreachable_endpoint_says_what_to_check(
    s3_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTBOX_S3_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SandboxError, match=r"cannot reach the S3 endpoint.*AGENTBOX_S3_ENDPOINT"):
        S3Store("bucket").exists("k")


def test_s3_store_urls_are_checked(s3_env: str, tmp_path: Path) -> None:
    for url in ("s3://bad bucket/x", "s3://b/../x", "s3://b/a//c"):
        with pytest.raises(InvalidConfig):
            open_store(url, tmp_path)


def test_folder_store_move_renames_on_the_same_filesystem(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "store")
    staged = tmp_path / "staged"
    staged.write_bytes(b"payload" * 1000)
    inode = staged.stat().st_ino
    store.put_file("a/b", staged, move=True)
    assert not staged.exists()  # given up: renamed, not copied
    assert (tmp_path / "store/a/b").stat().st_ino == inode
    out = tmp_path / "out"
    store.get_file("a/b", out)
    assert out.read_bytes() == b"payload" * 1000
