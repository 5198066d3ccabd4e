"""The Container record: what crishim remembers about a container (persisted as JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.oci import stopsignal
from crishim.store import records

CREATED = pb.CONTAINER_CREATED
RUNNING = pb.CONTAINER_RUNNING
EXITED = pb.CONTAINER_EXITED
UNKNOWN = pb.CONTAINER_UNKNOWN

# The database kind of container records and intents.
KIND = "container"
MAX_MESSAGE = 4096  # bytes of termination message reported, as the kubelet caps it


@dataclass
class Container(records.StateCounted):
    id: str
    pod_id: str
    name: str  # reserved "<name>_<pod name>_<pod ns>_<pod uid>_<attempt>"
    config: pb.ContainerConfig
    runtime_handler: str
    created_at: int  # ns
    image_name: str  # the image's first repo tag, else what was asked for (as containerd)
    image_id: str  # resolved image id ("sha256:...")
    image_ref: str  # repo digest if the image has one, else its id
    bundle: str
    rootfs: str
    persist_dir: str
    log_path: str = ""  # absolute; "" when the kubelet gave none
    state: pb.ContainerState = CREATED
    pid: int = 0
    conmon_pid: int = 0
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    stop_signal: int = stopsignal.DEFAULT  # the number StopContainer sends first
    uid: int = 0
    gid: int = 0
    gids: list[int] = field(default_factory=list)
    termination_log: str = ""
    cgroups_path: str = ""
    # The parent cgroup's oom_kill counter before `runc start` (-1: none; container/oom.py).
    oom_base: int = -1
    # After the exit: the runc container is deleted and the rootfs unmounted (as a shim
    # does when its task exits), so RemoveContainer only has files left to drop.
    released: bool = False
    # Restored from a checkpoint: CRIU's images, which StartContainer restores instead of
    # starting the command ("" once started, and for every other container).
    restore_from: str = ""
    # The XFS project whose quota caps the writable layer (0: no cap; host/quota.py).
    project_id: int = 0

    @property
    def launched(self) -> bool:
        """conmon and `runc create` ran (at StartContainer; CreateContainer only prepares)."""
        return self.pid > 0

    def image_ids(self) -> set[str]:
        """The images the container uses: its own and those its image volumes were made
        from (resolved at create)."""
        return {self.image_id} | {m.image.image_ref for m in self.config.mounts
                                  if m.HasField("image") and m.image.image
                                  and m.image.image_ref}

    @property
    def metadata(self) -> pb.ContainerMetadata:
        return self.config.metadata

    def to_dict(self) -> dict[str, Any]:
        return records.to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Container:
        return records.from_dict(cls, data, pb.ContainerConfig())

    def image_spec(self, resolved: bool = True) -> pb.ImageSpec:
        """Status shows the resolved name (first repo tag); lists show the request."""
        asked = self.config.image.image
        return pb.ImageSpec(image=self.image_name if resolved else asked,
                            annotations=dict(self.config.image.annotations),
                            user_specified_image=self.config.image.user_specified_image
                            or asked,
                            runtime_handler=self.config.image.runtime_handler)

    def list_proto(self) -> pb.Container:
        return records.listed(self, lambda: pb.Container(
            id=self.id, pod_sandbox_id=self.pod_id, metadata=self.metadata,
            image=self.image_spec(resolved=False), image_ref=self.image_ref,
            image_id=self.image_id, state=self.state, created_at=self.created_at,
            labels=dict(self.config.labels), annotations=dict(self.config.annotations)))

    def list_item(self) -> bytes:
        return records.list_item(self, self.list_proto)

    def status_proto(self) -> pb.ContainerStatus:
        mounts = [pb.Mount(container_path=m.container_path, host_path=m.host_path,
                           readonly=m.readonly, selinux_relabel=m.selinux_relabel,
                           propagation=m.propagation,
                           recursive_read_only=m.recursive_read_only,
                           # image volumes: image_ref is the id resolved at create
                           image=m.image if m.HasField("image") else None,
                           image_sub_path=m.image_sub_path)
                  for m in self.config.mounts]
        return pb.ContainerStatus(
            id=self.id, metadata=self.metadata, state=self.state, created_at=self.created_at,
            started_at=self.started_at, finished_at=self.finished_at,
            exit_code=self.exit_code, image=self.image_spec(), image_ref=self.image_ref,
            image_id=self.image_id, reason=self.reason, message=self.message,
            labels=dict(self.config.labels), annotations=dict(self.config.annotations),
            mounts=mounts, log_path=self.log_path,
            resources=pb.ContainerResources(linux=self.config.linux.resources),
            user=pb.ContainerUser(linux=pb.LinuxContainerUser(
                uid=self.uid, gid=self.gid, supplemental_groups=self.gids)),
            stop_signal=stopsignal.reported(self.config, self.stop_signal))


def reserved_name(meta: pb.ContainerMetadata, pod: pb.PodSandboxMetadata) -> str:
    return f"{meta.name}_{pod.name}_{pod.namespace}_{pod.uid}_{meta.attempt}"
