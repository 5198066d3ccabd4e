"""Collector targets from container and pod records: the cgroups, writable layer and pod
network a record's stats are read from."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host.fsusage import mountpoint
from crishim.image.rootfs import upper_dir
from crishim.stats.collector import ContainerTarget, PodTarget
from crishim.store.container import RUNNING, Container
from crishim.store.sandbox import READY, Sandbox

_RESOURCE_FIELDS = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes",
                    "memory_swap_limit_in_bytes")


def resources_dict(res: pb.LinuxContainerResources) -> Mapping[str, int]:
    return {f: getattr(res, f) for f in _RESOURCE_FIELDS}


@functools.lru_cache(maxsize=8)
def _fs_mountpoint(containers_dir: str) -> str:
    """The filesystem the writable layers live on, named as ImageFsInfo names it, so the
    kubelet can match writable_layer.fs_id to a container filesystem."""
    return mountpoint(containers_dir) if os.path.exists(containers_dir) else containers_dir


def container_target(c: Container, containers_dir: str, quota_device: str = ""
                     ) -> ContainerTarget:
    """`containers_dir`: where the container manager keeps the bundles; `quota_device`:
    the device of their filesystem where writable layers are capped by project quotas."""
    return ContainerTarget(
        id=c.id, pod_id=c.pod_id, metadata=c.metadata, labels=c.config.labels,
        annotations=c.config.annotations, image=c.image_name,
        cgroups_path=c.cgroups_path if c.state == RUNNING else "",
        writable_dir=upper_dir(c.bundle) if c.bundle else "",
        fs_mountpoint=_fs_mountpoint(containers_dir),
        project_id=c.project_id, quota_device=quota_device if c.project_id else "",
        resources=resources_dict(c.config.linux.resources), started_at_ns=c.started_at)


def pod_target(sb: Sandbox, containers: Iterable[Container], containers_dir: str,
               quota_device: str = "") -> PodTarget:
    """The pod and those of `containers` that run in it."""
    ready = sb.state == READY
    return PodTarget(
        id=sb.id, metadata=sb.metadata, labels=sb.config.labels,
        annotations=sb.config.annotations,
        cgroup_parent=sb.cgroup_parent if ready else "",
        pause_cgroups_path=sb.cgroups_path if ready else "",
        # A stopped pod's pause pid may already belong to another process.
        pause_pid=sb.pid if ready else 0, host_network=sb.host_network,
        containers=[container_target(c, containers_dir, quota_device) for c in containers
                    if c.pod_id == sb.id and c.state == RUNNING],
        created_at_ns=sb.created_at)
