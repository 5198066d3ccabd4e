"""What RunPodSandbox prepares, and its rollback: the record with the pod's paths and
cgroup, the pinned netns (in the pod's user namespace if it has one), the CNI ADD, the
pause's rootfs (embedded or the pause image's layers), `runc create` of the pause, the
pod files, and `runc start`.

The pause runs under the OCI runtime alone, without conmon: it has no output, no stdin and
nobody needs its exit code, so a monitor process per pod would be pure memory overhead.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.errors import FailedPrecondition, NotFound
from crishim.host import idmap, modes
from crishim.host.facts import HostFacts
from crishim.host.mount import is_mountpoint
from crishim.host.remove import Roots
from crishim.image.manager import ImageManager
from crishim.image.rootfs import mount_rootfs
from crishim.log import get_logger
from crishim.network.netns import bring_up_loopback, create_netns
from crishim.network.types import DNS, NetworkResult, PodNetwork, PortMapping
from crishim.oci import spec as ocispec
from crishim.oci.userns import PodUserns, pod_userns
from crishim.proc.crashpoint import crash_point
from crishim.runtime.runc import OCIRuntime
from crishim.sandbox import pause as pausemod
from crishim.sandbox import pauserootfs, podfiles
from crishim.sandbox.pausewatch import PauseWatch
from crishim.sandbox.slices import MadeSlices
from crishim.sandbox.teardown import PodTeardown
from crishim.store.db import Database
from crishim.store.sandbox import KIND, Sandbox

log = get_logger(__name__)

CGROUP_PREFIX = "crishim"

# (rootfs, args, env, cwd) of the pause process.
PauseProcess = tuple[str, list[str], list[str], str]


def _owner(userns: PodUserns | None) -> tuple[int, int] | None:
    """Who owns the pod's files on the host: the pod's root in its user namespace."""
    return None if userns is None else (userns.root_uid, userns.root_gid)


class NetworkSetup(Protocol):
    """What the build needs of the network manager."""

    async def setup(self, pod_id: str, netns_path: str, pod: PodNetwork) -> NetworkResult: ...


class SandboxBuilder:
    def __init__(self, cfg: Config, db: Database, network: NetworkSetup,
                 images: ImageManager, host: HostFacts, slices: MadeSlices, roots: Roots,
                 pauses: PauseWatch, teardown: PodTeardown) -> None:
        """`host`: the node's facts (the pause's OOM score floor); `slices`: the systemd
        slices made for pods' parents; `roots`: where the pod's pins may be made and
        removed; `pauses` and `teardown` undo what a rollback finds."""
        self.cfg = cfg
        self.db = db
        self.network = network
        self.images = images
        self.host = host
        self.slices = slices
        self.roots = roots
        self.pauses = pauses
        self.teardown = teardown
        self._embedded_rootfs: str | None = None  # built once per daemon start
        self._timings: dict[str, dict[str, float]] = {}  # per-step ms, logged at debug

    async def new_record(self, sid: str, name: str, config: pb.PodSandboxConfig,
                         handler: str) -> Sandbox:
        """The pod's record: its paths, its cgroup (and the systemd slices claimed for its
        parent, which the caller releases if it fails before recording an intent)."""
        ns = config.linux.security_context.namespace_options
        sandbox_dir = os.path.join(self.cfg.root, "sandboxes", sid)
        sb = Sandbox(
            id=sid, name=name, config=config, runtime_handler=handler,
            created_at=time.time_ns(),
            netns_path="" if ns.network == pb.NODE else os.path.join(self.cfg.state, "netns",
                                                                     sid),
            userns_path=(os.path.join(self.cfg.state, "userns", sid)
                         if pod_userns(ns) is not None else ""),
            cgroup_parent=config.linux.cgroup_parent, sandbox_dir=sandbox_dir,
            bundle=os.path.join(sandbox_dir, "bundle"),
            shm_path="" if ns.ipc == pb.NODE else os.path.join(sandbox_dir, "shm"))
        driver = self.cfg.effective_cgroup_driver()
        sb.cgroups_path = ocispec.cgroups_path(driver, sb.cgroup_parent, CGROUP_PREFIX, sid)
        if driver == "systemd":
            sb.made_slices = await self.slices.claim(sb.cgroup_parent)
        return sb

    async def create(self, sb: Sandbox, runtime: OCIRuntime) -> None:
        """netns, then CNI ADD while the pause is created, pod files, `runc start`."""
        try:
            await self._create(sb, runtime)
        except BaseException:
            self._timings.pop(sb.id, None)
            raise
        log.debug("sandbox timings (ms)", id=sb.id, **self._timings.pop(sb.id, {}))

    async def _create(self, sb: Sandbox, runtime: OCIRuntime) -> None:
        config = sb.config
        net_task: asyncio.Task[None] | None = None
        userns = pod_userns(sb.namespace_options)
        if userns is not None and not sb.netns_path:
            # Host network: the user namespace alone (the pod binds the host's /sys).
            await idmap.create_pinned(userns.uids, userns.gids, sb.userns_path,
                                      roots=self.roots)
        if sb.netns_path:
            t = time.perf_counter()
            if userns is not None:
                # Made inside the pod's user namespace (owned by it), so the runtime can
                # mount sysfs for the pod.
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

    def _timing(self, sb: Sandbox, step: str, since: float) -> None:
        self._timings.setdefault(sb.id, {})[step] = round((time.perf_counter() - since) * 1e3,
                                                          1)

    async def _attach_network(self, sb: Sandbox) -> None:
        t = time.perf_counter()
        result = await self.network.setup(sb.id, sb.netns_path, pod_network(sb.config))
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
        sb.pid = await runtime.create(sb.id, sb.bundle, os.path.join(sb.sandbox_dir,
                                                                     "pause.pid"))

    async def _pause_rootfs(self, sb: Sandbox) -> PauseProcess:
        """(rootfs, args, env, cwd) of the pause: embedded, or the configured image."""
        if not self.cfg.pause_image:
            if self._embedded_rootfs is None:
                self._embedded_rootfs = await asyncio.to_thread(
                    pauserootfs.ensure, self.cfg.root, self.cfg.catatonit_path)
            rootfs = self._embedded_rootfs
            if pod_userns(sb.namespace_options) is not None:
                # The pod's root may not open the shared rootfs (root's, private); an
                # idmapped view of it in the pod's dir is its own, read-only with the
                # flag locked for the pod (host/idmap.py): through it the pod's root is
                # the files' owner. Unmounted with the pod's other mounts.
                rootfs = os.path.join(sb.sandbox_dir, "rootfs")
                if not await asyncio.to_thread(is_mountpoint, rootfs):
                    await asyncio.to_thread(idmap.bind_idmapped_sync,
                                            [(self._embedded_rootfs, rootfs)], sb.userns_path,
                                            readonly=True)
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

    async def rollback(self, sb: Sandbox) -> None:
        """Undo a partial RunPodSandbox, in reverse order; every step is attempted. The
        intent and the record go only when every step succeeded: what failed is retried
        at the next start."""
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("stop pause", lambda: self.pauses.kill(sb)),
            ("network", lambda: self.teardown.release_network(sb)),
            ("files", lambda: self.teardown.remove_files(sb)),
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


def pod_network(config: pb.PodSandboxConfig) -> PodNetwork:
    """What CNI is told of the pod: its names, port mappings, DNS, cgroup parent."""
    proto = {pb.TCP: "tcp", pb.UDP: "udp", pb.SCTP: "sctp"}
    dns = None
    if config.HasField("dns_config"):
        d = config.dns_config
        dns = DNS(servers=list(d.servers), searches=list(d.searches), options=list(d.options))
    meta = config.metadata
    return PodNetwork(
        name=meta.name, namespace=meta.namespace, uid=meta.uid,
        port_mappings=[PortMapping(container_port=p.container_port, host_port=p.host_port,
                                   protocol=proto.get(p.protocol, "tcp"), host_ip=p.host_ip)
                       for p in config.port_mappings if p.host_port > 0],
        dns=dns, cgroup_parent=config.linux.cgroup_parent,
        annotations=dict(config.annotations))
