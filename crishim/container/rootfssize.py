"""The writable-layer cap a container asks for: the pod annotation
`io.crishim.container-rootfs-size` (every container of the pod) or
`io.crishim.container-rootfs-size/<container name>` (one container), within
`[storage] container_rootfs_size_max`; else `[storage] container_rootfs_size`; else none.
A cap that cannot be enforced is refused at CreateContainer; one that can is an XFS project
quota on the container's bundle dir (host/quota.py), its id in the create intent and the
record, cleared on removal, on a create's rollback and, for what a crash left, at start."""

from __future__ import annotations

from collections.abc import Mapping

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import StorageConfig, parse_size
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.quota import WritableLayerQuotas

ANNOTATION = "io.crishim.container-rootfs-size"


def requested(name: str, pod_annotations: Mapping[str, str], storage: StorageConfig
              ) -> tuple[int, str] | None:
    """(bytes, who asked) of the cap for container `name`, or None for no cap."""
    for key in (f"{ANNOTATION}/{name}", ANNOTATION):
        text = pod_annotations.get(key)
        if text is None:
            continue
        size = parse_size(text)
        if size is None:
            raise InvalidArgument(f"pod annotation {key}={text!r} is not a size (bytes, or "
                                  "a number with Ki/Mi/Gi/Ti or k/M/G/T, e.g. 10Gi)")
        if not storage.container_rootfs_size_max:
            raise FailedPrecondition(f"pod annotation {key} asks for a writable-layer cap, "
                                     "but this node lets no pod choose one ([storage] "
                                     "container_rootfs_size_max is not set)")
        most = parse_size(storage.container_rootfs_size_max) or 0
        if size > most:
            raise InvalidArgument(f"pod annotation {key}={text} is above this node's "
                                  "maximum, [storage] container_rootfs_size_max = "
                                  f"{storage.container_rootfs_size_max}")
        return size, f"pod annotation {key}"
    if storage.container_rootfs_size:
        size = parse_size(storage.container_rootfs_size) or 0
        return size, "[storage] container_rootfs_size"
    return None


class RootfsSizes:
    def __init__(self, storage: StorageConfig, quotas: WritableLayerQuotas) -> None:
        self.storage = storage
        self.quotas = quotas

    async def check(self, config: pb.ContainerConfig, pod: pb.PodSandboxConfig) -> int:
        """The cap in bytes of this container (0: none); refused where it cannot be
        enforced on this node."""
        want = requested(config.metadata.name, pod.annotations, self.storage)
        if want is None:
            return 0
        await self.quotas.check(*want)
        return want[0]

    def allocate(self, size: int) -> int:
        """The project id for a container capped at `size` (0: no cap, no id)."""
        return self.quotas.allocate() if size else 0

    async def apply(self, bundle: str, project_id: int, size: int) -> None:
        if project_id:
            await self.quotas.apply(bundle, project_id, size)

    async def free(self, project_id: int) -> None:
        await self.quotas.free(project_id)

    async def recover(self, owned: list[int]) -> None:
        """At start: clear the quotas no record owns, where caps are configured or a record
        has one (a node that never caps does not probe)."""
        if any(owned) or self.storage.container_rootfs_size or \
                self.storage.container_rootfs_size_max:
            await self.quotas.sweep(i for i in owned if i)
