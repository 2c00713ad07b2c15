"""Snapshots with memory (``snapshot create --memory``): a sandbox's running processes,
not only its files. Only a tier that owns its guest kernel can save them: gVisor, with
``runsc checkpoint`` / ``runsc restore``; the namespaces tier's processes live in the
host kernel, which has no such operation (CRIU is not used here): a typed refusal.

How one is taken, each step for a reason (measured with the runsc on these hosts, release
2022-12-19, platform ptrace; docs/design.md, "Isolation tiers"):

1. Refused while a one-shot command runs (``exec/c*.json``): its output and exit status
   travel over host fds that a checkpoint cuts. Background processes are kept (see 5).
2. The exec agent closes its listener (``runsc kill ID USR2``) and says so by its name
   (``runsc ps``); the host then removes its socket's file. With the listener open,
   ``runsc checkpoint`` fails ("Cannot save endpoint with bound host socket") and the
   failed checkpoint kills the sandbox.
3. ``runsc checkpoint --image-path=DIR ID`` writes ``checkpoint.img`` and stops the
   sandbox (``--leave-running`` hung with this runsc). Its disk is then still, so the
   files part of the snapshot (``runtime.snapshots``, scanned for secrets) and the image
   are one instant. The image is scanned too; a finding refuses (memory cannot be
   redacted) unless allow-listed.
4. The image is stored beside the files (``snapshots/ID.checkpoint.img``, its sha256,
   size and slot in the metadata), and the source sandbox is restored from it in place
   (``runsc restore --detach``, in its cgroups, its new Sentry pid recorded), its agent
   listening again (SIGHUP): it carries on.
5. A background process's handle ends with the checkpoint (its host-side ``runsc exec``
   returns): the process itself runs on, inside, without a handle.

Restoring builds a new sandbox from the same template, fills its disk from the files
part, then ``runsc restore`` of the image in its bundle instead of a boot. The restored
processes keep the uid they had, which on this tier is the host uid of the source's slot
(``runtime.host``): the new sandbox must take that slot, else a typed Conflict.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agentbox.errors import Conflict, TierUnsupported
from agentbox.runtime.gvisor_host import GvisorHost
from agentbox.storage import secretscan

if TYPE_CHECKING:
    from agentbox.runtime.snapshots import SnapshotInfo, Snapshots
    from agentbox.runtime.store import SandboxRecord


class Runtime(Protocol):
    """What this module uses of ``runtime.runtime.Runtime`` (which calls it)."""

    home: Path

    def get(self, sandbox_id: str) -> SandboxRecord: ...

    def relaunch(self, record: SandboxRecord, host: GvisorHost) -> None: ...


FEATURE = "a snapshot with memory (snapshot create --memory)"


def refuse_memory_snapshot(isolation: str) -> TierUnsupported:
    """The namespaces tier's answer (its processes live in the host kernel)."""
    return TierUnsupported(
        "a snapshot with memory needs isolation gvisor: this sandbox's processes run in the "
        "host kernel, which cannot save them; snapshot its files only (without --memory, "
        'memory=False, "memory": false), or create the sandbox with isolation gvisor '
        '(--isolation gvisor, isolation="gvisor")',
        tier=isolation,
        feature=FEATURE,
    )


def take(
    runtime: Runtime,
    snapshots: Snapshots,
    sandbox_id: str,
    redact: bool,
    allowlist: secretscan.AllowList | None,
) -> SnapshotInfo:
    record = runtime.get(sandbox_id)
    if record.isolation != "gvisor":
        raise refuse_memory_snapshot(record.isolation)
    if record.state != "running":
        raise Conflict(
            f"sandbox {sandbox_id} is {record.state}: a snapshot with memory needs it "
            "running (resume or start it first)"
        )
    host = GvisorHost(runtime.home, sandbox_id, record.slot)
    if any(host.exec_dir.glob("c*.json")):
        raise Conflict(
            f"a command is running in sandbox {sandbox_id}: a snapshot with memory "
            "cannot keep its output stream; retry when it has ended"
        )
    if any(host.exec_dir.glob("b*.json")):  # browser.launch's runsc exec: its pipe
        raise Conflict(
            f"sandbox {sandbox_id} has a browser open: its DevTools pipe cannot be "
            "saved; close its pages (browser_close) and retry"
        )
    snapshots.scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    image_dir = snapshots.scratch / f"checkpoint-{secrets.token_hex(8)}"
    image_dir.mkdir(mode=0o700)
    try:
        host.quiesce()
        image = host.checkpoint(image_dir)  # the sandbox has stopped from here on
        try:
            return snapshots.create_from(
                record, redact=redact, allowlist=allowlist, memory_image=image
            )
        finally:
            host.memory_image = image_dir
            runtime.relaunch(record, host)  # it carries on from the image
    finally:
        shutil.rmtree(image_dir, ignore_errors=True)
