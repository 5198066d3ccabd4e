"""runtime.v1.RuntimeService: composed from one mixin per RPC family."""

from __future__ import annotations

from crishim.cri.base import ServicerBase
from crishim.cri.container import ContainerRPCs
from crishim.cri.events import EventRPCs
from crishim.cri.listreply import ListReplyCache
from crishim.cri.lists import StreamListRPCs
from crishim.cri.resources import ResourceRPCs
from crishim.cri.sandbox import SandboxRPCs
from crishim.cri.stats import StatsRPCs
from crishim.cri.status import StatusRPCs
from crishim.cri.streaming import StreamingRPCs
from crishim.daemon import Daemon
from crishim.rpc.connection import Answer


class RuntimeService(StatusRPCs, EventRPCs, SandboxRPCs, ContainerRPCs, StatsRPCs,
                     ResourceRPCs, StreamListRPCs, StreamingRPCs, ServicerBase):
    SERVICE = "RuntimeService"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.container_list = ListReplyCache()
        self.sandbox_list = ListReplyCache()

    def answers(self) -> dict[str, Answer]:
        # The kubelet's PLEG relists every second, its pod workers read statuses, and
        # Version is its liveness check.
        return {"Version": self.answer_version,
                "ListPodSandbox": self.answer_list_pod_sandbox,
                "ListContainers": self.answer_list_containers,
                "PodSandboxStatus": self.answer_pod_sandbox_status,
                "ContainerStatus": self.answer_container_status}
