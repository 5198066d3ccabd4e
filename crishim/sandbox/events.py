"""A pod's lifecycle events as the kubelet's evented PLEG reads them: the pause's
CREATED/STARTED/STOPPED/DELETED, each with the pod's status and its containers'."""

from __future__ import annotations

import time
from typing import Protocol

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.observe.events import EventBus
from crishim.store.sandbox import Sandbox


class PodStatuses(Protocol):
    """The statuses of a pod's containers (the container manager's)."""

    def pod_statuses(self, pod_id: str) -> list[pb.ContainerStatus]: ...


class SandboxEvents:
    def __init__(self, bus: EventBus, containers: PodStatuses) -> None:
        self.bus = bus
        self.containers = containers

    def publish(self, sb: Sandbox, kind: pb.ContainerEventType) -> None:
        """Like containerd: the pod's status and the statuses of all of its containers.
        Built only for a listener: a kubelet without evented PLEG never subscribes."""
        if not self.bus.subscriber_count:
            return
        self.bus.publish(pb.ContainerEventResponse(
            container_id=sb.id, container_event_type=kind, created_at=time.time_ns(),
            pod_sandbox_status=sb.status_proto(),
            containers_statuses=self.containers.pod_statuses(sb.id)))
