"""Where snapshot blobs live: a local folder or an S3 bucket, behind one small interface.

    open_store(None, home)                  FolderStore(home / "snapshots")   the default
    open_store("file:///srv/snaps", home)   FolderStore(Path("/srv/snaps"))
    open_store("s3://bucket/prefix", home)  S3Store("bucket", "prefix")

Keys look like relative POSIX paths (``blobs/ab/ab12…``) of ``[A-Za-z0-9._-]`` segments,
and both stores accept exactly the same keys, so a store can be moved to the other kind.
Objects appear whole or not at all: the folder store writes a temp file and renames it;
S3 shows an object only once its upload has completed.

S3 settings come from the standard AWS variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, …); ``AGENTBOX_S3_ENDPOINT`` (or
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``) names an S3-compatible server, which is
then addressed path-style (most such servers have no per-bucket host names). Buckets are
never created here: a missing one is an operator's mistake to be told about.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from agentbox.errors import (
    AgentboxError,
    InvalidConfig,
    InvalidRequest,
    SandboxError,
    SnapshotNotFound,
)
from agentbox.fsutil import atomic_file, fsync_dir

_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,200}")  # 200: room for the temp-file affixes
_MAX_KEY = 1024  # S3's own limit
_KEY_RULES = (
    "a key is up to 1024 characters of A-Z a-z 0-9 . _ - /, split by / into segments "
    "that are not empty, '.' or '..' and have at most 200 characters; no leading /"
)
_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")  # what botocore accepts
_TEMP_SUFFIX = "~partial"  # "~" is no key character: a temp file is never listed as an object
_CHUNK = 1 << 20
_MISSING = {"404", "NoSuchKey", "NotFound"}
_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
}
_WRONG_REGION = {"PermanentRedirect", "AuthorizationHeaderMalformed", "301"}


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int  # bytes
    modified: float  # seconds since the epoch


def check_key(key: str) -> str:
    """The key itself if both stores can hold it, else InvalidRequest saying what is allowed."""
    if not _is_key(key):
        raise InvalidRequest(f"invalid object key {key!r}: {_KEY_RULES}", key=key)
    return key


def _is_key(key: str) -> bool:
    return (
        0 < len(key) <= _MAX_KEY
        and key.isascii()
        and all(_SEGMENT.fullmatch(s) and s not in (".", "..") for s in key.split("/"))
    )


def _check_prefix(prefix: str) -> None:
    """A listing prefix is a key, a key's start, or a key's directory ending in '/'."""
    if prefix and not _is_key(prefix.removesuffix("/")):
        raise InvalidRequest(f"invalid key prefix {prefix!r}: {_KEY_RULES}", prefix=prefix)


class ObjectStore(ABC):
    """A flat map from keys to blobs. Every method raises agentbox errors only."""

    url: str  # where the store is, for messages

    @abstractmethod
    def put_file(self, key: str, path: Path, *, move: bool = False) -> None:
        """Store the file at ``path`` as ``key``, replacing any object there. ``move``: the
        caller gives the file up (a store on the same filesystem renames it: no copy)."""

    @abstractmethod
    def get_file(self, key: str, dest: Path) -> None:
        """Write object ``key`` to ``dest`` (replaced whole); SnapshotNotFound if absent."""

    @contextlib.contextmanager
    def reading(self, key: str, scratch: Path) -> Iterator[IO[bytes]]:
        """Object ``key`` open for reading; SnapshotNotFound if absent. A remote object is
        fetched into ``scratch`` (a directory) first and removed afterwards."""
        staging = scratch / f"get-{secrets.token_hex(8)}"
        try:
            self.get_file(key, staging)
            with staging.open("rb") as f:
                yield f
        finally:
            staging.unlink(missing_ok=True)

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """Objects whose key starts with ``prefix``, sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove object ``key``; nothing happens if it is already gone."""


def _copy(src: IO[bytes], out: IO[bytes]) -> None:
    """Copy in the kernel (``copy_file_range``: no trip through Python, a reflink where the
    filesystem can); byte by byte where it cannot."""
    try:
        while os.copy_file_range(src.fileno(), out.fileno(), _CHUNK * 64):
            pass
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise  # a full disk is a full disk
        src.seek(0)
        out.seek(0)
        out.truncate()
        shutil.copyfileobj(src, out, _CHUNK)


def _make_dirs(path: Path) -> None:
    """os.makedirs with 0o700 for every directory it creates (makedirs gives the mode to the
    last one only): snapshots may hold a sandbox's private files."""
    missing: list[Path] = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # a concurrent writer made it
            os.mkdir(directory, 0o700)


class FolderStore(ObjectStore):
    """Objects are files under ``root``; the key is the path below it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _failure(self, action: str, key: str, e: OSError) -> SandboxError:
        return SandboxError(
            f"cannot {action} {key} in {self.url}: {e.strerror} ({e.filename}); "
            "check free space and permissions there",
            key=key,
        )

    def put_file(self, key: str, path: Path, *, move: bool = False) -> None:
        target = self._path(key)
        try:
            _make_dirs(target.parent)
            if move and path.stat().st_dev == target.parent.stat().st_dev:
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(path, target)  # atomic; then the directory entry made durable
                fsync_dir(target.parent)
                return
            with open(path, "rb") as src, atomic_file(target, suffix=_TEMP_SUFFIX) as out:
                _copy(src, out)
        except OSError as e:
            raise self._failure("store", key, e) from e

    def _open(self, key: str) -> IO[bytes]:
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise SnapshotNotFound(f"no object {key} in {self.url}", key=key) from None
        except OSError as e:
            raise self._failure("read", key, e) from e

    def get_file(self, key: str, dest: Path) -> None:
        src = self._open(key)
        try:
            with src, atomic_file(Path(dest), suffix=_TEMP_SUFFIX) as out:
                shutil.copyfileobj(src, out, _CHUNK)
        except OSError as e:
            raise self._failure("read", key, e) from e

    @contextlib.contextmanager
    def reading(self, key: str, scratch: Path) -> Iterator[IO[bytes]]:
        """The object's own file: no copy (a concurrent delete unlinks, the read goes on)."""
        with self._open(key) as src:
            yield src

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        _check_prefix(prefix)
        start = prefix.rpartition("/")[0]  # the deepest directory every match is under
        found: builtins.list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(self.root.joinpath(*start.split("/"))):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            base = "" if rel == "." else rel + "/"
            dirnames[:] = [
                d
                for d in dirnames
                if (base + d + "/").startswith(prefix) or prefix.startswith(base + d + "/")
            ]
            for name in filenames:
                key = base + name
                if not key.startswith(prefix) or not _is_key(key):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name), follow_symlinks=False)
                except FileNotFoundError:  # deleted while we looked
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append(ObjectInfo(key, st.st_size, st.st_mtime))
        return sorted(found, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        # A directory at the key's place is not an object: there is nothing to delete.
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self._path(key).unlink()


def _s3_endpoint() -> str | None:
    for name in ("AGENTBOX_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return os.environ[name]
    return None


def _s3_client(endpoint: str | None) -> Any:
    # Imported here: boto3 takes a quarter of a second to import, and the default store
    # is a folder.
    import boto3.session
    from botocore.config import Config

    options: dict[str, Any] = {
        "connect_timeout": 10,
        "read_timeout": 60,
        "retries": {"mode": "standard", "max_attempts": 3},
    }
    if endpoint:
        options["s3"] = {"addressing_style": "path"}
    # An own session: boto3's default one is module-global and not thread-safe.
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=Config(**options))


class S3Store(ObjectStore):
    """Objects are S3 objects named ``prefix/key`` in ``bucket``."""

    def __init__(self, bucket: str, prefix: str = "") -> None:
        prefix = prefix.strip("/")
        if not _BUCKET.fullmatch(bucket):
            raise InvalidConfig(
                f"invalid S3 bucket name {bucket!r}: use letters, digits, '.', '_' and '-'"
            )
        if prefix and not _is_key(prefix):
            raise InvalidConfig(f"invalid prefix {prefix!r} in the S3 store url: {_KEY_RULES}")
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.endpoint = _s3_endpoint()
        self._client = _s3_client(self.endpoint)

    def _name(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_file(self, key: str, path: Path, *, move: bool = False) -> None:
        name = self._name(key)
        with self._translated(key):
            self._client.upload_file(str(path), self.bucket, name)

    def get_file(self, key: str, dest: Path) -> None:
        name = self._name(key)
        with self._translated(key), atomic_file(Path(dest), suffix=_TEMP_SUFFIX) as out:
            self._client.download_fileobj(self.bucket, name, out)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        name = self._name(key)
        with self._translated(key):
            try:
                self._client.head_object(Bucket=self.bucket, Key=name)
            except ClientError as e:
                if _error_code(e) in _MISSING and self._bucket_exists():
                    return False
                raise
        return True

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        _check_prefix(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        found: builtins.list[ObjectInfo] = []
        with self._translated(None):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._name_prefix(prefix)
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    key = str(item["Key"])[strip:]
                    if _is_key(key):  # skip what others put beside our objects
                        found.append(
                            ObjectInfo(key, int(item["Size"]), item["LastModified"].timestamp())
                        )
        return sorted(found, key=lambda o: o.key)

    def _name_prefix(self, prefix: str) -> str:
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def delete(self, key: str) -> None:
        name = self._name(key)
        with self._translated(key):
            self._client.delete_object(Bucket=self.bucket, Key=name)  # S3 deletes idempotently

    def _bucket_exists(self) -> bool:
        """Tell a missing bucket from a missing key: a HEAD answers a bare 404 for both."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except Exception as e:  # anything else (denied, unreachable): assume it is there
            return _error_code(e) not in _MISSING | {"NoSuchBucket"}
        return True

    @contextlib.contextmanager
    def _translated(self, key: str | None) -> Iterator[None]:
        """Turn boto's errors into agentbox errors that say what the operator should check."""
        try:
            yield
        except Exception as e:
            mapped = self._translate(e, key)
            if mapped is None:
                raise
            raise mapped from e

    def _translate(self, e: BaseException, key: str | None) -> AgentboxError | None:
        from boto3.exceptions import S3UploadFailedError
        from botocore import exceptions as bx

        if isinstance(e, S3UploadFailedError) and isinstance(e.__context__, bx.ClientError):
            e = e.__context__  # upload_file re-raises the ClientError as a bare message
        where = f"snapshot store {self.url} (endpoint {self.endpoint or 'AWS default'})"
        details: dict[str, Any] = {"store": self.url} | ({"key": key} if key else {})
        if isinstance(e, bx.ClientError):
            code = _error_code(e)
            if code == "NoSuchBucket" or (code in _MISSING and not self._bucket_exists()):
                return SandboxError(
                    f"{where}: bucket {self.bucket!r} does not exist; create it (agentbox "
                    "never creates buckets) or fix the bucket name in the store url",
                    **details,
                )
            if code in _MISSING:
                return SnapshotNotFound(f"no object {key} in {self.url}", **details)
            if code in _DENIED or _http_status(e) == 403:
                return SandboxError(
                    f"{where}: access denied ({code}); check AWS_ACCESS_KEY_ID, "
                    "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) and that they may use "
                    f"bucket {self.bucket!r}",
                    **details,
                )
            if code in _WRONG_REGION:
                return SandboxError(
                    f"{where}: bucket {self.bucket!r} is in another region ({code}); "
                    "set AWS_DEFAULT_REGION to the bucket's region",
                    **details,
                )
            return SandboxError(f"{where}: S3 answered {code}: {_error_message(e)}", **details)
        if isinstance(e, bx.NoCredentialsError | bx.PartialCredentialsError):
            return SandboxError(
                f"{where}: no S3 credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                **details,
            )
        if isinstance(e, bx.ConnectionError | bx.HTTPClientError):
            return SandboxError(
                f"{where}: cannot reach the S3 endpoint ({e}); check AGENTBOX_S3_ENDPOINT "
                "(or AWS_ENDPOINT_URL) and the network",
                **details,
            )
        if isinstance(e, bx.ParamValidationError):
            return InvalidConfig(f"{where}: {e}", **details)
        if isinstance(e, bx.BotoCoreError):
            return SandboxError(f"{where}: {e}", **details)
        if isinstance(e, OSError):
            return SandboxError(
                f"{where}: local file error: {e.strerror} ({e.filename})", **details
            )
        return None


def _error_code(e: BaseException) -> str:
    response = getattr(e, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _error_message(e: BaseException) -> str:
    response = getattr(e, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "")) or str(e)


def _http_status(e: BaseException) -> int:
    response = getattr(e, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def open_store(url: str | None, home: Path) -> ObjectStore:
    """The store named by ``url``: unset means ``home/snapshots``, else ``file:///abs/path``
    or ``s3://bucket/optional/prefix``."""
    if not url:
        return FolderStore(home / "snapshots")
    parts = urlsplit(url)
    if "@" in parts.netloc:
        # Not echoed: the part before @ would be a credential.
        raise InvalidConfig(
            "the snapshot store url must not contain credentials; for S3 set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead"
        )
    if parts.query or parts.fragment:
        raise InvalidConfig(f"the snapshot store url {url!r} must have no ?query or #fragment")
    if parts.scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise InvalidConfig(f"invalid file store url {url!r}: use file:///absolute/path")
        return FolderStore(Path(path))
    if parts.scheme == "s3":
        return S3Store(parts.netloc, unquote(parts.path))
    raise InvalidConfig(
        f"unsupported snapshot store url scheme {parts.scheme!r}: use file:///absolute/path "
        f"or s3://bucket/prefix, or leave it unset for {home / 'snapshots'}"
    )
