"""What CreateContainer prepares: the overlay rootfs, the resolved user, image volumes,
the bundle's config.json and the container record. No process runs yet (StartContainer
launches it), so undoing a failed build is unmounting and deleting the bundle.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi import edits as cdi_edits
from crishim.cdi.edits import Injection
from crishim.container import idmapvolume, imagevolume, rovolume
from crishim.container.spec import (
    TERMINATION_MESSAGE_ANNOTATION,
    PodInfo,
    SpecHost,
    SpecInputs,
    build_spec,
)
from crishim.container.user import UserRequest, resolve_user
from crishim.host import modes
from crishim.image import rootfs as rootfs_mod
from crishim.image.manager import ImageManager
from crishim.image.store import Image
from crishim.oci import spec as oci_spec
from crishim.oci.stopsignal import stop_signal
from crishim.oci.userns import pod_userns, to_host
from crishim.proc.crashpoint import crash_point
from crishim.sandbox.podfiles import pod_hostname
from crishim.store.container import CREATED, Container
from crishim.store.sandbox import Sandbox
from crishim.validate import fields


@dataclass(frozen=True)
class ContainerPaths:
    id: str
    bundle: str  # {root}/containers/<id>
    persist_dir: str  # conmon's files, {state}/conmon/<id>


async def build_container(paths: ContainerPaths, name: str, sb: Sandbox,
                          config: pb.ContainerConfig, image: Image, runtime_name: str,
                          host: SpecHost, images: ImageManager,
                          cdi: Sequence[Injection] = (),
                          nri_adjust: Callable[[Container, dict[str, Any]], Awaitable[None]]
                          | None = None) -> Container:
    """Mount the rootfs and image volumes, write the bundle, return the CREATED record.
    `cdi`: the resolved CDI devices' edits, applied over the built spec. `nri_adjust`:
    NRI plugins' adjustments, applied to the spec (given the record it would make, and
    the spec) before it is written.
    The caller removes the bundle (and what is mounted under it) if this fails."""
    bundle = paths.bundle
    log_path = _log_path(config, sb)
    pod = pod_info(sb)
    idmapped = None
    if pod.userns is not None:
        idmapped = rootfs_mod.IdmappedLayers(
            userns_path=pod.userns_path, owner=(pod.userns.root_uid, pod.userns.root_gid))
    rootfs = await rootfs_mod.mount_rootfs(list(image.layer_dirs), bundle, idmapped)
    crash_point("container-after-rootfs")
    img_cfg: dict[str, Any] = dict(image.config.get("config") or {})
    sc = config.linux.security_context
    req = UserRequest(
        run_as_user=sc.run_as_user.value if sc.HasField("run_as_user") else None,
        run_as_username=sc.run_as_username,
        run_as_group=sc.run_as_group.value if sc.HasField("run_as_group") else None,
        supplemental_groups=list(sc.supplemental_groups),
        strict_groups=sc.supplemental_groups_policy == pb.Strict)
    user = await asyncio.to_thread(resolve_user, rootfs, str(img_cfg.get("User") or ""), req)
    term_log = ""
    if config.annotations.get(TERMINATION_MESSAGE_ANNOTATION):
        term_log = os.path.join(bundle, "termination-log")
        await asyncio.to_thread(modes.make_private_file, term_log,
                                _host_ids(pod, user.uid, user.gid))
    volumes = await imagevolume.mount_all(config, images, bundle)
    mapped = await idmapvolume.mount_all(config, bundle)
    inputs = SpecInputs(container_id=paths.id, config=config, pod=pod,
                        image_config=img_cfg, image_name=config.image.image, rootfs=rootfs,
                        user=user, host=host, termination_log=term_log,
                        image_volumes={v.index: v.source for v in volumes},
                        idmapped_volumes=mapped)
    # In a thread: it stats host paths and devices (privileged walks all of /dev).
    # In a user namespace the read-only binds are made read-only where the pod cannot
    # undo it (container/rovolume.py), last: CDI and NRI may add some.
    lock = pod.userns is not None
    if nri_adjust is None:
        spec = await asyncio.to_thread(_write_spec, bundle, inputs, cdi, lock)
    else:
        spec = await asyncio.to_thread(_build_spec, inputs, cdi)
        await nri_adjust(_record(paths, name, sb, config, image, runtime_name, rootfs,
                                 log_path, img_cfg, term_log, spec), spec)
        await asyncio.to_thread(_lock_and_write, bundle, spec, lock)
    return _record(paths, name, sb, config, image, runtime_name, rootfs, log_path, img_cfg,
                   term_log, spec)


def _record(paths: ContainerPaths, name: str, sb: Sandbox, config: pb.ContainerConfig,
            image: Image, runtime_name: str, rootfs: str, log_path: str,
            img_cfg: dict[str, Any], term_log: str, spec: dict[str, Any]) -> Container:
    bundle = paths.bundle
    digests = image.repo_digests
    return Container(
        id=paths.id, pod_id=sb.id, name=name, config=config, runtime_handler=runtime_name,
        created_at=time.time_ns(), image_id=image.id,
        image_name=(image.repo_tags or [config.image.image])[0],
        image_ref=digests[0] if digests else image.id, bundle=bundle, rootfs=rootfs,
        persist_dir=paths.persist_dir, log_path=log_path, state=CREATED,
        stop_signal=stop_signal(config, img_cfg),
        uid=spec["process"]["user"].get("uid", 0), gid=spec["process"]["user"].get("gid", 0),
        gids=list(spec["process"]["user"].get("additionalGids", [])),
        termination_log=term_log, cgroups_path=spec["linux"].get("cgroupsPath", ""))


def _build_spec(inputs: SpecInputs, cdi: Sequence[Injection]) -> dict[str, Any]:
    spec = build_spec(inputs)
    cdi_edits.apply(spec, cdi)
    return spec


def _write_spec(bundle: str, inputs: SpecInputs, cdi: Sequence[Injection],
                lock: bool) -> dict[str, Any]:
    """The spec, with the CDI edits over it, written into the bundle: one hand-off to a
    worker thread for both (each costs two thread wake-ups)."""
    spec = build_spec(inputs)
    cdi_edits.apply(spec, cdi)
    _lock_and_write(bundle, spec, lock)
    return spec


def _lock_and_write(bundle: str, spec: dict[str, Any], lock: bool) -> None:
    if lock:
        rovolume.lock_readonly(spec, bundle)
    oci_spec.write_bundle(bundle, spec)


def _log_path(config: pb.ContainerConfig, sb: Sandbox) -> str:
    """The container's log file: relative paths are below the pod's log directory. Its
    directory is made when conmon starts (runtime/conmon.py), not here on the event loop."""
    if not config.log_path:
        return ""
    # Confined under the pod's directory: conmon, as root, appends to this file.
    return fields.join_log_path(sb.config.log_directory, config.log_path)


def pod_info(sb: Sandbox) -> PodInfo:
    meta = sb.config.metadata
    d = sb.sandbox_dir
    opts = sb.config.linux.security_context.namespace_options
    return PodInfo(
        id=sb.id, name=meta.name, namespace=meta.namespace, uid=meta.uid,
        hostname=pod_hostname(sb.config, opts.network == pb.NODE),
        netns_path=sb.netns_path, pause_pid=sb.pid, cgroup_parent=sb.cgroup_parent,
        hosts_path=_existing(os.path.join(d, "hosts")) if d else "",
        resolv_path=_existing(os.path.join(d, "resolv.conf")) if d else "",
        hostname_path=_existing(os.path.join(d, "hostname")) if d else "",
        shm_path=sb.shm_path, sysctls=dict(sb.config.linux.sysctls),
        namespace_options=opts, userns=pod_userns(opts), userns_path=sb.userns_path)


def _host_ids(pod: PodInfo, uid: int, gid: int) -> tuple[int, int]:
    """The host uid/gid of the container's user: the termination log is theirs (0600 in the
    private bundle), as it is written through its bind mount by the container's process."""
    if pod.userns is None:
        return uid, gid
    try:
        return to_host(pod.userns.uids, uid), to_host(pod.userns.gids, gid)
    except ValueError:  # not mapped: the container cannot run as it anyway
        return pod.userns.root_uid, pod.userns.root_gid


def _existing(path: str) -> str:
    return path if os.path.exists(path) else ""
