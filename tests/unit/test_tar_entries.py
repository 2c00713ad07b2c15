"""The one tar-entry checker (agentbox.runtime.archive.checked) and where its three
policies differ: uploads, snapshot restores, image layers. The filesystem side of each
reader has its own tests (tests/security/test_file_api_escapes.py,
tests/security/test_snapshot_restore.py, tests/unit/test_templates.py)."""

from __future__ import annotations

import tarfile

import pytest

from agentbox.errors import AgentboxError, InvalidRequest, PathEscape
from agentbox.runtime.archive import UPLOAD, EntryPolicy, checked
from agentbox.runtime.snapshots import _ENTRIES as SNAPSHOT
from agentbox.runtime.templates.oci import _LAYER_ENTRIES as LAYER

POLICIES = [pytest.param(UPLOAD, id="upload"), pytest.param(SNAPSHOT, id="snapshot"),
            pytest.param(LAYER, id="layer")]  # fmt: skip


def member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    "entry",
    [member("/etc/passwd"), member("workspace/../../x"), member("workspace/a\0b"),
     member("workspace/h", tarfile.LNKTYPE, linkname="../../host"),
     member("workspace/h", tarfile.LNKTYPE, linkname="/etc/shadow"),
     member("workspace/s", tarfile.SYMTYPE, linkname=""),
     member("workspace/sock", b"V")],
    ids=["absolute", "dotdot", "nul", "hardlink-up", "hardlink-absolute", "empty-link", "volume"],
)  # fmt: skip
def test_every_policy_refuses_what_would_leave(policy: EntryPolicy, entry: tarfile.TarInfo) -> None:
    with pytest.raises(AgentboxError):
        checked(entry, policy)


def test_a_name_that_would_leave_is_a_path_escape_for_uploads_only() -> None:
    with pytest.raises(PathEscape):
        checked(member("a/../../x"), UPLOAD)
    with pytest.raises(InvalidRequest):  # a damaged or forged object in the store
        checked(member("workspace/../../x"), SNAPSHOT)


def test_files_dirs_and_links_pass_everywhere_with_their_parts() -> None:
    for policy in (UPLOAD, SNAPSHOT, LAYER):
        assert checked(member("workspace/a/b"), policy).parts == ("workspace", "a", "b")
        assert checked(member("workspace/d", tarfile.DIRTYPE), policy).link is None
        link = checked(member("workspace/h", tarfile.LNKTYPE, linkname="workspace/a"), policy)
        assert link.link == ("workspace", "a")
        # A symlink's target is resolved later, inside the root it lands in: any target.
        assert checked(member("workspace/s", tarfile.SYMTYPE, linkname="/etc"), policy).link is None


def test_devices_fifos_and_whiteouts_by_policy() -> None:
    device = member("upper/null", tarfile.CHRTYPE, devmajor=1, devminor=3)
    block = member("upper/sda", tarfile.BLKTYPE, devmajor=8)
    fifo = member("upper/fifo", tarfile.FIFOTYPE)
    whiteout = member("upper/gone", tarfile.CHRTYPE)  # 0:0, overlayfs's mark of a deletion
    for entry in (device, block, fifo, whiteout):
        with pytest.raises(InvalidRequest, match="remove it from the archive"):
            checked(entry, UPLOAD)
        checked(entry, LAYER)  # kept (fifo) or counted and dropped by the importer
    for entry in (device, block, fifo):
        with pytest.raises(InvalidRequest, match="overlay whiteouts only"):
            checked(entry, SNAPSHOT)
    assert checked(whiteout, SNAPSHOT).parts == ("upper", "gone")


def test_snapshots_take_exact_names_in_the_kept_parts_only() -> None:
    for name in ("./workspace/x", "workspace//x", "procs/x", "x", "./"):
        with pytest.raises(InvalidRequest):
            checked(member(name), SNAPSHOT)
        if name not in ("./",):
            assert checked(member(name), UPLOAD).parts[-1] == "x"  # uploads normalise
    assert checked(member("./"), UPLOAD).parts == ()  # the destination itself
    assert checked(member("./", tarfile.DIRTYPE), LAYER).parts == ()  # the layer's root
    with pytest.raises(InvalidRequest):  # a hard link into a part that is not kept
        checked(member("workspace/h", tarfile.LNKTYPE, linkname="etc/passwd"), SNAPSHOT)
