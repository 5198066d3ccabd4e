"""runtime.v1.RuntimeService: composed from one mixin per RPC family."""

from __future__ import annotations

import platform

from crishim import __version__
from crishim.cri.base import ServicerBase
from crishim.cri.checkpoint import CheckpointRPCs
from crishim.cri.container import ContainerRPCs
from crishim.cri.events import EventRPCs
from crishim.cri.listreply import ListReplyCache
from crishim.cri.resources import ResourceRPCs
from crishim.cri.sandbox import SandboxRPCs
from crishim.cri.stats import StatsRPCs
from crishim.cri.status import StatusRPCs
from crishim.cri.streaming import StreamingRPCs
from crishim.cri.streamlists import StreamListRPCs
from crishim.log import get_logger
from crishim.node.daemon import Daemon
from crishim.rpc.method import Answer

log = get_logger(__name__)


class RuntimeService(StatusRPCs, EventRPCs, SandboxRPCs, ContainerRPCs, StatsRPCs,
                     ResourceRPCs, StreamListRPCs, StreamingRPCs, CheckpointRPCs,
                     ServicerBase):
    SERVICE = "RuntimeService"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.container_list = ListReplyCache()
        self.sandbox_list = ListReplyCache()
        host = daemon.host
        # Once, as the service is made: what a report about this node needs first.
        log.info("crishim runtime service", version=__version__, cri_api="v1",
                 kernel=platform.release(), arch=platform.machine(),
                 python=platform.python_version(), cgroup_version=host.cgroups.version,
                 cgroup_driver=host.cgroup_driver, controllers=sorted(host.cgroups.controllers),
                 cpus=len(host.topology.cpus), handlers=[r.name for r in daemon.runtimes.all()])

    def answers(self) -> dict[str, Answer]:
        # The kubelet's PLEG relists every second, its pod workers read statuses, and
        # Version is its liveness check.
        return {"Version": self.answer_version,
                "ListPodSandbox": self.answer_list_pod_sandbox,
                "ListContainers": self.answer_list_containers,
                "PodSandboxStatus": self.answer_pod_sandbox_status,
                "ContainerStatus": self.answer_container_status}
