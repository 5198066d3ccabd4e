"""SandboxManager: the CRI pod RPCs (run, stop, remove, update, status, list) and the
start-up reconcile, their steps and their locking.

What RunPodSandbox prepares and its rollback are build.py's, what a pod holds and how it
is let go teardown.py's, the pause's watch and kill pausewatch.py's, pod events
events.py's and the start-up reconcile recover.py's.

Crash safety: RunPodSandbox records an intent (everything needed to undo it) before any
side effect, and drops it only once the sandbox is READY and persisted. At start an
intent left behind means a run was interrupted: it is rolled back (runc delete, CNI DEL
from the cache, netns unpin, shm unmount, files) before the socket serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from typing import Any

from google.protobuf import json_format

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.host import modes
from crishim.log import get_logger
from crishim.oci import spec as ocispec
from crishim.proc.crashpoint import crash_point
from crishim.runtime.runc import OCIRuntime
from crishim.sandbox.parts import PodContainers, RuntimeSide, SandboxParts, Stores
from crishim.store.sandbox import KIND, NOTREADY, READY, Sandbox, reserved_name

log = get_logger(__name__)


class SandboxManager:
    def __init__(self, cfg: Config, stores: Stores, runtime: RuntimeSide,
                 containers: PodContainers, parts: SandboxParts) -> None:
        """`containers`: the container manager's pod-wide steps; `parts`: the helpers of
        the steps, built by `sandbox_parts` from the same groups."""
        self.cfg = cfg
        self.stores = stores
        self.runtime = runtime
        self.containers = containers
        self.parts = parts

    # -- lifecycle of the manager -----------------------------------------------------------
    async def start(self) -> None:
        """Reconcile records with reality (sandbox/recover.py); before the socket serves."""
        # sandboxes/ is passed through by a user-namespaced pod's init (host/modes.py).
        await asyncio.to_thread(modes.make_dir, os.path.join(self.cfg.root, "sandboxes"),
                                modes.PASS_THROUGH)
        for d in (os.path.join(self.cfg.state, "netns"), os.path.join(self.cfg.state, "userns")):
            await asyncio.to_thread(modes.make_dir, d, modes.PRIVATE)
        await self.parts.recovery.reconcile()

    async def stop(self) -> None:
        """Daemon shutdown: pods keep running; nothing to do but forget the watches."""
        self.parts.pauses.close()

    # -- lookups ----------------------------------------------------------------------------
    def pod_lock(self, sid: str) -> asyncio.Lock:
        return self.stores.pods.pod_lock(sid)

    def get(self, sid: str) -> Sandbox:
        return self.stores.pods.get(sid)

    def find(self, sid: str) -> Sandbox | None:
        return self.stores.pods.find(sid)

    def list_sandboxes(self, flt: pb.PodSandboxFilter | None = None) -> list[Sandbox]:
        return self.stores.pods.list(flt)

    def list_version(self) -> tuple[int, int]:
        """Changes whenever a ListPodSandbox reply would (cri/listreply.py)."""
        return self.stores.pods.list_version()

    def statuses_of_containers(self, sid: str) -> list[pb.ContainerStatus]:
        return self.containers.pod_statuses(sid)

    async def verbose_info(self, sb: Sandbox) -> dict[str, str]:
        """PodSandboxStatus(verbose) info: {"info": JSON} as crictl inspectp shows it."""
        spec: Any = None
        with contextlib.suppress(OSError, ValueError):
            spec = await asyncio.to_thread(ocispec.read_bundle, sb.bundle)
        info = {
            "pid": sb.pid, "netNamespacePath": sb.netns_path,
            "runtimeHandler": sb.runtime_handler, "cgroupsPath": sb.cgroups_path,
            "sandboxDir": sb.sandbox_dir, "shm": sb.shm_path, "image": self.cfg.pause_image
            or "embedded:catatonit",
            "config": json_format.MessageToDict(sb.config),
            "runtimeSpec": spec, "cniResult": sb.cni_result,
        }
        return {"info": json.dumps(info)}

    # -- update ------------------------------------------------------------------------------
    async def update_resources(self, sb: Sandbox, resources: pb.LinuxContainerResources,
                               overhead: pb.LinuxContainerResources) -> None:
        """Record the pod's resources (UpdatePodSandboxResources). The pod cgroup is the
        kubelet's and it resizes that itself; crishim only keeps what it was told, as
        containerd and CRI-O do, so status shows the pod's current resources."""
        async with self.pod_lock(sb.id):
            await self.runtime.nri.update_pod_sandbox(sb, resources, overhead)
            sb.config.linux.resources.CopyFrom(resources)
            sb.config.linux.overhead.CopyFrom(overhead)
            await self.stores.db.put(KIND, sb.id, sb.to_dict())
            await self.runtime.nri.post_update_pod_sandbox(sb)

    # -- run ---------------------------------------------------------------------------------
    async def run_sandbox(self, config: pb.PodSandboxConfig, runtime_handler: str) -> str:
        # The request was checked at the door (validate/requests.py).
        handler = self.runtime.runtimes.resolve_name(runtime_handler)
        runtime = self.runtime.runtimes.usable(handler)  # one the start-up probe found can run
        name = reserved_name(config.metadata)
        sid = secrets.token_hex(32)
        self.stores.pods.reserve(name, sid)
        try:
            async with self.pod_lock(sid):
                return await self._run(sid, name, config, handler, runtime)
        except BaseException:
            self.stores.pods.unreserve(name, sid)
            raise

    async def _run(self, sid: str, name: str, config: pb.PodSandboxConfig, handler: str,
                   runtime: OCIRuntime) -> str:
        t0 = time.perf_counter()
        sb = await self.parts.builder.new_record(sid, name, config, handler)
        # Everything needed to undo this run, recorded before the first side effect.
        try:
            await self.stores.db.add_intent(sid, KIND, sb.to_dict())
        except BaseException:
            await asyncio.shield(self.parts.slices.release(sb.made_slices))
            raise
        crash_point("sandbox-after-intent")
        try:
            await self.parts.builder.create(sb, runtime)
            # A plugin's refusal fails the run, and the pod is rolled back.
            await self.runtime.nri.run_pod_sandbox(sb)
        except BaseException as exc:
            log.warning("RunPodSandbox failed; rolling back", id=sid, error=str(exc))
            await asyncio.shield(self.parts.builder.rollback(sb))
            raise
        crash_point("sandbox-before-ready")
        sb.state = READY
        self.stores.pods.add(sb)
        await self.stores.db.put(KIND, sid, sb.to_dict())
        await self.stores.db.remove_intent(sid)
        watched = self.parts.pauses.watch(sb)
        self.parts.notify.publish(sb, pb.CONTAINER_CREATED_EVENT)
        self.parts.notify.publish(sb, pb.CONTAINER_STARTED_EVENT)
        log.info("pod sandbox ready", id=sid, name=name, ips=sb.ips,
                 ms=round((time.perf_counter() - t0) * 1000, 1))
        if not watched:  # the pause died already
            await self.parts.pauses.on_exit(sid)
        return sid

    # -- stop / remove -----------------------------------------------------------------------
    async def stop_sandbox(self, sid: str) -> None:
        """Stop the pod's containers, the pause, and release its network; idempotent."""
        sb = self.find(sid)
        if sb is None:
            return  # CRI: stopping an unknown sandbox is not an error
        async with self.pod_lock(sb.id):
            if self.stores.pods.exact(sb.id) is not sb:
                return  # removed while we waited: writing its record would resurrect it
            await self.containers.stop_pod_containers(sb.id)
            crash_point("sandbox-stop-after-containers")
            if not sb.stopped:
                await self.runtime.nri.stop_pod_sandbox(sb)
            # No NOTREADY callback for the kill we are about to do: the pidfd is ours now.
            pidfd = self.parts.pauses.take(sb.id)
            try:
                await self._stop_steps(sb, pidfd)
            finally:
                self.parts.pauses.give_back(sb, pidfd)

    async def _stop_steps(self, sb: Sandbox, pidfd: int | None) -> None:
        # Independent: the pause going away and the CNI DEL (the pinned netns outlives
        # the pause). Both are attempted; the first failure is raised.
        results = await asyncio.gather(self.parts.pauses.kill(sb, pidfd),
                                       self.parts.teardown.release_network(sb),
                                       return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException):
                raise res
        crash_point("sandbox-stop-after-teardown")
        # Nothing uses them once the pause is dead. Taken off here, where the pod's network
        # teardown already costs tens of milliseconds, RemovePodSandbox is one database
        # delete: an unmount waits for an RCU grace period, which a busy host stretches.
        await self.parts.teardown.release_mounts(sb)
        crash_point("sandbox-stop-before-persist")
        was_ready = sb.state == READY
        sb.state = NOTREADY
        sb.stopped = sb.mounts_released = True
        await self.stores.db.put(KIND, sb.id, sb.to_dict())
        if was_ready:
            self.parts.notify.publish(sb, pb.CONTAINER_STOPPED_EVENT)
        log.info("pod sandbox stopped", id=sb.id)

    async def remove_sandbox(self, sid: str) -> None:
        """Remove the pod's containers, pause, files, mounts and state; idempotent."""
        sb = self.find(sid)
        if sb is None:
            return
        if not sb.stopped or sb.state == READY:
            await self.stop_sandbox(sb.id)
        async with self.pod_lock(sb.id):
            if self.stores.pods.exact(sb.id) is None:
                return  # removed concurrently
            await self.containers.remove_pod_containers(sb.id)
            crash_point("sandbox-remove-after-containers")
            if not sb.mounts_released:
                await self.parts.teardown.release_mounts(sb)
            await self.parts.slices.release(sb.made_slices)
            crash_point("sandbox-remove-before-delete")
            await self.stores.db.delete(KIND, sb.id)
            self.stores.pods.drop(sb)
            self.parts.teardown.drop_dir_later(sb.sandbox_dir)
            self.parts.notify.publish(sb, pb.CONTAINER_DELETED_EVENT)
            log.info("pod sandbox removed", id=sb.id)
            await self.runtime.nri.remove_pod_sandbox(sb)
        self.stores.pods.forget_locks(sb.id)
