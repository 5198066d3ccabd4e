"""Container lifecycle events as the kubelet's evented PLEG reads them."""

from __future__ import annotations

import time

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.registry import ContainerRegistry
from crishim.observe.events import EventBus
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.container import Container


class ContainerEvents:
    def __init__(self, bus: EventBus, pods: SandboxRegistry,
                 containers: ContainerRegistry) -> None:
        self.bus = bus
        self.pods = pods
        self.containers = containers

    def publish(self, rec: Container, kind: pb.ContainerEventType) -> None:
        """Like containerd: the pod's status and the statuses of all of its containers
        (a DELETED container is gone from the registry already: the others remain).
        Built only for a listener: a kubelet without evented PLEG never subscribes."""
        if not self.bus.subscriber_count:
            return
        sb = self.pods.exact(rec.pod_id)
        self.bus.publish(pb.ContainerEventResponse(
            container_id=rec.id, container_event_type=kind, created_at=time.time_ns(),
            pod_sandbox_status=sb.status_proto() if sb is not None else None,
            containers_statuses=self.containers.pod_statuses(rec.pod_id)))
