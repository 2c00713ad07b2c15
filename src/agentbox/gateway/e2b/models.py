"""The E2B wire shapes agentbox answers: control-plane bodies and envd messages.

The names are the interface (E2B's OpenAPI ``sandboxID``, ``envdVersion``, ...; envd's
protobuf JSON ``exitCode``, ``FILE_TYPE_DIRECTORY``, ...); the values come from agentbox.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import posixpath
import re
import shlex
import stat as stat_module
import time
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from agentbox.errors import AgentboxError, InvalidRequest
from agentbox.runtime.files import SandboxFiles

# The envd release whose features the SDKs enable for what agentbox implements: stdin
# choice (0.3.0), the default user (0.4.0), CloseStdin (0.5.2), octet-stream uploads
# (0.5.7), file metadata (0.6.2: user.e2b.* xattrs), entry info in watch events (0.6.3),
# watches allowed on network mounts (0.6.4: a sandbox has none, so the flag changes
# nothing); PTY and StreamInput are not gated by version.
ENVD_VERSION = "0.6.4"
METADATA_HEADER = "x-metadata-"  # an upload's file metadata, one header per key
METADATA_XATTR = "user.e2b."  # where envd keeps it: the file's extended attributes
_METADATA_KEY = re.compile(r"\A[A-Za-z0-9!#$%&'*+\-.^_`|~]+\Z")  # an HTTP token
_METADATA_VALUE = re.compile(r"\A[\x20-\x7e]*\Z")  # printable US-ASCII
MAX_METADATA_KEYS = 64
ENVD_PORT = 49983
CLIENT_ID = "agentbox"
HOME = "/home/user"  # the E2B user's home: where relative paths and commands start
MAX_FORKS = 16  # forks of one request
BASE_TEMPLATE = "base"  # E2B's default template: agentbox's configured default


class Loose(BaseModel):
    # Newer SDKs add fields (auto-pause, volume mounts, ...): ignored, never refused.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AutoResume(Loose):
    enabled: bool = False


class NewSandbox(Loose):
    template_id: str = Field(default=BASE_TEMPLATE, alias="templateID")
    timeout: int = Field(default=300, ge=1, le=30 * 86400)
    metadata: dict[str, str] = Field(default_factory=dict)
    env_vars: dict[str, str] = Field(default_factory=dict, alias="envVars")
    allow_internet_access: bool | None = Field(default=None, alias="allow_internet_access")
    network: dict[str, Any] | None = None  # E2B's egress options (e2b/network.py)
    # lifecycle: on_timeout "pause" (with memory unless autoPauseMemory is false), and
    # whether a call wakes the paused sandbox (autoResume.enabled)
    auto_pause: bool = Field(default=False, alias="autoPause")
    auto_pause_memory: bool = Field(default=True, alias="autoPauseMemory")
    auto_resume: AutoResume | None = Field(default=None, alias="autoResume")


class Timeout(Loose):
    timeout: int = Field(ge=0, le=30 * 86400)


class ForkSandbox(Loose):
    timeout: int = Field(default=300, ge=1, le=30 * 86400)
    count: int = Field(default=1, ge=1, le=MAX_FORKS)


class PauseSandbox(Loose):
    memory: bool = True  # False: the filesystem only (agentbox stops the sandbox)


class ConnectSandbox(Loose):
    timeout: int | None = Field(default=None, ge=1, le=30 * 86400)


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")


def ended(expires_at: float | None) -> bool:
    """Past its E2B timeout: gone for the E2B API before the lifecycle sweep destroys it."""
    return expires_at is not None and expires_at <= time.time()


def e2b_error(status: int, message: str) -> dict[str, Any]:
    """E2B's error body: the SDK raises ``message`` (and branches on the status)."""
    return {"code": status, "message": message}


def e2b_error_response(e: AgentboxError) -> JSONResponse:
    """The E2B front end's one mapping of an agentbox error: its status, E2B's body."""
    return JSONResponse(e2b_error(e.http_status, e.message), status_code=e.http_status)


# envd: process.Process / filesystem.Filesystem ----------------------------------------------
PROCESS_SERVICE = "process.Process"
FILESYSTEM_SERVICE = "filesystem.Filesystem"
FILE_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_FILE"}
_MODE_TYPES = {
    "file": stat_module.S_IFREG,
    "dir": stat_module.S_IFDIR,
    "symlink": stat_module.S_IFLNK,
}
SIGNALS = {"SIGNAL_SIGKILL": "SIGKILL", "SIGNAL_SIGTERM": "SIGTERM"}


def sandbox_path(path: str) -> str:
    """An envd path: relative ones are under the user's home, as E2B resolves them."""
    return posixpath.normpath(posixpath.join(HOME, path or "."))


def entry_info(info: dict[str, Any]) -> dict[str, Any]:
    """EntryInfo from an agentbox file entry (fs_stat / fs_list / fs_mkdir / fs_move)."""
    kind = str(info["type"])
    mode = stat_module.S_IMODE(int(info.get("mode", 0))) | _MODE_TYPES.get(kind, 0)
    entry: dict[str, Any] = {
        "name": info["name"],
        "type": FILE_TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
        "path": info["path"],
        "size": str(int(info.get("size", 0))),  # int64: a JSON string in protobuf JSON
        "mode": stat_module.S_IMODE(mode),
        "permissions": stat_module.filemode(mode),
        "owner": "user",
        "group": "user",
        "modifiedTime": iso(float(info.get("mtime", 0))),
    }
    if info.get("symlink_target"):  # envd reports the target as an absolute path
        where = posixpath.dirname(str(info["path"]))
        entry["symlinkTarget"] = posixpath.normpath(
            posixpath.join(where, str(info["symlink_target"]))
        )
    return entry


def file_signature(path: str, operation: str, user: str, token: str, expiration: str | None) -> str:
    """The v1 signature of a download_url/upload_url, as the SDKs compute it."""
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration else "")
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode()


def pid_of(process_id: str) -> int:
    """A stable uint32 pid for an agentbox process handle (``p-`` + 12 hex digits)."""
    return int(process_id[2:], 16) & 0x7FFFFFFF


def pty_size(pty: dict[str, Any]) -> dict[str, int]:
    """``{cols, rows}`` of a PTY message (``{"size": {"cols": 80, "rows": 24}}``)."""
    size = pty.get("size") or {}
    return {"cols": int(size.get("cols", 0)), "rows": int(size.get("rows", 0))}


def command_of(process: dict[str, Any]) -> str:
    """The shell command line of a ProcessConfig: the SDKs send ``/bin/bash -l -c CMD``;
    the command is what agentbox's policy judges."""
    cmd, args = str(process.get("cmd", "")), [str(a) for a in process.get("args", [])]
    if posixpath.basename(cmd) in ("bash", "sh") and len(args) >= 2 and args[-2] == "-c":
        return args[-1]
    return shlex.join([cmd, *args])


def metadata_of(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """An upload's metadata from its ``X-Metadata-KEY`` headers (keys lowercased, as
    envd does); a key or value the SDKs would refuse is refused here too."""
    metadata = {}
    for name, value in headers:
        if not name.lower().startswith(METADATA_HEADER):
            continue
        key = name.lower()[len(METADATA_HEADER) :]
        if not _METADATA_KEY.match(key) or not _METADATA_VALUE.match(value):
            raise InvalidRequest(
                f"metadata {key!r}: keys are HTTP tokens, values printable US-ASCII"
            )
        metadata[key] = value
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidRequest(f"at most {MAX_METADATA_KEYS} metadata keys per upload")
    return metadata


def file_metadata(files: SandboxFiles, path: str) -> dict[str, str]:
    found = files.xattrs(path, METADATA_XATTR)
    return {key: value.decode("utf-8", "replace") for key, value in found.items()}


def set_file_metadata(files: SandboxFiles, path: str, metadata: dict[str, str]) -> None:
    files.set_xattrs(path, METADATA_XATTR, {k: v.encode() for k, v in metadata.items()})
