"""Snapshots with memory (``snapshot create --memory``): a sandbox's running processes,
not only its files. Only a tier that owns its guest kernel can save them: gVisor, with
``runsc checkpoint`` / ``runsc restore``; the namespaces tier's processes live in the
host kernel, which has no such operation (CRIU is not used here).

What was measured with the runsc on these hosts (release 2022-12-19, platform ptrace),
by hand on a live gvisor-tier sandbox (docs/design.md, "Isolation tiers"):

* ``runsc checkpoint`` fails, and the failed checkpoint **kills the sandbox**, while the
  exec agent listens on its host socket (``--host-uds=create``): "encoding error at
  object transport.connectionedEndpoint{... path:"/.agentbox/exec/agent.sock" ...}:
  Cannot save endpoint with bound host socket".
* With the listener closed first (``runsc kill ID USR2`` to the agent), ``runsc
  checkpoint --image-path=DIR ID`` succeeds (0.5 s, a 106 KB image for an idle sandbox)
  and ``runsc restore --detach --image-path=DIR --bundle=BUNDLE ID`` brings it back: the
  agent resumes as PID 1 and ``runsc exec`` works. ``checkpoint --leave-running`` hung.

Not built yet (where to pick up): confirm the listener is closed before checkpointing
(the agent unlinks its socket: the host waits for that, never for a fixed time), refuse
while a command or background process holds a host fd (``exec/*.json``), run the
restore inside the sandbox's cgroups (as ``GvisorHost.launch`` does) and record the new
Sentry pid, store the image beside the disk snapshot (its digest in the metadata), and
restore it into a new sandbox's bundle. Until then a memory snapshot is refused with a
typed error on both tiers.
"""

from __future__ import annotations

from agentbox.errors import TierUnsupported

FEATURE = "a snapshot with memory (snapshot create --memory)"


def refuse_memory_snapshot(isolation: str) -> TierUnsupported:
    if isolation != "gvisor":
        return TierUnsupported(
            f"{FEATURE} needs isolation gvisor: this sandbox's processes run in the host "
            "kernel, which cannot save them; snapshot its files without --memory, or "
            "create the sandbox with --isolation gvisor",
            tier=isolation,
            feature=FEATURE,
        )
    return TierUnsupported(
        f"{FEATURE} is not available yet on the gvisor tier (runsc checkpoint works on "
        "this host once the exec agent's socket is closed, but storing and restoring the "
        "image is not built; docs/design.md); snapshot its files without --memory",
        tier=isolation,
        feature=FEATURE,
    )
