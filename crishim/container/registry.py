"""The containers crishim knows: records by id, reserved names, and the per-container
locks and exit events that the manager's start/stop/remove and the exit handler share.
"""

from __future__ import annotations

import asyncio
import builtins

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import AlreadyExists, NotFound
from crishim.store.container import Container
from crishim.store.records import by_id_or_prefix


class ContainerRegistry:
    def __init__(self) -> None:
        self._containers: dict[str, Container] = {}
        self._names: dict[str, str] = {}  # reserved name → id
        self._exited: dict[str, asyncio.Event] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # One stop at a time per container: runc freezes the cgroup while it signals
        # `kill --all`, and a second runc kill then fails on the "paused" container.
        self._stop_locks: dict[str, asyncio.Lock] = {}
        self._generation = 0  # bumped whenever a container is added or dropped
        # pod id → its containers: the kubelet asks for a pod's containers (its status,
        # ListContainers by pod) far more often than for all of them.
        self._by_pod: dict[str, dict[str, Container]] = {}

    def find(self, cid: str) -> Container | None:
        """By full id or unique id prefix (as crictl passes short ids)."""
        return by_id_or_prefix(self._containers, cid, "container")

    def get(self, cid: str) -> Container:
        rec = self.find(cid)
        if rec is None:
            raise NotFound(f"container {cid!r} does not exist")
        return rec

    def exact(self, cid: str) -> Container | None:
        return self._containers.get(cid)

    def ids(self) -> set[str]:
        return set(self._containers)

    def all(self) -> builtins.list[Container]:
        return list(self._containers.values())

    def list_version(self) -> tuple[int, int]:
        """Changes whenever a list reply would: a container added or dropped, or any container's
        state (nothing else a list shows ever changes)."""
        return self._generation, Container.state_changes

    def list(self, flt: pb.ContainerFilter | None = None) -> builtins.list[Container]:
        out = []
        candidates = self._containers.values()
        if flt is not None and flt.pod_sandbox_id in self._by_pod:  # a full pod id
            candidates = self._by_pod[flt.pod_sandbox_id].values()
        for c in candidates:
            if flt is not None:
                if flt.id and not c.id.startswith(flt.id):
                    continue
                if flt.HasField("state") and c.state != flt.state.state:
                    continue
                if flt.pod_sandbox_id and not c.pod_id.startswith(flt.pod_sandbox_id):
                    continue
                labels = c.config.labels
                if any(labels.get(k) != v for k, v in flt.label_selector.items()):
                    continue
            out.append(c)
        return sorted(out, key=lambda c: c.created_at)

    def for_pod(self, pod_id: str) -> builtins.list[Container]:
        return list(self._by_pod.get(pod_id, {}).values())

    def pod_statuses(self, pod_id: str) -> builtins.list[pb.ContainerStatus]:
        return [c.status_proto() for c in self.for_pod(pod_id)]

    def reserve(self, name: str, cid: str) -> None:
        """Reserve `name` for `cid`, synchronously (no await between check and claim)."""
        if name in self._names:
            raise AlreadyExists(f"container name {name!r} is already reserved for "
                                f"{self._names[name]}")
        self._names[name] = cid

    def unreserve(self, name: str) -> None:
        self._names.pop(name, None)

    def add(self, rec: Container) -> None:
        self._generation += 1
        self._containers[rec.id] = rec
        self._by_pod.setdefault(rec.pod_id, {})[rec.id] = rec
        self._names[rec.name] = rec.id
        self._exited[rec.id] = asyncio.Event()

    def drop(self, rec: Container) -> None:
        self._generation += 1
        self._containers.pop(rec.id, None)
        pod = self._by_pod.get(rec.pod_id)
        if pod is not None:
            pod.pop(rec.id, None)
            if not pod:
                del self._by_pod[rec.pod_id]
        self._exited.pop(rec.id, None)
        self._names.pop(rec.name, None)

    def exited(self, cid: str) -> asyncio.Event:
        """Set once the container has EXITED: what a stop waits for."""
        return self._exited.setdefault(cid, asyncio.Event())

    def lock(self, cid: str) -> asyncio.Lock:
        """Held by start (while it launches), remove and resource updates."""
        return self._locks.setdefault(cid, asyncio.Lock())

    def stop_lock(self, cid: str) -> asyncio.Lock:
        return self._stop_locks.setdefault(cid, asyncio.Lock())

    def forget_locks(self, cid: str) -> None:
        self._locks.pop(cid, None)
        self._stop_locks.pop(cid, None)

    def clear(self) -> None:
        """Forget every container (tests: a daemon that is gone)."""
        self._generation += 1
        self._containers.clear()
        self._by_pod.clear()
        self._names.clear()
        self._exited.clear()
