"""ContainerManager: the CRI container RPCs (create, start, stop, remove, update, log
reopen, exec, status) of containers run by runc under conmon.

Layout: bundle + overlay rootfs + upper/work under {root}/containers/<id>/ (bundle.py),
conmon's persist dir under {state}/conmon/<id>, exit files in {state}/exits. Every
multi-step change records an intent first so that start-up reconciliation (recover.py)
can roll back what a crash interrupted. Exits and the release of a dead container are
exit.py's, the launch of a container's process launch.py's, the kill escalation of a stop
stop.py's and the wait for a reopened log logreopen.py's. State lives in memory
(ListContainers is served from memory) and is written through to the database on every
change.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable

from google.protobuf import json_format

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.edits import Injection
from crishim.cdi.request import cdi_requested
from crishim.config import Config
from crishim.container import checkpoint, logreopen, oom, restore
from crishim.container.build import ContainerPaths, build_container
from crishim.container.execsync import ExecResult, exec_process, exec_sync
from crishim.container.parts import ContainerHost, ContainerParts, conmon_dir, containers_dir
from crishim.container.spec import SpecHost
from crishim.errors import FailedPrecondition, InvalidArgument, NotFound
from crishim.host import modes
from crishim.image.store import Image
from crishim.log import get_logger
from crishim.oci import spec as oci_spec
from crishim.oci.resources import merge
from crishim.proc.crashpoint import crash_point
from crishim.runtime import conmon
from crishim.runtime.runc import OCIRuntime, OCIRuntimeError
from crishim.sandbox.parts import RuntimeSide, Stores
from crishim.store.container import CREATED, EXITED, KIND, RUNNING, Container, reserved_name
from crishim.store.sandbox import Sandbox

__all__ = ["KIND", "ContainerManager"]

log = get_logger(__name__)


def _now() -> int:
    return time.time_ns()


class ContainerManager:
    def __init__(self, cfg: Config, stores: Stores, runtime: RuntimeSide,
                 host: ContainerHost, parts: ContainerParts) -> None:
        """`parts`: the records and the helpers of the steps, built by `container_parts`
        from the same groups."""
        self.cfg = cfg
        self.stores = stores
        self.runtime = runtime
        self.host = host
        self.parts = parts
        self.records = parts.records
        self.containers_dir = containers_dir(cfg)
        self.conmon_dir = conmon_dir(cfg)
        self.exec_dir = os.path.join(cfg.state, "exec")
        self.checkpoint_dir = os.path.join(cfg.root, "checkpoints")  # parts, while gathered

    # -- lifecycle of the manager -----------------------------------------------------------
    async def start(self) -> None:
        # containers/ is passed through by a user-namespaced pod's init (host/modes.py).
        modes.make_dir(self.containers_dir, modes.PASS_THROUGH)
        for d in (self.conmon_dir, self.exec_dir, self.checkpoint_dir):
            modes.make_dir(d, modes.PRIVATE)
        await asyncio.to_thread(checkpoint.clear_leftovers, self.checkpoint_dir)
        await self.parts.recovery.reconcile()
        await self.parts.rootfs_sizes.recover([c.project_id for c in self.records.all()])

    async def stop(self) -> None:
        # Containers keep running under conmon; only stop watching.
        for cid in self.records.ids():
            self.runtime.exit_files.unwatch(cid)

    # -- lookups ----------------------------------------------------------------------------
    def find(self, cid: str) -> Container | None:
        """By full id or unique id prefix (as crictl passes short ids)."""
        return self.records.find(cid)

    def get(self, cid: str) -> Container:
        return self.records.get(cid)

    def list_containers(self, flt: pb.ContainerFilter | None = None) -> list[Container]:
        return self.records.list(flt)

    def list_version(self) -> tuple[int, int]:
        """Changes whenever a ListContainers reply would (cri/listreply.py)."""
        return self.records.list_version()

    def pod_statuses(self, pod_id: str) -> list[pb.ContainerStatus]:
        return self.records.pod_statuses(pod_id)

    def for_pod(self, pod_id: str) -> list[Container]:
        return self.records.for_pod(pod_id)

    def runtime_for(self, rec: Container) -> OCIRuntime:
        return self.runtime.runtimes.get(rec.runtime_handler)

    # -- create ------------------------------------------------------------------------------
    async def create_container(self, pod_id: str, config: pb.ContainerConfig,
                               sandbox_config: pb.PodSandboxConfig | None = None) -> Container:
        # The request was checked at the door (validate/requests.py).
        sb = self.stores.pods.find(pod_id)
        if sb is None:
            raise NotFound(f"pod sandbox {pod_id!r} does not exist")
        if sb.state != pb.SANDBOX_READY:
            raise FailedPrecondition(f"pod sandbox {sb.id} is not ready; cannot add a "
                                     "container to it")
        name = reserved_name(config.metadata, sb.config.metadata)
        cid = secrets.token_hex(32)
        self.records.reserve(name, cid)  # before the first await: no concurrent twin
        try:
            source, config = await restore.source_of(config)
            image = self.stores.images.get(config.image.image)
            if image is None:
                raise NotFound(f"image {config.image.image!r} is not present; pull it first")
            cap = await self.parts.rootfs_sizes.check(config, sb.config)
            cdi = await self.host.cdi.resolve(cdi_requested(config))
            # Held across the create: a StopPodSandbox/RemovePodSandbox in between would
            # otherwise stop the pod under a half-made container (runc then fails to join
            # the dead pause's namespaces, or the container outlives its pod).
            async with self.stores.pods.pod_lock(sb.id):
                if self.stores.pods.exact(sb.id) is not sb or sb.state != pb.SANDBOX_READY:
                    raise FailedPrecondition(f"pod sandbox {sb.id} was stopped or removed; "
                                             "cannot add a container to it")
                return await self._create(cid, name, sb, config, image, cdi, source, cap)
        except BaseException:
            self.records.unreserve(name, cid)
            raise

    async def _create(self, cid: str, name: str, sb: Sandbox, config: pb.ContainerConfig,
                      image: Image, cdi: list[Injection], source: restore.Source | None,
                      cap: int) -> Container:
        runtime = self.runtime.runtimes.usable(sb.runtime_handler)  # refused if it cannot run here
        bundle = self.parts.bundles.bundle(cid)
        persist = os.path.join(self.conmon_dir, cid)
        project = self.parts.rootfs_sizes.allocate(cap)
        await self.stores.db.add_intent(cid, KIND, {"op": "create", "bundle": bundle,
                                             "persist_dir": persist, "runtime": runtime.name,
                                             "project_id": project})
        crash_point("container-after-intent")
        try:
            await self.parts.rootfs_sizes.apply(bundle, project, cap)
            crash_point("container-after-quota")
            rec = await build_container(
                ContainerPaths(cid, bundle, persist), name, sb, config, image, runtime.name,
                self._host_for(config, sb), self.stores.images, cdi,
                self.runtime.nri.adjuster(sb))
            if source is not None:
                rec.restore_from = await asyncio.to_thread(restore.prepare, rec.rootfs,
                                                           bundle, source.archive)
        except BaseException:
            # Nothing was launched yet (that happens at StartContainer): no runc container.
            await self.parts.bundles.rollback(cid, bundle, persist, None)
            await self.parts.rootfs_sizes.free(project)
            await self.stores.db.remove_intent(cid)
            raise
        rec.project_id = project
        crash_point("container-before-record")
        self.records.add(rec)
        await self.stores.db.put(KIND, cid, rec.to_dict(), clear_intent=cid)
        for image_id in rec.image_ids():
            self.stores.images.mark_used(image_id, cid)
        self.parts.exits.watch(cid)
        log.info("container created", id=cid, name=name, pod=sb.id, image=image.id)
        self.parts.notify.publish(rec, pb.CONTAINER_CREATED_EVENT)
        await self.runtime.nri.post_create_container(sb, rec)
        return rec

    def _host_for(self, config: pb.ContainerConfig, sb: Sandbox) -> SpecHost:
        """The host info for this container's spec: with the target container's pid when
        it shares that container's pid namespace (NamespaceMode TARGET)."""
        sc = config.linux.security_context
        opts = sc.namespace_options if sc.HasField("namespace_options") \
            else sb.config.linux.security_context.namespace_options
        if opts.pid != pb.TARGET:
            return self.host.spec
        target = self.find(opts.target_id)
        if target is None or target.state != RUNNING:
            raise NotFound(f"pid namespace target container {opts.target_id!r} is not "
                           "running")
        return dataclasses.replace(self.host.spec, target_pid=target.pid)

    # -- start / stop ------------------------------------------------------------------------
    async def start_container(self, cid: str) -> None:
        rec = self.get(cid)
        # The pod lock: a concurrent StopPodSandbox finishes first (and we then refuse) or
        # waits until the container runs (and then stops it).
        async with self.stores.pods.pod_lock(rec.pod_id), self.records.lock(rec.id):
            if rec.state != CREATED:
                raise FailedPrecondition(f"container {rec.id} is not in the created state "
                                         f"(it is {pb.ContainerState.Name(rec.state)})")
            sb = self.stores.pods.exact(rec.pod_id)
            if sb is None or sb.state != pb.SANDBOX_READY:
                raise FailedPrecondition(f"pod sandbox {rec.pod_id} of container {rec.id} is "
                                         "not ready; the container cannot be started")
            crash_point("container-before-start")
            if not rec.launched:
                try:
                    await self.parts.launcher.launch(rec)
                except OCIRuntimeError as exc:
                    await self.parts.exits.start_failed(rec, exc)
                    raise
                crash_point("container-after-launch")
            # Created, not started, as containerd has its task: a plugin's refusal
            # fails the start, and the plugins are told the container stopped.
            try:
                await self.runtime.nri.start_container(sb, rec)
            except FailedPrecondition as exc:
                await self.parts.exits.start_failed(rec, exc)
                await self.runtime.nri.stop_container(sb, rec)
                raise
            # Taken before `runc start`: the process may exit before start returns, and
            # started_at must never be later than finished_at.
            rec.started_at = _now()
            rec.oom_base = await asyncio.to_thread(oom.parent_oom_kills, rec.cgroups_path)
            try:
                if not rec.restore_from:  # a restored container runs already
                    await self.runtime_for(rec).start(rec.id)
                rec.restore_from = await restore.started(rec.restore_from)
            except OCIRuntimeError as exc:
                if await self.parts.launcher.killed_before_start(rec, exc):
                    raise FailedPrecondition(f"container {rec.id} was stopped before it "
                                             "could start") from None
                await self.parts.exits.start_failed(rec, exc)
                raise
            crash_point("container-after-start")
            # The exit callback may already have run (a very short-lived container).
            if rec.state == CREATED:
                rec.state = RUNNING
            await self.parts.exits.save(rec)
        log.info("container started", id=rec.id)
        self.parts.notify.publish(rec, pb.CONTAINER_STARTED_EVENT)
        await self.runtime.nri.post_start_container(sb, rec, self.records.exited(rec.id))

    async def stop_container(self, cid: str, grace: float) -> None:
        """Stop signal, wait `grace` s, then SIGKILL. Idempotent (also for unknown ids)."""
        rec = self.find(cid)
        if rec is None or rec.state == EXITED:
            return
        async with self.records.stop_lock(rec.id):
            if rec.state != EXITED:  # else a concurrent stop finished it meanwhile
                await self._stop(rec, grace)
                await self._nri_event(rec, self.runtime.nri.stop_container)

    async def _stop(self, rec: Container, grace: float) -> None:
        if rec.state == CREATED and not rec.launched:
            # Start holds the container's lock while it launches: wait for it, then either
            # nothing ever ran (EXITED at once) or we stop a running container below.
            async with self.records.lock(rec.id):
                if rec.state == CREATED and not rec.launched:
                    await self.parts.exits.stop_unstarted(rec)
                    return
        await self.parts.stopper.stop(rec, grace)
        log.info("container stopped", id=rec.id)

    # -- remove ------------------------------------------------------------------------------
    async def remove_container(self, cid: str) -> None:
        rec = self.find(cid)
        if rec is None:
            return
        if rec.state in (RUNNING, CREATED):
            await self.stop_container(rec.id, 0)
        async with self.records.lock(rec.id):
            if self.records.exact(rec.id) is None:
                return
            await self.parts.exits.wait_finished(rec)
            self.runtime.exit_files.unwatch(rec.id)
            if rec.released:
                await self._remove_released(rec)
            else:
                await self._remove_full(rec)
            self.records.drop(rec)
            await self.parts.rootfs_sizes.free(rec.project_id)
        self.records.forget_locks(rec.id)
        for image_id in rec.image_ids():
            self.stores.images.unmark_used(image_id, rec.id)
        log.info("container removed", id=rec.id)
        self.parts.notify.publish(rec, pb.CONTAINER_DELETED_EVENT)
        await self._nri_event(rec, self.runtime.nri.remove_container)

    async def _nri_event(self, rec: Container,
                         event: Callable[[Sandbox, Container], Awaitable[None]]) -> None:
        sb = self.stores.pods.exact(rec.pod_id)
        if sb is not None:
            await event(sb, rec)

    async def _remove_released(self, rec: Container) -> None:
        """Nothing runs and nothing is mounted: forget the record (one database delete)
        and delete the files in the background. What a crash leaves of them (a bundle or
        conmon's files of an id no record has) the next start sweeps as orphans."""
        crash_point("container-remove-before-files")
        await self.stores.db.delete(KIND, rec.id)
        self.parts.bundles.drop_later(rec.id, rec.bundle, rec.persist_dir)

    async def _remove_full(self, rec: Container) -> None:
        """The container may still exist for runc or have mounts: undo everything, with an
        intent so that a crash half-way is finished at the next start."""
        await self.stores.db.add_intent(rec.id, KIND, {"op": "remove", "bundle": rec.bundle,
                                                "persist_dir": rec.persist_dir,
                                                "runtime": rec.runtime_handler})
        with contextlib.suppress(InvalidArgument):
            await self.runtime_for(rec).delete(rec.id, force=True)
        conmon.kill_conmon(rec.persist_dir)
        await conmon.remove_monitor_files(rec.id, rec.bundle, rec.persist_dir,
                                          self.runtime.exit_files.exit_dir,
                                          roots=self.parts.bundles.roots)
        await self.parts.bundles.remove_bundle(rec.bundle)
        await self.stores.db.delete(KIND, rec.id)
        await self.stores.db.remove_intent(rec.id)

    async def update_resources(self, rec: Container, update: pb.LinuxContainerResources,
                               nri_events: bool = True) -> None:
        """`update` merged over the stored resources (a zero field means "unchanged", as the
        kubelet sends whole LinuxContainerResources), mapped to what this host can enforce,
        applied (`runc update` for a live container; for one not started yet, into its
        bundle's config.json, what `runc create` will apply) and only then persisted, so
        ContainerStatus.resources shows what the cgroup really has. `nri_events`: NRI
        plugins are told (not for an update an NRI plugin asked for)."""
        if rec.state not in (CREATED, RUNNING):
            raise FailedPrecondition(
                f"container {rec.id} is {pb.ContainerState.Name(rec.state)}; resources can "
                "only be updated while it is created or running")
        merged = merge(rec.config.linux.resources, update)
        resources = self.host.spec.resources.linux(merged)
        if nri_events:
            sb = self.stores.pods.exact(rec.pod_id)
            if sb is not None:
                # What the plugins change for this container is what it gets, and
                # what its status reports.
                merged, resources = await self.runtime.nri.update_container(sb, rec, merged,
                                                                    resources)
        async with self.records.lock(rec.id):
            if rec.launched:
                await self.runtime_for(rec).update(rec.id, resources)
            else:
                spec = await asyncio.to_thread(oci_spec.read_bundle, rec.bundle)
                current = spec.setdefault("linux", {}).setdefault("resources", {})
                current.update(resources)
                await asyncio.to_thread(oci_spec.write_bundle, rec.bundle, spec)
        rec.config.linux.resources.CopyFrom(merged)
        await self.stores.db.put(KIND, rec.id, rec.to_dict())
        if nri_events:
            await self._nri_event(rec, self.runtime.nri.post_update_container)

    # -- checkpoint --------------------------------------------------------------------------
    async def checkpoint_container(self, cid: str, location: str, limit_s: float) -> None:
        rec = self.get(cid)
        async with self.records.lock(rec.id):
            await checkpoint.checkpoint_container(rec, self.runtime_for(rec),
                                                  self.checkpoint_dir, location, limit_s)

    # -- pod hooks ---------------------------------------------------------------------------
    async def stop_pod_containers(self, pod_id: str) -> None:
        await asyncio.gather(*(self.stop_container(c.id, 0) for c in self.for_pod(pod_id)))

    async def remove_pod_containers(self, pod_id: str) -> None:
        await asyncio.gather(*(self.remove_container(c.id) for c in self.for_pod(pod_id)))

    # -- logs, exec --------------------------------------------------------------------------
    async def reopen_log(self, cid: str) -> None:
        rec = self.get(cid)
        if rec.state != RUNNING:
            raise FailedPrecondition(f"container {rec.id} is not running; its log cannot be "
                                     "reopened")
        await logreopen.reopen_log(rec)

    async def exec_sync(self, cid: str, cmd: list[str], limit_s: float) -> ExecResult:
        rec = self.get(cid)
        if not cmd:
            raise InvalidArgument("exec needs a command")
        if rec.state != RUNNING:
            raise FailedPrecondition(f"container {rec.id} is not running")
        spec = await asyncio.to_thread(oci_spec.read_bundle, rec.bundle)
        return await exec_sync(self.runtime_for(rec), rec.id,
                               exec_process(spec["process"], cmd), self.exec_dir, limit_s)

    # -- status ------------------------------------------------------------------------------
    def status_proto(self, rec: Container) -> pb.ContainerStatus:
        return rec.status_proto()

    async def verbose_info(self, rec: Container) -> dict[str, str]:
        try:
            spec = await asyncio.to_thread(oci_spec.read_bundle, rec.bundle)
        except (OSError, ValueError):
            spec = {}
        info = {
            "sandboxID": rec.pod_id, "pid": rec.pid if rec.state == RUNNING else 0,
            "removing": False, "snapshotKey": rec.id, "snapshotter": "overlayfs",
            "runtimeType": "io.crishim.runc-conmon", "runtimeHandler": rec.runtime_handler,
            "runtimeOptions": {"binary_name": self.runtime_for(rec).binary,
                               "root": self.runtime_for(rec).root},
            "config": json_format.MessageToDict(rec.config),
            "runtimeSpec": spec,
        }
        return {"info": json.dumps(info)}
