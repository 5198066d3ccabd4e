"""SandboxManager: RunPodSandbox / Stop / Remove / Status / List and start-up reconcile.

Crash safety: RunPodSandbox records an intent (everything needed to undo it) before any
side effect, and drops it only once the sandbox is READY and persisted. At start an
intent left behind means a run was interrupted: it is rolled back (runc delete, CNI DEL
from the cache, netns unpin, shm unmount, files) before the socket serves.

The pause runs under the OCI runtime alone, without conmon: it has no output, no stdin and
nobody needs its exit code, so a monitor process per pod would be pure memory overhead.
Its death is noticed through a pidfd on the event loop (crishim.oci.pidwatch).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from google.protobuf import json_format

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.errors import FailedPrecondition, NotFound
from crishim.host import idmap, modes
from crishim.host.facts import HostFacts
from crishim.host.mount import detach, is_mountpoint
from crishim.host.remove import Roots, remove
from crishim.image.manager import ImageManager
from crishim.image.rootfs import mount_rootfs
from crishim.log import get_logger
from crishim.network.netns import bring_up_loopback, create_netns, remove_netns
from crishim.network.types import DNS, NetworkResult, PodNetwork, PortMapping
from crishim.nri.adaptation import NRI
from crishim.observe.events import EventBus
from crishim.oci import pidwatch
from crishim.oci import spec as ocispec
from crishim.oci.kill import kill_and_delete
from crishim.oci.runc import OCIRuntime, RuntimeRegistry
from crishim.proc.afterreply import AfterReply
from crishim.proc.crashpoint import crash_point
from crishim.sandbox import pause as pausemod
from crishim.sandbox import podfiles, slices
from crishim.sandbox.recover import SandboxRecovery
from crishim.sandbox.registry import SandboxRegistry
from crishim.sandbox.userns import PodUserns, pod_userns
from crishim.sandbox.validate import validate_cgroup_parent, validate_config
from crishim.store.db import Database
from crishim.store.sandbox import KIND, NOTREADY, READY, Sandbox, reserved_name

log = get_logger(__name__)

CGROUP_PREFIX = "crishim"

# (rootfs, args, env, cwd) of the pause process.
PauseProcess = tuple[str, list[str], list[str], str]


def _owner(userns: PodUserns | None) -> tuple[int, int] | None:
    """Who owns the pod's files on the host: the pod's root in its user namespace."""
    return None if userns is None else (userns.root_uid, userns.root_gid)


class NetworkLike(Protocol):
    """What we need of crishim.network.manager.NetworkManager (a protocol for tests)."""

    async def setup(self, pod_id: str, netns_path: str, pod: PodNetwork) -> NetworkResult: ...
    async def teardown(self, pod_id: str, netns_path: str | None) -> None: ...
    async def reconcile(self, live_pod_ids: set[str]) -> None: ...


class PodContainers(Protocol):
    """The pod-wide container steps of StopPodSandbox/RemovePodSandbox and the statuses
    that PodSandboxStatus and pod events carry (the container manager)."""

    async def stop_pod_containers(self, pod_id: str) -> None: ...
    async def remove_pod_containers(self, pod_id: str) -> None: ...
    def pod_statuses(self, pod_id: str) -> list[pb.ContainerStatus]: ...


class SandboxManager:
    def __init__(self, cfg: Config, db: Database, events: EventBus,
                 runtimes: RuntimeRegistry, network: NetworkLike, images: ImageManager,
                 pods: SandboxRegistry, containers: PodContainers, host: HostFacts,
                 nri: NRI | None = None) -> None:
        """`host`: the node's facts, probed once at start (the pause's OOM score floor);
        `nri`: the NRI plugins told of each step (none: no NRI)."""
        self.cfg = cfg
        self.host = host
        self.nri = nri
        self.db = db
        self.events = events
        self.runtimes = runtimes
        self.network = network
        self.images = images
        self.pods = pods
        self.containers = containers
        # The pause processes of READY pods: one pidfd each, on the event loop.
        self.pids = pidwatch.PidWatcher()
        # Slices crishim made for pods' parents under the systemd driver (sandbox/slices.py).
        self.slices = slices.MadeSlices()
        self._embedded_rootfs: str | None = None  # built once per daemon start
        self._timings: dict[str, dict[str, float]] = {}  # per-step ms, logged at debug
        self.after_reply = AfterReply()  # removed pods' dirs are deleted there
        # Where the pod's files may be deleted: a record naming a path elsewhere is refused.
        self.roots = Roots(cfg.root, cfg.state)
        self.recovery = SandboxRecovery(cfg, db, pods, self.slices, runtimes, network,
                                        self.roots, self.rollback, self.watch_pause)

    # --- paths ---
    def sandbox_dir(self, sid: str) -> str:
        return os.path.join(self.cfg.root, "sandboxes", sid)

    def netns_path(self, sid: str) -> str:
        return os.path.join(self.cfg.state, "netns", sid)

    def userns_path(self, sid: str) -> str:
        return os.path.join(self.cfg.state, "userns", sid)

    @staticmethod
    def pause_pid_file(sb: Sandbox) -> str:
        return os.path.join(sb.sandbox_dir, "pause.pid")

    def pod_lock(self, sid: str) -> asyncio.Lock:
        return self.pods.pod_lock(sid)

    # --- queries ---
    def get(self, sid: str) -> Sandbox:
        return self.pods.get(sid)

    def find(self, sid: str) -> Sandbox | None:
        return self.pods.find(sid)

    def list(self, flt: pb.PodSandboxFilter | None = None) -> builtins.list[Sandbox]:
        return self.pods.list(flt)

    async def update_resources(self, sb: Sandbox, resources: pb.LinuxContainerResources,
                               overhead: pb.LinuxContainerResources) -> None:
        """Record the pod's resources (UpdatePodSandboxResources). The pod cgroup is the
        kubelet's and it resizes that itself; crishim only keeps what it was told, as
        containerd and CRI-O do, so status shows the pod's current resources."""
        async with self.pod_lock(sb.id):
            if self.nri is not None and self.nri.active:
                await self.nri.update_pod_sandbox(sb, resources, overhead)
            sb.config.linux.resources.CopyFrom(resources)
            sb.config.linux.overhead.CopyFrom(overhead)
            await self.db.put(KIND, sb.id, sb.to_dict())
            if self.nri is not None and self.nri.active:
                await self.nri.post_update_pod_sandbox(sb)

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

    def statuses_of_containers(self, sid: str) -> builtins.list[pb.ContainerStatus]:
        return self.containers.pod_statuses(sid)

    # --- run ---
    async def run(self, config: pb.PodSandboxConfig, runtime_handler: str) -> str:
        validate_config(config)
        validate_cgroup_parent(self.cfg.effective_cgroup_driver(), config.linux.cgroup_parent)
        handler = self.runtimes.resolve_name(runtime_handler)
        runtime = self.runtimes.usable(handler)  # one the start-up probe found can run
        name = reserved_name(config.metadata)
        sid = secrets.token_hex(32)
        self.pods.reserve(name, sid)
        try:
            async with self.pod_lock(sid):
                return await self._run(sid, name, config, handler, runtime)
        except BaseException:
            self.pods.unreserve(name, sid)
            raise

    async def _run(self, sid: str, name: str, config: pb.PodSandboxConfig, handler: str,
                   runtime: OCIRuntime) -> str:
        t0 = time.perf_counter()
        ns = config.linux.security_context.namespace_options
        host_network = ns.network == pb.NODE
        sandbox_dir = self.sandbox_dir(sid)
        in_userns = pod_userns(ns) is not None
        sb = Sandbox(
            id=sid, name=name, config=config, runtime_handler=handler,
            created_at=time.time_ns(), netns_path="" if host_network else self.netns_path(sid),
            userns_path=self.userns_path(sid) if in_userns else "",
            cgroup_parent=config.linux.cgroup_parent, sandbox_dir=sandbox_dir,
            bundle=os.path.join(sandbox_dir, "bundle"),
            shm_path="" if ns.ipc == pb.NODE else os.path.join(sandbox_dir, "shm"))
        driver = self.cfg.effective_cgroup_driver()
        sb.cgroups_path = ocispec.cgroups_path(driver, sb.cgroup_parent, CGROUP_PREFIX, sid)
        if driver == "systemd":
            sb.made_slices = await self.slices.claim(sb.cgroup_parent)
        # Everything needed to undo this run, recorded before the first side effect.
        try:
            await self.db.add_intent(sid, KIND, sb.to_dict())
        except BaseException:
            await asyncio.shield(self.slices.release(sb.made_slices))
            raise
        crash_point("sandbox-after-intent")
        try:
            await self._create(sb, runtime)
            if self.nri is not None and self.nri.active:
                # A plugin's refusal fails the run, and the pod is rolled back.
                await self.nri.run_pod_sandbox(sb)
        except BaseException as exc:
            self._timings.pop(sid, None)
            log.warning("RunPodSandbox failed; rolling back", id=sid, error=str(exc))
            await asyncio.shield(self.rollback(sb))
            raise
        crash_point("sandbox-before-ready")
        sb.state = READY
        self.pods.add(sb)
        await self.db.put(KIND, sid, sb.to_dict())
        await self.db.remove_intent(sid)
        watched = self.watch_pause(sb)
        self._publish(sb, pb.CONTAINER_CREATED_EVENT)
        self._publish(sb, pb.CONTAINER_STARTED_EVENT)
        log.info("pod sandbox ready", id=sid, name=name, ips=sb.ips,
                 ms=round((time.perf_counter() - t0) * 1000, 1))
        if not watched:  # the pause died already
            await self._on_pause_exit(sid)
        return sid

    async def _create(self, sb: Sandbox, runtime: OCIRuntime) -> None:
        config = sb.config
        net_task: asyncio.Task[None] | None = None
        userns = pod_userns(sb.namespace_options)
        if sb.netns_path:
            t = time.perf_counter()
            if userns is not None:
                # Made inside the pod's user namespace (owned by it), so the runtime can
                # mount sysfs for the pod (host network is refused with a user namespace).
                await idmap.create_pinned(userns.uids, userns.gids, sb.userns_path,
                                          sb.netns_path, roots=self.roots)
                await bring_up_loopback(sb.netns_path)
            else:
                await create_netns(sb.netns_path, roots=self.roots)
            self._timing(sb, "netns", t)
            crash_point("sandbox-after-netns")
            # CNI ADD runs while runc creates the pause: the pause only needs the
            # pinned netns to exist, not configured, until it is started.
            net_task = asyncio.create_task(self._attach_network(sb), name=f"cni-add-{sb.id}")
        try:
            t = time.perf_counter()
            await self._create_pause(sb, runtime)
            self._timing(sb, "pause_create", t)
        except BaseException:
            if net_task is not None:
                # Let CNI finish so the rollback's DEL sees a complete cache entry.
                await asyncio.gather(net_task, return_exceptions=True)
            raise
        if net_task is not None:
            t = time.perf_counter()
            await net_task
            self._timing(sb, "cni_wait", t)
            crash_point("sandbox-after-cni-add")
        await asyncio.to_thread(podfiles.write_pod_files, sb.sandbox_dir, config, sb.ips,
                                sb.host_network, _owner(userns))
        crash_point("sandbox-before-pause-start")
        t = time.perf_counter()
        await runtime.start(sb.id)
        self._timing(sb, "pause_start", t)
        log.debug("sandbox timings (ms)", id=sb.id, **self._timings.pop(sb.id, {}))

    def _timing(self, sb: Sandbox, step: str, since: float) -> None:
        self._timings.setdefault(sb.id, {})[step] = round((time.perf_counter() - since) * 1e3,
                                                          1)

    async def _attach_network(self, sb: Sandbox) -> None:
        t = time.perf_counter()
        result = await self.network.setup(sb.id, sb.netns_path, self._pod_network(sb.config))
        sb.ips = list(result.ips)
        sb.cni_result = dict(result.raw)
        self._timing(sb, "cni_add", t)

    async def _create_pause(self, sb: Sandbox, runtime: OCIRuntime) -> None:
        """shm, bundle, then `runc create` (the pause exists but is not started).

        No conmon: the pause's stdio is /dev/null and its death is noticed by a pidfd once
        it runs. When `runc create` exits the pause is reparented to init (or the nearest
        subreaper), which reaps it."""
        config = sb.config
        userns = pod_userns(sb.namespace_options)
        # The pod's own dir: private; in a user namespace the pod's root passes through
        # it to the pause's rootfs there (host/modes.py).
        group = userns.root_gid if userns is not None else None
        await asyncio.to_thread(modes.make_dir, sb.sandbox_dir, modes.bundle_mode(group), group)
        if sb.shm_path:
            await asyncio.to_thread(podfiles.mount_shm, sb.shm_path, self.cfg.pod_shm_size,
                                    _owner(userns))
        rootfs, args, env, cwd = await self._pause_rootfs(sb)
        spec = pausemod.pause_spec(
            sandbox_id=sb.id, config=config, rootfs=rootfs, args=args, env=env, cwd=cwd,
            hostname=podfiles.pod_hostname(config, sb.host_network),
            netns_path=sb.netns_path, shm_path=sb.shm_path, cgroups_path=sb.cgroups_path,
            oom_floor=self.host.oom_score_adj_floor, userns=userns, userns_path=sb.userns_path)
        await asyncio.to_thread(ocispec.write_bundle, sb.bundle, spec)
        sb.pid = await runtime.create(sb.id, sb.bundle, self.pause_pid_file(sb))

    async def _pause_rootfs(self, sb: Sandbox) -> PauseProcess:
        """(rootfs, args, env, cwd) of the pause: embedded, or the configured image."""
        if not self.cfg.pause_image:
            if self._embedded_rootfs is None:
                self._embedded_rootfs = await asyncio.to_thread(
                    pausemod.ensure_embedded_rootfs, self.cfg.root, self.cfg.catatonit_path)
            rootfs = self._embedded_rootfs
            if pod_userns(sb.namespace_options) is not None:
                # The pod's root may not open the shared rootfs (root's, private); an
                # idmapped view of it in the pod's dir is its own. Unmounted with the
                # pod's other mounts.
                rootfs = os.path.join(sb.sandbox_dir, "rootfs")
                if not await asyncio.to_thread(is_mountpoint, rootfs):
                    await asyncio.to_thread(idmap.bind_idmapped_sync,
                                            [(self._embedded_rootfs, rootfs)], sb.userns_path)
            return rootfs, list(pausemod.PAUSE_ARGS), [], "/"
        return await self._image_rootfs(sb)

    async def _image_rootfs(self, sb: Sandbox) -> PauseProcess:
        images = self.images
        ref = self.cfg.pause_image
        try:
            image = images.get(ref)
        except NotFound:
            image = None
        if image is None:
            await images.pull(ref)
            image = images.get(ref)
        if image is None:
            raise FailedPrecondition(f"pause image {ref} is not present after its pull")
        layers = list(image.layer_dirs)
        if not layers:
            raise FailedPrecondition(f"pause image {ref} has no layers")
        # The same layout as a container's bundle: {upper,work,rootfs} in the pod's dir.
        rootfs = os.path.join(sb.sandbox_dir, "rootfs")
        if not await asyncio.to_thread(is_mountpoint, rootfs):
            await mount_rootfs(layers, sb.sandbox_dir)
        cfg = image.config or {}
        inner = cfg.get("config", cfg)
        args = list(inner.get("Entrypoint") or []) + list(inner.get("Cmd") or [])
        env = list(inner.get("Env") or [])
        cwd = str(inner.get("WorkingDir") or "/")
        return rootfs, args or ["/pause"], env, cwd

    @staticmethod
    def _pod_network(config: pb.PodSandboxConfig) -> PodNetwork:
        proto = {pb.TCP: "tcp", pb.UDP: "udp", pb.SCTP: "sctp"}
        dns = None
        if config.HasField("dns_config"):
            d = config.dns_config
            dns = DNS(servers=list(d.servers), searches=list(d.searches),
                      options=list(d.options))
        meta = config.metadata
        return PodNetwork(
            name=meta.name, namespace=meta.namespace, uid=meta.uid,
            port_mappings=[PortMapping(container_port=p.container_port, host_port=p.host_port,
                                       protocol=proto.get(p.protocol, "tcp"),
                                       host_ip=p.host_ip)
                           for p in config.port_mappings if p.host_port > 0],
            dns=dns, cgroup_parent=config.linux.cgroup_parent,
            annotations=dict(config.annotations))

    # --- teardown building blocks (each idempotent) ---
    async def _stop_pause(self, sb: Sandbox, pidfd: int | None = None) -> None:
        """Kill and delete the pause; idempotent. `pidfd`: the pause's pidfd if the caller
        holds one (it keeps it); otherwise the pid comes from runc state.

        catatonit has nothing to shut down gracefully: SIGKILL at once, wait (bounded) for
        the pidfd to say it died, then a delete that finds it stopped."""
        await kill_and_delete(self.runtimes.get(sb.runtime_handler), sb.id, pidfd)

    def watch_pause(self, sb: Sandbox) -> bool:
        """Watch the pause's pid: its death makes the sandbox NOTREADY. False when it is
        gone already."""
        return self.pids.watch(sb.id, sb.pid, self._on_pause_exit)

    async def _teardown_network(self, sb: Sandbox) -> None:
        if sb.netns_path:
            await self.network.teardown(sb.id, sb.netns_path)
            await remove_netns(sb.netns_path, roots=self.roots)
        if sb.userns_path:
            await asyncio.to_thread(idmap.remove_pins, sb.userns_path, roots=self.roots)

    async def _release_mounts(self, sb: Sandbox) -> None:
        """Detach the pod's shm and a pause-image rootfs overlay (whatever pause_image says
        now), in one thread hop; their empty dirs go with the sandbox dir."""
        paths = [p for p in (sb.shm_path, os.path.join(sb.sandbox_dir, "rootfs")) if p]
        await asyncio.to_thread(_detach_each, paths)

    async def _remove_files(self, sb: Sandbox) -> None:
        await self._release_mounts(sb)
        await asyncio.to_thread(remove, sb.sandbox_dir, self.roots, same_fs=True)

    def _drop_dir_later(self, sandbox_dir: str) -> None:
        """A removed pod's files (nothing mounted there any more, no record names them)
        go in the background: on ext4 an unlink can wait for the journal or for the
        writeback of a file written moments ago, milliseconds RemovePodSandbox need not
        wait. What a crash leaves, the start-up sweep of unowned dirs removes."""
        self.after_reply.run("deleting a removed pod's files",
                             functools.partial(remove, roots=self.roots, same_fs=True),
                             sandbox_dir)

    async def rollback(self, sb: Sandbox) -> None:
        """Undo a partial RunPodSandbox, in reverse order; every step is attempted."""
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("stop pause", lambda: self._stop_pause(sb)),
            ("network", lambda: self._teardown_network(sb)),
            ("files", lambda: self._remove_files(sb)),
            ("slices", lambda: self.slices.release(sb.made_slices)),
        ]
        ok = True
        for what, step in steps:
            try:
                await step()
            except Exception as exc:
                ok = False
                log.error("rollback step failed", id=sb.id, step=what, error=str(exc))
        if ok:
            await self.db.remove_intent(sb.id)
            await self.db.delete(KIND, sb.id)
        else:
            log.error("rollback incomplete; will retry at next start", id=sb.id)

    # --- pause exit ---
    async def _on_pause_exit(self, sid: str) -> None:
        """The pause died (its pidfd said so; not our child, so no exit code)."""
        sb = self.pods.exact(sid)
        if sb is None or sb.state != READY:
            return
        log.warning("pause exited; sandbox is NOTREADY", id=sid, pid=sb.pid)
        sb.state = NOTREADY
        await self.db.put(KIND, sid, sb.to_dict())
        self._publish(sb, pb.CONTAINER_STOPPED_EVENT)

    def _publish(self, sb: Sandbox, event_type: pb.ContainerEventType) -> None:
        if not self.events.subscriber_count:
            return  # nobody listens: the statuses are not built
        self.events.publish(pb.ContainerEventResponse(
            container_id=sb.id, container_event_type=event_type, created_at=time.time_ns(),
            pod_sandbox_status=sb.status_proto(),
            containers_statuses=self.statuses_of_containers(sb.id)))

    # --- stop / remove ---
    async def stop(self, sid: str) -> None:
        """Stop the pod's containers, the pause, and release its network; idempotent."""
        sb = self.find(sid)
        if sb is None:
            return  # CRI: stopping an unknown sandbox is not an error
        async with self.pod_lock(sb.id):
            if self.pods.exact(sb.id) is not sb:
                return  # removed while we waited: writing its record would resurrect it
            await self.containers.stop_pod_containers(sb.id)
            crash_point("sandbox-stop-after-containers")
            if self.nri is not None and self.nri.active and not sb.stopped:
                await self.nri.stop_pod_sandbox(sb)
            # No NOTREADY callback for the kill we are about to do: the pidfd is ours now.
            pidfd = self.pids.take(sb.id)
            try:
                await self._stop_steps(sb, pidfd)
            finally:
                if pidfd is not None:
                    if sb.state == READY:
                        # The stop failed or was cancelled: watch again until a retried
                        # Stop (a pause that died meanwhile is reported at once).
                        self.pids.watch(sb.id, sb.pid, self._on_pause_exit, pidfd=pidfd)
                    else:
                        os.close(pidfd)

    async def _stop_steps(self, sb: Sandbox, pidfd: int | None) -> None:
        # Independent: the pause going away and the CNI DEL (the pinned netns outlives
        # the pause). Both are attempted; the first failure is raised.
        results = await asyncio.gather(self._stop_pause(sb, pidfd),
                                       self._teardown_network(sb), return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException):
                raise res
        crash_point("sandbox-stop-after-teardown")
        # Nothing uses them once the pause is dead. Taken off here, where the pod's network
        # teardown already costs tens of milliseconds, RemovePodSandbox is one database
        # delete: an unmount waits for an RCU grace period, which a busy host stretches.
        await self._release_mounts(sb)
        crash_point("sandbox-stop-before-persist")
        was_ready = sb.state == READY
        sb.state = NOTREADY
        sb.stopped = sb.mounts_released = True
        await self.db.put(KIND, sb.id, sb.to_dict())
        if was_ready:
            self._publish(sb, pb.CONTAINER_STOPPED_EVENT)
        log.info("pod sandbox stopped", id=sb.id)

    async def remove(self, sid: str) -> None:
        """Remove the pod's containers, pause, files, mounts and state; idempotent."""
        sb = self.find(sid)
        if sb is None:
            return
        if not sb.stopped or sb.state == READY:
            await self.stop(sb.id)
        async with self.pod_lock(sb.id):
            if self.pods.exact(sb.id) is None:
                return  # removed concurrently
            await self.containers.remove_pod_containers(sb.id)
            crash_point("sandbox-remove-after-containers")
            if not sb.mounts_released:
                await self._release_mounts(sb)
            await self.slices.release(sb.made_slices)
            crash_point("sandbox-remove-before-delete")
            await self.db.delete(KIND, sb.id)
            self.pods.drop(sb)
            self._drop_dir_later(sb.sandbox_dir)
            self._publish(sb, pb.CONTAINER_DELETED_EVENT)
            log.info("pod sandbox removed", id=sb.id)
            if self.nri is not None and self.nri.active:
                await self.nri.remove_pod_sandbox(sb)
        self.pods.forget_locks(sb.id)

    # --- start-up ---
    async def start(self) -> None:
        """Reconcile records with reality (sandbox/recover.py); before the socket serves."""
        # sandboxes/ is passed through by a user-namespaced pod's init (host/modes.py).
        await asyncio.to_thread(modes.make_dir, os.path.join(self.cfg.root, "sandboxes"),
                                modes.PASS_THROUGH)
        for d in (os.path.join(self.cfg.state, "netns"), os.path.join(self.cfg.state, "userns")):
            await asyncio.to_thread(modes.make_dir, d, modes.PRIVATE)
        await self.recovery.reconcile()

    async def stop_manager(self) -> None:
        """Daemon shutdown: pods keep running; nothing to do but forget the watches."""
        self.pids.close()


def _detach_each(paths: list[str]) -> None:
    for path in paths:
        detach(path)
