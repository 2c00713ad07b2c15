# Whole on purpose: each lifecycle step beside the one store, lock and live table it must share
"""The sandbox lifecycle on one host: create, get, list, exec, destroy.

State lives in SQLite (``runtime.store``); a sandbox is a set of host resources
(``runtime.host``) plus a record. Any process may operate on any sandbox: the CLI, the
daemon and in-process SDK users share ``$AGENTBOX_HOME``. Expired sandboxes are swept on
every create and list (and their init ends itself at its lifetime even if nothing runs).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from agentbox import digest
from agentbox.config.host import Admission, agentbox_home
from agentbox.errors import (
    AgentboxError,
    HostUnsupported,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
)
from agentbox.hints import Hint
from agentbox.isolation import cgroupwarm, diskpool, seccomp
from agentbox.isolation.cgroups import CgroupLayout, Limits, SandboxCgroup
from agentbox.isolation.launcher import nsexec_path
from agentbox.network import plane
from agentbox.runtime import pool_wake, template_tiers
from agentbox.runtime.commands import CommandRunner
from agentbox.runtime.host import (
    Launch,
    LaunchPaths,
    SandboxHost,
    process_start_time,
    wait_exited,
)
from agentbox.runtime.live import LiveSandboxes, Running
from agentbox.runtime.requests import SnapshotOptions
from agentbox.runtime.spec_input import spec_from
from agentbox.runtime.store import SandboxRecord, SandboxState, Store
from agentbox.runtime.tiers import GVISOR, host_for, host_limits

# Imported where used: a command on an existing sandbox (``agentbox sandbox exec``) needs
# none of these (tests/unit/test_import_weight.py).
if TYPE_CHECKING:
    from agentbox.config.specs import SandboxSpec
    from agentbox.runtime.files import SandboxFiles
    from agentbox.runtime.processes import ProcessTable
    from agentbox.runtime.sessions import ShellSessions
    from agentbox.runtime.snapshots import Fill, SnapshotInfo, Snapshots
    from agentbox.runtime.spec_cache import StoredSpec
    from agentbox.runtime.teardown import Teardowns
    from agentbox.runtime.templates import Template, TemplateStore
    from agentbox.volumes.service import Volumes
    from agentbox.volumes.spec import VolumeMount

MAX_SANDBOXES = 4096
POOL_MAX_AGE = 3600.0  # a warm sandbox older than this is replaced by a fresh one
POOL_LIFETIME = 7 * 24 * 3600.0  # its init's own end: the longest a claimed one can live
POOL_PROJECT = "(warm pool)"  # pooled sandboxes count against no user project's quota


def _warn(message: str, *args: object) -> None:
    # logging is imported here: it brings traceback and linecache, a few ms of start-up
    # that a command on an existing sandbox never needs.
    import logging

    logging.getLogger(__name__).warning(message, *args)


def _check_traversable(home: Path) -> None:
    """Every directory above the home must let other uids through (bubblewrap runs as one)."""
    for parent in home.resolve().parents:
        if not parent.stat().st_mode & 0o001:
            raise HostUnsupported(
                f"AGENTBOX_HOME {home} is under {parent}, which other users cannot traverse "
                f"(mode {parent.stat().st_mode & 0o777:o}); sandboxes run as their own uids and "
                f"need to reach it: `chmod o+x {parent}` or choose another AGENTBOX_HOME"
            )


def pool_key(spec: SandboxSpec | StoredSpec) -> str:
    """What a warm sandbox shares with the requests it can serve: everything fixed when a
    sandbox is made (template, limits, disk, network). Environment, lifetime, idle
    settings and project are set when it is claimed."""
    fixed = spec.model_dump(
        include={"template", "isolation", "memory", "pids", "cpus", "disk", "network"}
    )
    return digest.sha256_hex(json.dumps(fixed, sort_keys=True).encode())[:24]


class Runtime:
    """Entry point of the runtime plane. Cheap to construct; host facts load lazily."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or agentbox_home()
        (self.home / "sandboxes").mkdir(parents=True, exist_ok=True)
        # Sandbox uids (bubblewrap runs as them) must traverse to their own root: x, not r.
        for path in (self.home, self.home / "sandboxes"):
            path.chmod(0o711)
        _check_traversable(self.home)
        self.store = Store(self.home / "state.db")
        self._layout: CgroupLayout | None = None
        self._paths: LaunchPaths | None = None
        self._lock = threading.Lock()
        self._live = LiveSandboxes()
        self._net: plane.HomeNet | None = None
        self._touched: dict[str, float] = {}
        self.admission = Admission()  # the gateway sets its sandbox.admission here
        self.teardowns: Teardowns | None = None  # set by defer_teardowns()

    @functools.cached_property
    def volumes(self) -> Volumes:
        """Named volumes (agentbox.volumes); the gateway sets their dir and capacity."""
        from agentbox.volumes.service import Volumes

        self.store  # noqa: B018 - the sandboxes table first: volume checks join on it
        return Volumes(self.home)

    @functools.cached_property
    def templates(self) -> TemplateStore:
        from agentbox.runtime.templates import TemplateStore

        return TemplateStore(self.home, self.store)

    # host facts -----------------------------------------------------------------------
    @property
    def net(self) -> plane.HomeNet:
        """This home's network numbers on this host (allocated on first use)."""
        if self._net is None:  # resolving the home's path costs syscalls on every command
            self._net = plane.home_net(self.home)
        return self._net

    @property
    def layout(self) -> CgroupLayout:
        if self._layout is None:
            self._layout = CgroupLayout.detect()
        return self._layout

    @property
    def paths(self) -> LaunchPaths:
        with self._lock:
            if self._paths is None:
                lib = self.home / "lib"
                self._paths = LaunchPaths(nsexec_path(lib), seccomp.compiled_filter_path(lib))
            return self._paths

    # lifecycle ------------------------------------------------------------------------
    def create(
        self, spec: Mapping[str, object] | SandboxSpec | None = None, *, actor: str = "local"
    ) -> SandboxRecord:
        resolved: SandboxSpec | StoredSpec
        if spec is None or isinstance(spec, Mapping):
            # Settings seen before need no pydantic (runtime/spec_cache.py).
            from agentbox.runtime.spec_cache import validated

            resolved = validated(self.home, spec)
            if spec is None or "isolation" not in spec:  # the template's tier, if it names one
                tier = template_tiers.default_tier(self.home, resolved.template)
                if tier is not None and tier != resolved.isolation:
                    resolved = validated(self.home, {**(spec or {}), "isolation": tier})
        else:
            resolved = self.with_template_tier(spec_from(spec))
        if resolved.isolation == GVISOR and resolved.on_idle == "stop":
            from agentbox.runtime.gvisor_commands import unsupported

            raise unsupported("on_idle stop")
        self.sweep_expired()
        template = self.templates.get(resolved.template)
        # A warm sandbox has no volumes: they are bound when its launcher starts.
        claimed = None if resolved.volumes else self.store.claim(
            pool_key(resolved), template.digest, resolved, resolved.lifetime, POOL_LIFETIME,
            self.admission,
        )  # fmt: skip
        if claimed is not None:  # a warm one: ready in a transaction's time
            pool_wake.notify(self.home)  # its keeper may be another process's
            self.touch(claimed.id, force=True)
            self.event(claimed.id, "created", "operator", actor, template=claimed.template,
                       from_pool=True)  # fmt: skip
            return self._admitted(claimed)
        record = self._build(resolved, template, None)
        self.event(record.id, "created", "operator", actor, template=record.template)
        return self._admitted(record)

    def with_template_tier(self, spec: SandboxSpec) -> SandboxSpec:
        """``spec`` on its template's tier (``agentbox template tier``) when it names no
        isolation of its own: creates and the warm pools that serve them agree."""
        if "isolation" in spec.model_fields_set:
            return spec
        tier = template_tiers.default_tier(self.home, spec.template)
        return spec if tier is None else spec.model_copy(update={"isolation": tier})

    def recycle(self, sandbox_id: str) -> bool:
        """Destroy a pooled sandbox unless a create claimed it first (then False)."""
        record = self.store.get(sandbox_id)
        if record is None or not self.store.take_pooled(sandbox_id):
            return False
        self._release_record(record)
        self.event(sandbox_id, "destroyed", "pool", "agentbox")
        return True

    def fill_pool(self, spec: SandboxSpec) -> SandboxRecord:
        """One more warm sandbox for requests like ``spec`` (state ``pooled``: counted by
        admission, invisible to calls until ``create`` claims it). Replaced after
        POOL_MAX_AGE; its init lives POOL_LIFETIME, the most a claimed one can have."""
        # No volumes: a warm sandbox would hold them; a create with volumes never claims one.
        spec = self.with_template_tier(spec)
        pooled = spec.model_copy(
            update={"lifetime": POOL_LIFETIME, "project": POOL_PROJECT, "volumes": ()}
        )
        template = self.templates.get(spec.template)
        record = self._build(pooled, template, None, pool=pool_key(spec))
        self.event(record.id, "pooled", "pool", "agentbox", template=record.template)
        return record

    def fork(self, source_id: str, *, actor: str = "local") -> SandboxRecord:
        """A new sandbox whose disk (writable layer, /workspace, /tmp) is a copy of the
        source's at one instant: the source's filesystem is frozen (flushed, writers
        blocked) for the moment a copy-on-write clone of its image takes, so the cost
        does not grow with the data. New id, slot, uid, network identity and tokens; the
        processes are not copied. Changes on either side stay on that side."""
        source = self.get(source_id)
        if source.state not in ("running", "paused", "stopped"):
            raise SandboxNotRunning(f"sandbox {source_id} is {source.state}; cannot fork it")
        spec = source.spec
        # A volume is not copied: read-only ones are shared, a read-write one stays with
        # the source (it has one writer).
        shared = tuple(v for v in spec.volumes if v.mode == "ro")
        spec = spec.model_copy(update={"volumes": shared})
        template = self.templates.exact(source.template, source.template_digest)
        origin = self.host(source)
        record = self._build(spec, template, origin)
        self.event(record.id, "created", "operator", actor, template=record.template,
                   forked_from=source_id)  # fmt: skip
        return self._admitted(record)

    def create_filled(self, fill: Fill, *, actor: str = "local") -> SandboxRecord:
        """Create a sandbox whose fresh disk ``fill.populate(host, disk)`` fills before
        anything runs on it (a restore); ``fill.slot``: that one (its uid) or a Conflict."""
        if fill.slot is not None:  # a sandbox this gateway is still removing may hold it
            self.finish_teardowns()
        record = self._build(fill.spec, fill.template, None, fill.populate, slot=fill.slot)
        self.event(record.id, "created", "operator", actor, template=record.template,
                   **fill.details)  # fmt: skip
        return self._admitted(record)

    def _admitted(self, record: SandboxRecord) -> SandboxRecord:
        """A new sandbox (created, forked or restored) about to be answered: what a role
        adds before the caller hears of it (a cluster node registers it)."""
        return record

    def _build(
        self,
        spec: SandboxSpec | StoredSpec,
        template: Template,
        clone_of: SandboxHost | None,
        populate: Callable[[SandboxHost, Path], None] | None = None,
        pool: str | None = None,
        slot: int | None = None,
    ) -> SandboxRecord:
        paths = self.paths
        if spec.network.mode != "none":
            self.net  # noqa: B018 - allocate the network number first: a refusal leaves nothing
        disks = diskpool.ensure(self.home)
        sandbox_id = "sb-" + digest.token_hex(6)
        from agentbox.runtime.create_lock import creating

        with creating(self.home, sandbox_id):  # recovery leaves a live creator alone
            return self._build_locked(
                sandbox_id, spec, template, clone_of, populate, pool, disks, paths, slot
            )

    def _build_locked(
        self,
        sandbox_id: str,
        spec: SandboxSpec | StoredSpec,
        template: Template,
        clone_of: SandboxHost | None,
        populate: Callable[[SandboxHost, Path], None] | None,
        pool: str | None,
        disks: Path,
        paths: LaunchPaths,
        slot: int | None = None,
    ) -> SandboxRecord:
        gvisor = spec.isolation == GVISOR
        # The cgroups first, then a no-op migration that starts the RCU grace period the
        # launcher's cgroup joins wait for (isolation/cgroupwarm.py): it holds the kernel's
        # cgroup mutex meanwhile, which a mkdir of a cgroup would wait for.
        limits = host_limits(spec.isolation, Limits(spec.memory, spec.pids, spec.cpus))
        cgroup = self.layout.sandbox(sandbox_id)
        cgroup.create(limits)
        cgroupwarm.start()
        # The namespaces tier mounts the disk while its launcher starts (it joins the
        # cgroups after: SandboxHost.launch); volumes need the root first (their mount
        # points), the gvisor tier its directory (the netns pin).
        overlap = not gvisor and not spec.volumes
        expires_at = time.time() + spec.lifetime
        if pool is not None:
            expires_at = time.time() + POOL_MAX_AGE  # then replaced by a fresh one
        try:
            with self.templates.reserving(template):  # from here on the record keeps the tree
                record = self.store.reserve(
                    sandbox_id,
                    template.name,
                    template.digest,
                    spec,
                    expires_at,
                    MAX_SANDBOXES,
                    self.admission,
                    pool,
                    slot,
                )
        except BaseException:
            with contextlib.suppress(AgentboxError, OSError):
                cgroup.remove()
            raise
        host = host_for(self.home, sandbox_id, record.slot, spec.isolation)
        networked = spec.network.mode != "none"
        try:
            trust = None
            if networked:
                from agentbox.network import egress_start

                egress_start.ensure_running(self.home)  # also loads the nft rules: before any link
                if spec.network.credentials:
                    trust = self._egress_trust()
            prepare = functools.partial(
                host.prepare_filesystem,
                template.rootfs,
                spec.disk,
                disks / "formatted",
                trust=trust,
                clone_of=clone_of,
                populate=None if populate is None else lambda disk: populate(host, disk),
            )
            if not overlap:
                prepare()
            if spec.volumes:
                host.volume_binds = self._bind_volumes(record, host, spec.volumes)
            if networked and gvisor:  # runsc copies the namespace's setup as it starts
                plane.attach(self.net.link(record.slot), host.make_netns())  # type: ignore[attr-defined]
            launch = Launch(
                paths, cgroup, template.host_usr, spec.memory, spec.lifetime, limits,
                wire_netns=self._wiring(record.slot) if networked and not gvisor else None,
                prepare=prepare if overlap else None,
            )  # fmt: skip
            pid, start = host.launch(launch)
            if not gvisor:
                self._start_resident(host, cgroup, pid)
            host.activity_marker.touch()
            state: SandboxState = "running" if pool is None else "pooled"
            self.store.mark_running(sandbox_id, pid, start, state)
        except BaseException:
            self._release(sandbox_id, host, cgroup, networked, template.digest)
            raise
        return dataclasses.replace(record, state=state, init_pid=pid, init_start_time=start)

    def _start_resident(self, host: SandboxHost, cgroup: SandboxCgroup, init_pid: int) -> None:
        """Start the sandbox's resident launcher (runtime/resident.py) as it starts, not
        at its first command: its cgroup joins then follow the init's within the kernel's
        grace period (cgroupwarm), and the first command is one clone by the launcher
        instead of an ``enter`` whose own cgroup moves waited 5-20 ms for one. Best effort:
        without it, a command takes the old path and starts one."""
        CommandRunner(self.paths, host, cgroup, init_pid, {}).start_resident()

    def _bind_volumes(
        self, record: SandboxRecord, host: SandboxHost, volumes: tuple[VolumeMount, ...]
    ) -> Any:
        """Claim the sandbox's volumes and make their mount points in its root."""
        from agentbox.volumes import image

        binds = self.volumes.attach(record.id, volumes, host.host_uid, host.host_gid)
        for bind in binds:
            image.make_mountpoint(host.root, bind.path, host.host_uid, host.host_gid)
        return binds

    def _wiring(self, slot: int) -> Callable[[int], None]:
        """Gives a sandbox's network namespace (by its first process's pid) its veth; the
        rules hold for every sandbox link before it exists (``egress_start``)."""
        link = self.net.link(slot)
        return lambda pid: plane.attach(link, pid)

    def event(self, sandbox_id: str, type_: str, reason: str, actor: str, **details: Any) -> None:
        """Record a lifecycle event (see ``runtime.lifecycle``); the gateway streams it,
        posts it to webhooks and writes it to the audit trail."""
        try:
            self.store.add_event(sandbox_id, type_, reason, actor, details)
        except sqlite3.Error as e:  # the transition happened; losing its note must not undo it
            _warn("could not record the %s event of %s: %s", type_, sandbox_id, e)

    def _egress_trust(self) -> dict[str, bytes]:
        """The egress CA's certificate (never its key) and a bundle of the host's CAs plus
        it: a sandbox with credentials trusts the proxy for those hosts' HTTPS."""
        from agentbox.network import egressca

        try:
            ca = egressca.EgressCA.load_or_create(egressca.ca_dir(self.home))
        except (OSError, ValueError) as e:
            raise SandboxError(f"cannot load or create the egress CA: {e}") from e
        return {
            Path(plane.SANDBOX_CA).name: ca.cert_pem(),
            Path(plane.SANDBOX_CA_BUNDLE).name: ca.bundle(),
        }

    def get(self, sandbox_id: str) -> SandboxRecord:
        record = self.store.get(sandbox_id)
        if record is None or self._tearing_down(sandbox_id):
            raise SandboxNotFound(
                f"sandbox {sandbox_id} does not exist (destroyed or never created)",
                hint=Hint("sandbox_list", {}, "{call} to list live sandboxes"),
            )
        if record.state in ("running", "paused") and not self._alive(record):
            return dataclasses.replace(record, state="exited")
        return record

    def exists(self, sandbox_id: str) -> bool:
        """Whether the sandbox has a record (running or not); cheap for running ones."""
        if self._tearing_down(sandbox_id):
            return False
        return self._live.get(sandbox_id) is not None or self.store.get(sandbox_id) is not None

    def list(self) -> list[SandboxRecord]:
        self.sweep_expired(check_alive=True)
        gone = self.teardowns.pending_ids() if self.teardowns is not None else frozenset()
        return [
            dataclasses.replace(r, state="exited")
            if r.state == "running" and not self._alive(r)
            else r
            for r in self.store.list()
            if r.id not in gone
        ]

    def destroy(self, sandbox_id: str, *, reason: str = "operator", actor: str = "local") -> None:
        """Kill every process of the sandbox and remove it. With :meth:`defer_teardowns`
        (a gateway) it returns once the processes are dead and the rest finishes on a
        thread of its own (runtime/teardown.py)."""
        record = self.get(sandbox_id)
        self._live.forget(sandbox_id)
        self.store.set_state(sandbox_id, "destroying")
        self._release_record(record, defer=self.teardowns is not None)
        self.event(sandbox_id, "destroyed", reason, actor)

    def defer_teardowns(self) -> None:
        """From now on :meth:`destroy` answers once the sandbox's processes are dead; for a
        long-lived process that calls :meth:`finish_teardowns` before it ends."""
        from agentbox.runtime.teardown import Teardowns

        if self.teardowns is None:  # idempotent: pending ones are never dropped
            self.teardowns = Teardowns()

    def finish_teardowns(self) -> None:
        """Wait until every destroyed sandbox's host side is removed."""
        if self.teardowns is not None:
            self.teardowns.drain()

    def _tearing_down(self, sandbox_id: str) -> bool:
        return self.teardowns is not None and self.teardowns.pending(sandbox_id)

    def sweep_expired(self, check_alive: bool = False) -> builtins.list[str]:
        """Destroy sandboxes past their lifetime (and, with ``check_alive``, those whose
        init has ended: that reads /proc for every record, so create skips it)."""
        swept = []
        now = time.time()
        candidates = self.store.list() if check_alive else self.store.expired(now)
        for record in candidates:
            expired = record.expires_at is not None and record.expires_at <= now
            dead = check_alive and record.state in ("running", "pooled") and not self._alive(record)
            if expired or dead:
                if record.state == "pooled":  # replaced: the warm pool makes a fresh one
                    with contextlib.suppress(AgentboxError, OSError):
                        if self.recycle(record.id):
                            swept.append(record.id)
                    continue
                reason = "lifetime" if expired else self.end_reason(record)
                with contextlib.suppress(AgentboxError):
                    self.destroy(record.id, reason=reason, actor="agentbox")
                    swept.append(record.id)
        return swept

    def end_reason(self, record: SandboxRecord) -> str:
        """Why a sandbox's init ended on its own: its lifetime, the OOM killer, or else
        an error (it crashed or was killed from outside)."""
        if record.expires_at is not None and record.expires_at <= time.time() + 1:
            return "lifetime"  # init ends itself at its lifetime, by its own clock
        if self.layout.sandbox(record.id).oom_kills() > 0:
            return "oom"
        return "error"

    def _release_record(self, record: SandboxRecord, defer: bool = False) -> None:
        sandbox = record.id
        self._release(sandbox, self.host(record), self.layout.sandbox(sandbox),
                      record.network_mode != "none", record.template_digest, defer,
                      (record.init_pid, record.init_start_time))  # fmt: skip

    def _release(
        self,
        sandbox_id: str,
        host: SandboxHost,
        cgroup: SandboxCgroup,
        networked: bool,
        template_digest: str,
        defer: bool = False,
        init: tuple[int | None, int | None] = (None, None),
    ) -> None:
        """Kill every process, then remove mounts, cgroups, links, directories, the record,
        and the template's tree if this sandbox was its last user. ``defer``: everything
        after the kill on the teardown thread, unless volumes are attached (a caller may
        attach them elsewhere next) or the kill failed. ``init``: the init's pid and start
        time, waited for as in :meth:`stop` (another process's cached view of the sandbox
        then says it is gone instead of trying to enter its namespaces)."""
        errors: list[str] = []
        steps: list[Callable[[], None]] = [cgroup.remove, host.teardown]
        stored = self.store.get(sandbox_id)
        has_volumes = stored is not None and stored.has_volumes
        if has_volumes:  # before its record goes
            steps.append(lambda: self.volumes.detach(sandbox_id))
        if networked:
            net = plane.registered_home_net(self.home)  # none: no link was ever made
            if net is not None:
                # Watched from before the kill: the pair goes with the netns as the
                # processes die; gone before the record (and the slot) is (plane.detaching).
                try:
                    steps.append(plane.detaching(net.link(host.slot), netns_ending=True))
                except OSError as e:
                    errors.append(f"network link: {e}")
        try:
            cgroup.end_processes()  # every process is dead when this returns
            wait_exited(*init)  # and the init marked exited, not only out of its cgroup
        except (OSError, AgentboxError) as e:
            errors.append(str(e))

        def finish() -> None:
            for step in steps:
                try:
                    step()
                except (OSError, AgentboxError) as e:
                    errors.append(str(e))
            if errors:
                self.store.set_state(sandbox_id, "error")
                raise SandboxError(
                    f"sandbox {sandbox_id} was only partly removed ({'; '.join(errors)})",
                    hint=Hint("sandbox_destroy", {"sandbox": sandbox_id}, "{call} again"),
                )
            self.store.delete(sandbox_id)
            try:
                self.templates.release(template_digest)
            except (OSError, AgentboxError) as e:  # the sandbox is gone; a later collection retries
                _warn("could not collect template %s: %s", template_digest, e)

        if defer and not errors and not has_volumes and self.teardowns is not None:
            self.teardowns.submit(sandbox_id, finish)
        else:
            finish()

    def host(self, record: SandboxRecord) -> SandboxHost:
        """The host resources of a sandbox, of its isolation tier."""
        return host_for(self.home, record.id, record.slot, record.isolation)

    @staticmethod
    def _tier_check(record: SandboxRecord, feature: str) -> None:
        """Refuse, with a typed error, what the sandbox's tier cannot do (yet)."""
        if record.isolation == GVISOR:
            from agentbox.runtime.gvisor_commands import unsupported

            raise unsupported(feature)

    def alive(self, record: SandboxRecord) -> bool:
        """Whether the sandbox's init still runs (pid and start time both match)."""
        return self._alive(record)

    @staticmethod
    def _alive(record: SandboxRecord) -> bool:
        return (
            record.init_pid is not None
            and process_start_time(record.init_pid) == record.init_start_time
        )

    # running things ---------------------------------------------------------------------
    def pause(
        self, sandbox_id: str, *, reason: str = "operator", actor: str = "local"
    ) -> SandboxRecord:
        """Freeze every process of the sandbox (CPU drops to zero; memory, files and
        connections stay). Any later call through this runtime resumes it first."""
        _, host, cgroup = self.running(sandbox_id, touch=False)
        with self._lock:
            self._live.forget(sandbox_id)
            cgroup.freeze()
            host.paused_marker.touch()  # what other processes' cached views check
            self.store.set_state(sandbox_id, "paused")
        self.event(sandbox_id, "paused", reason, actor)
        return self.get(sandbox_id)

    def resume(
        self, sandbox_id: str, *, reason: str = "operator", actor: str = "local"
    ) -> SandboxRecord:
        """Continue a paused sandbox exactly where it stopped, or start a stopped one
        again on its kept disk (its processes are gone). A no-op when running."""
        record = self.get(sandbox_id)
        host = self.host(record)
        if record.state == "paused" or self.layout.sandbox(sandbox_id).frozen():
            with self._lock:
                self.layout.sandbox(sandbox_id).thaw()
                self.store.set_state(sandbox_id, "running")
                host.paused_marker.unlink(missing_ok=True)
            self.touch(sandbox_id, force=True)
            self.event(sandbox_id, "resumed", reason, actor)
            record = self.get(sandbox_id)
        elif record.state == "stopped":
            self._start(record, host)
            self.touch(sandbox_id, force=True)
            self.event(sandbox_id, "started", reason, actor)
            record = self.get(sandbox_id)
        elif record.state != "running":
            raise SandboxNotRunning(
                f"sandbox {sandbox_id} is {record.state}, not paused; create a new one"
            )
        return record

    def stop(
        self, sandbox_id: str, *, reason: str = "operator", actor: str = "local"
    ) -> SandboxRecord:
        """End every process but keep the sandbox's disk (files, installed packages);
        ``resume`` starts it again. Cheaper to keep than a paused sandbox: no memory."""
        record = self.get(sandbox_id)
        if record.state == "stopped":
            return record
        self._live.forget(sandbox_id)
        host = self.host(record)
        cgroup = self.layout.sandbox(sandbox_id)
        net = plane.registered_home_net(self.home) if record.network_mode != "none" else None
        with self._lock:
            # A gvisor sandbox's netns is pinned (kept for its next start): it does not end.
            ending = record.isolation != GVISOR
            unlinked = (
                None if net is None else plane.detaching(net.link(record.slot), netns_ending=ending)
            )
            cgroup.thaw()  # a frozen tree dies only once thawed on some kernels
            cgroup.remove_processes()
            wait_exited(record.init_pid, record.init_start_time)
            host.processes_ended()
            if unlinked is not None:
                unlinked()
            host.paused_marker.unlink(missing_ok=True)
            self.store.set_state(sandbox_id, "stopped")
        self.event(sandbox_id, "stopped", reason, actor)
        return self.get(sandbox_id)

    def _start(self, record: SandboxRecord, host: SandboxHost) -> None:
        spec = record.spec
        # Its overlay is on the digest it was made from, whatever the name means now.
        template = self.templates.exact(record.template, record.template_digest)
        cgroup = self.layout.sandbox(record.id)
        remaining = (record.expires_at or time.time() + spec.lifetime) - time.time()
        if remaining <= 1:
            raise SandboxNotRunning(f"sandbox {record.id} has reached its lifetime")
        networked, gvisor = spec.network.mode != "none", record.isolation == GVISOR
        if networked and gvisor:  # its namespace outlived the stop; wired before runsc
            plane.attach(self.net.link(record.slot), host.netns)  # type: ignore[attr-defined]
        limits = host_limits(record.isolation, Limits(spec.memory, spec.pids, spec.cpus))
        if spec.volumes:  # still claimed by this sandbox while it was stopped
            from agentbox.volumes import image

            host.volume_binds = self.volumes.binds_for(record.id)
            for bind in host.volume_binds:  # the agent may have replaced a path since
                image.make_mountpoint(host.root, bind.path, host.host_uid, host.host_gid)
        launch = Launch(
            self.paths, cgroup, template.host_usr, spec.memory, remaining, limits,
            wire_netns=self._wiring(record.slot) if networked and not gvisor else None,
        )  # fmt: skip
        pid, start = host.launch(launch)
        if not gvisor:
            self._start_resident(host, cgroup, pid)
        self.store.mark_running(record.id, pid, start)

    # snapshots (runtime.snapshots) ------------------------------------------------------
    def snapshots(self, store_url: str | None = None) -> Snapshots:
        """Snapshots in ``store_url`` (file:// or s3://), else ``$AGENTBOX_STORE``, else
        ``$AGENTBOX_HOME/snapshots``."""
        from agentbox.runtime.snapshots import Snapshots
        from agentbox.storage.objectstore import open_store

        url = store_url or os.environ.get("AGENTBOX_STORE") or None
        return Snapshots(self, open_store(url, self.home))

    def snapshot(self, sandbox_id: str, **options: Unpack[SnapshotOptions]) -> SnapshotInfo:
        """Scan, archive and store the sandbox's writable layer and /workspace; refused
        (SecretsFound, with a report) when secrets are found, unless ``redact``.
        ``allowlist``: allow-list text (see storage.secretscan.AllowList). ``memory``:
        its running processes too (gvisor tier; runtime.memory_snapshots)."""
        from agentbox.storage.secretscan import AllowList

        redact, allowlist = options.get("redact", False), options.get("allowlist")
        memory = options.get("memory", False)
        allowed = AllowList.parse(allowlist, "allow-list") if allowlist else None
        if memory:
            from agentbox.runtime import memory_snapshots

            return memory_snapshots.take(self, self.snapshots(), sandbox_id, redact, allowed)
        return self.snapshots().create(sandbox_id, redact=redact, allowlist=allowed)

    def relaunch(self, record: SandboxRecord, host: SandboxHost) -> None:
        """Start a stopped sandbox's runsc again, in its cgroups (a memory snapshot's
        source after its checkpoint: ``host.memory_image`` set), and record its pid."""
        spec = record.spec
        template = self.templates.exact(record.template, record.template_digest)
        cgroup = self.layout.sandbox(record.id)
        limits = host_limits(spec.isolation, Limits(spec.memory, spec.pids, spec.cpus))
        self._live.forget(record.id)
        launch = Launch(self.paths, cgroup, template.host_usr, spec.memory, spec.lifetime, limits)
        pid, start = host.launch(launch)
        self.store.mark_running(record.id, pid, start)

    def restore(self, snapshot_id: str, *, actor: str = "local") -> SandboxRecord:
        return self.snapshots().restore(snapshot_id, actor=actor)

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return self.snapshots().list()

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.snapshots().delete(snapshot_id)

    def touch(self, sandbox_id: str, *, force: bool = False) -> None:
        """Note activity on a sandbox (its idle clock restarts). At most once a second per
        sandbox and process: a file's mtime, shared with every other process."""
        now = time.monotonic()
        if not force and now - self._touched.get(sandbox_id, -2.0) < 1.0:
            return
        self._touched[sandbox_id] = now
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.home / "sandboxes" / sandbox_id / "activity")

    def running(self, sandbox_id: str, *, touch: bool = True) -> Running:
        """The record, host and cgroup of a running sandbox (a paused one is resumed);
        ``touch``: this use counts as activity (see ``runtime.lifecycle``)."""
        if touch:
            self.touch(sandbox_id)
        running = self._live.get(sandbox_id)
        if running is not None and running[1].paused_marker.exists():
            # Paused since it was cached (perhaps by another process): resume first. A
            # stat of the marker, not a read of cgroup.freeze: ~2 µs instead of ~18 on
            # every call.
            self._live.forget(sandbox_id)
            running = None
        if running is None:
            record = self.get(sandbox_id)
            if record.state == "paused":  # a call on a paused sandbox resumes it
                record = self.resume(sandbox_id, reason="activity", actor="agentbox")
            if record.state == "stopped":
                raise SandboxNotRunning(
                    f"sandbox {sandbox_id} is stopped (its files are kept, its processes "
                    "ended); resume it to start it again"
                )
            if record.state != "running":
                raise SandboxNotRunning(
                    f"sandbox {sandbox_id} is {record.state}, not running; create a new one"
                )
            running = (record, self.host(record), self.layout.sandbox(sandbox_id))
            self._live.add(running)
        return running

    def commands(self, sandbox_id: str) -> CommandRunner:
        record, host, cgroup = self.running(sandbox_id)
        assert record.init_pid is not None
        env = record.env
        if record.network_mode != "none":
            trust = plane.ca_env() if record.has_credentials else {}
            env = {**self.net.proxy_env(), **trust, **env}
        if record.isolation == GVISOR:
            from agentbox.runtime.gvisor_commands import GvisorCommandRunner

            return GvisorCommandRunner(self.paths, host, cgroup, record.init_pid, env)  # type: ignore[arg-type]
        return CommandRunner(self.paths, host, cgroup, record.init_pid, env)

    def processes(self, sandbox_id: str) -> ProcessTable:
        from agentbox.runtime.processes import ProcessTable

        runner = self.commands(sandbox_id)
        if self.running(sandbox_id)[0].isolation == GVISOR:
            from agentbox.runtime.gvisor_processes import GvisorProcessTable

            return GvisorProcessTable(runner)
        return ProcessTable(runner)

    def sessions(self, sandbox_id: str) -> ShellSessions:
        from agentbox.runtime.sessions import ShellSessions

        return ShellSessions(self.commands(sandbox_id))

    def files(self, sandbox_id: str) -> SandboxFiles:
        from agentbox.runtime.files import SandboxFiles

        record, host, _ = self.running(sandbox_id)
        if record.isolation == GVISOR:  # the host-side tree runsc serves (gvisor_host)
            return SandboxFiles(str(host.root), host.host_uid, host.host_gid)
        return SandboxFiles(f"/proc/{record.init_pid}/root", host.host_uid, host.host_gid)
