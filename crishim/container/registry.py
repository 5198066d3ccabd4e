"""The containers crishim knows (store/registry.py), with what only containers have: the
index by pod, the exit events a stop waits for, and a second lock that serializes stops
(the record's own `lock` is held by start while it launches, remove and resource updates).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Iterable

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.store.container import Container
from crishim.store.registry import Filter, Registry


def pod_of(c: Container) -> str:
    """The pod a container record belongs to (for `select`)."""
    return c.pod_id


class ContainerRegistry(Registry[Container]):
    def __init__(self) -> None:
        super().__init__("container", Container, pod_of)
        self._exited: dict[str, asyncio.Event] = {}
        # One stop at a time per container: runc freezes the cgroup while it signals
        # `kill --all`, and a second runc kill then fails on the "paused" container.
        self._stop_locks: dict[str, asyncio.Lock] = {}
        # pod id → its containers: the kubelet asks for a pod's containers (its status,
        # ListContainers by pod) far more often than for all of them.
        self._by_pod: dict[str, dict[str, Container]] = {}

    def _candidates(self, flt: Filter | None) -> Iterable[Container]:
        if isinstance(flt, pb.ContainerFilter) and flt.pod_sandbox_id in self._by_pod:
            return self._by_pod[flt.pod_sandbox_id].values()  # a full pod id
        return super()._candidates(flt)

    def for_pod(self, pod_id: str) -> builtins.list[Container]:
        return list(self._by_pod.get(pod_id, {}).values())

    def pod_statuses(self, pod_id: str) -> builtins.list[pb.ContainerStatus]:
        return [c.status_proto() for c in self.for_pod(pod_id)]

    def add(self, rec: Container) -> None:
        super().add(rec)
        self._by_pod.setdefault(rec.pod_id, {})[rec.id] = rec
        self._exited[rec.id] = asyncio.Event()

    def drop(self, rec: Container) -> None:
        super().drop(rec)
        pod = self._by_pod.get(rec.pod_id)
        if pod is not None:
            pod.pop(rec.id, None)
            if not pod:
                del self._by_pod[rec.pod_id]
        self._exited.pop(rec.id, None)

    def exited(self, cid: str) -> asyncio.Event:
        """Set once the container has EXITED: what a stop waits for."""
        return self._exited.setdefault(cid, asyncio.Event())

    def stop_lock(self, cid: str) -> asyncio.Lock:
        return self._stop_locks.setdefault(cid, asyncio.Lock())

    def forget_locks(self, cid: str) -> None:
        super().forget_locks(cid)
        self._stop_locks.pop(cid, None)

    def clear(self) -> None:
        super().clear()
        self._by_pod.clear()
        self._exited.clear()
