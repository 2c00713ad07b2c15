"""Per-phase timing of agentbox internals, by wrapping functions for one measured pass.

Used only in the diagnostic passes (never in the headline rows): each wrapper adds about a
microsecond, and the breakdown says where the milliseconds of a create/exec/destroy go.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from agentbox.isolation import cgroups, disk
from agentbox.network import egress_start, plane, ports, rtnetlink
from agentbox.runtime import commands, host, runtime, store, templates
from common import Stats, md_table, now_ns

# (label, owner, attribute). Labels starting with spaces are nested in the one above.
SETUP_PHASES: list[tuple[str, Any, str]] = [
    ("Runtime.create (total)", runtime.Runtime, "create"),
    ("  sweep_expired (reads every record)", runtime.Runtime, "sweep_expired"),
    ("  TemplateStore.get", templates.TemplateStore, "get"),
    ("  Store.reserve (sqlite tx)", store.Store, "reserve"),
    ("  cgroups create", cgroups.SandboxCgroup, "create"),
    ("  launch (nsexec spawn; disk mounted meanwhile; bwrap + ready)", host.SandboxHost, "launch"),
    (
        "    prepare_filesystem (while the launcher starts)",
        host.SandboxHost,
        "prepare_filesystem",
    ),
    ("      make_filesystem (cached image copy)", disk, "make_filesystem"),
    ("      loop attach + mount ext4", disk, "mount_disk"),
    ("    then until bwrap reports the first pid", host.SandboxHost, "_read_info"),
    ("    then until init says ready", host.SandboxHost, "_wait_ready"),
    ("  Store.mark_running (sqlite tx)", store.Store, "mark_running"),
]

CREATE_PHASES: list[tuple[str, Any, str]] = [
    *SETUP_PHASES,
    ("first command: CommandRunner.run", commands.CommandRunner, "run"),
    ("Runtime.destroy (total)", runtime.Runtime, "destroy"),
    ("  cgroup kill + wait + rmdir", cgroups.SandboxCgroup, "remove"),
    ("  teardown (umount x2 + rm -r dir)", host.SandboxHost, "teardown"),
    ("    umount (MNT_DETACH)", disk, "unmount"),
    ("  Store.delete (sqlite tx)", store.Store, "delete"),
]

# A create with the default network: what it adds to a network-none create, and where.
NETWORK_PHASES: list[tuple[str, Any, str]] = [
    ("Runtime.create (total)", runtime.Runtime, "create"),
    (
        "  egress_start.ensure_running (daemon check, nft table check)",
        egress_start,
        "ensure_running",
    ),
    ("    plane.ensure_host_setup (cached per process)", plane, "ensure_host_setup"),
    ("  cgroups create", cgroups.SandboxCgroup, "create"),
    ("  launch (nsexec spawn; disk mounted meanwhile; bwrap + ready)", host.SandboxHost, "launch"),
    (
        "    prepare_filesystem (while the launcher starts)",
        host.SandboxHost,
        "prepare_filesystem",
    ),
    ("    plane.attach (veth, addresses, route; while bwrap sets up)", plane, "attach"),
    ("      rtnetlink add_veth (host end + peer into the netns)", rtnetlink.Route, "add_veth"),
    ("      rtnetlink add_address (x2)", rtnetlink.Route, "add_address"),
    ("      rtnetlink set_up (x2)", rtnetlink.Route, "set_up"),
    ("      rtnetlink add_default_route (inside)", rtnetlink.Route, "add_default_route"),
    ("      netlink socket in the sandbox netns (setns x2)", ports, "socket_in_netns"),
    ("first command: CommandRunner.run", commands.CommandRunner, "run"),
    ("Runtime.destroy (total)", runtime.Runtime, "destroy"),
    ("  cgroup kill + wait + rmdir", cgroups.SandboxCgroup, "remove"),
    ("  teardown (umount x2 + rm -r dir)", host.SandboxHost, "teardown"),
    ("  plane.detaching (link watch, set up before the kill)", plane, "detaching"),
    ("  plane._delete_in_background (a link left after 0.2 s)", plane, "_delete_in_background"),
]

EXEC_PHASES: list[tuple[str, Any, str]] = [
    ("Runtime.commands (record lookup)", runtime.Runtime, "commands"),
    ("CommandRunner.run (total)", commands.CommandRunner, "run"),
    ("  new_leaf (mkdir cgroup)", commands.CommandRunner, "new_leaf"),
    ("  _run_pipes (Popen + pump + wait)", commands.CommandRunner, "_run_pipes"),
    ("    _pump (select loop)", commands.CommandRunner, "_pump"),
    ("  _finish_leaf (rmdir cgroup)", commands.CommandRunner, "_finish_leaf"),
]


class PhaseTimer:
    def __init__(self, phases: list[tuple[str, Any, str]]) -> None:
        self.phases = phases
        self.samples: dict[str, list[int]] = defaultdict(list)
        self.calls: dict[str, int] = defaultdict(int)

    def _wrap(self, label: str, func: Callable[..., Any]) -> Callable[..., Any]:
        samples = self.samples[label]
        calls = self.calls

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = now_ns()
            try:
                return func(*args, **kwargs)
            finally:
                samples.append(now_ns() - t0)
                calls[label] += 1

        return timed

    @contextlib.contextmanager
    def active(self) -> Iterator[PhaseTimer]:
        saved: list[tuple[Any, str, Any]] = []
        try:
            for label, owner, attr in self.phases:
                original = owner.__dict__[attr]
                saved.append((owner, attr, original))
                setattr(owner, attr, self._wrap(label, original))
            yield self
        finally:
            for owner, attr, original in reversed(saved):
                setattr(owner, attr, original)

    def table(self, per: int) -> list[str]:
        """Markdown table; ``per`` = number of measured operations (calls per op shown)."""
        rows = []
        for label, _, _ in self.phases:
            samples = self.samples.get(label, [])
            if not samples:
                continue
            st = Stats.of_ns(samples)
            name = label.lstrip()
            indent = (len(label) - len(name)) // 2
            rows.append(
                [
                    "&nbsp;&nbsp;" * indent * 2 + name,
                    f"{len(samples) / per:.2g}",
                    f"{st.p50:.2f}",
                    f"{st.p95:.2f}",
                    f"{st.p99:.2f}",
                    f"{st.mean:.2f}",
                ]
            )
        return md_table(
            ["phase", "calls/op", "p50 ms", "p95 ms", "p99 ms", "mean ms"],
            rows,
        )

    def reset(self) -> None:
        for samples in self.samples.values():
            samples.clear()
        self.calls.clear()
