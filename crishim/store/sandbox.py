"""The Sandbox record: what crishim remembers about a pod sandbox (persisted as JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.store import records

READY = pb.SANDBOX_READY
NOTREADY = pb.SANDBOX_NOTREADY
# The database kind of sandbox records and intents.
KIND = "sandbox"


@dataclass
class Sandbox(records.StateCounted):
    id: str
    name: str  # the reserved "<name>_<namespace>_<uid>_<attempt>"
    config: pb.PodSandboxConfig
    runtime_handler: str  # resolved handler name (never "")
    created_at: int  # ns
    state: pb.PodSandboxState = NOTREADY
    netns_path: str = ""  # "" for host-network pods
    # The pinned user namespace of a pod with userns_options mode POD ("" otherwise); its
    # netns is owned by it.
    userns_path: str = ""
    ips: list[str] = field(default_factory=list)
    pid: int = 0  # pause pid
    cgroup_parent: str = ""
    cgroups_path: str = ""
    # systemd driver: the parent's slices that did not exist at RunPodSandbox, deepest
    # first; RemovePodSandbox stops them (sandbox/slices.py).
    made_slices: list[str] = field(default_factory=list)
    sandbox_dir: str = ""
    bundle: str = ""
    shm_path: str = ""  # our tmpfs mount, "" when IPC is NODE
    cni_result: dict[str, Any] = field(default_factory=dict)
    # Set once the pod's network was torn down and its pause stopped (StopPodSandbox).
    stopped: bool = False
    # Set with `stopped` once StopPodSandbox took the pod's mounts off (shm, a pause-image
    # rootfs): RemovePodSandbox then has none to detach. A stored record without the
    # field reads False, and its removal detaches them.
    mounts_released: bool = False

    # --- convenience views on the config ---
    @property
    def metadata(self) -> pb.PodSandboxMetadata:
        return self.config.metadata

    @property
    def namespace_options(self) -> pb.NamespaceOption:
        return self.config.linux.security_context.namespace_options

    @property
    def host_network(self) -> bool:
        return self.namespace_options.network == pb.NODE

    def to_dict(self) -> dict[str, Any]:
        return records.to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sandbox:
        return records.from_dict(cls, data, pb.PodSandboxConfig())

    def status_proto(self) -> pb.PodSandboxStatus:
        ns = self.namespace_options
        network = pb.PodSandboxNetworkStatus()
        if self.ips:
            network.ip = self.ips[0]
            network.additional_ips.extend(pb.PodIP(ip=ip) for ip in self.ips[1:])
        # A pod without a user namespace of its own is in the host's (mode 0 is POD).
        userns = ns.userns_options if self.userns_path else pb.UserNamespace(mode=pb.NODE)
        return pb.PodSandboxStatus(
            id=self.id, metadata=self.metadata, state=self.state, created_at=self.created_at,
            network=network,
            linux=pb.LinuxPodSandboxStatus(namespaces=pb.Namespace(options=pb.NamespaceOption(
                network=ns.network, pid=ns.pid, ipc=ns.ipc, target_id=ns.target_id,
                userns_options=userns))),
            labels=dict(self.config.labels), annotations=dict(self.config.annotations),
            runtime_handler=self.runtime_handler)

    def list_proto(self) -> pb.PodSandbox:
        return records.listed(self, lambda: pb.PodSandbox(
            id=self.id, metadata=self.metadata, state=self.state, created_at=self.created_at,
            labels=dict(self.config.labels), annotations=dict(self.config.annotations),
            runtime_handler=self.runtime_handler))

    def list_item(self) -> bytes:
        return records.list_item(self, self.list_proto)


def reserved_name(meta: pb.PodSandboxMetadata) -> str:
    """The kubelet-style unique name of a sandbox attempt."""
    return f"{meta.name}_{meta.namespace}_{meta.uid}_{meta.attempt}"
