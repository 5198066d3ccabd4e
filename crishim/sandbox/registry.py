"""The pods crishim knows: records by id, reserved names and the per-pod locks.

One object that both managers get at construction: the sandbox manager adds and drops
pods, the container manager looks them up and holds a pod's lock around CreateContainer
and StartContainer. Neither manager needs the other to look up a pod.
"""

from __future__ import annotations

import asyncio
import builtins

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import AlreadyExists, NotFound
from crishim.store.records import by_id_or_prefix
from crishim.store.sandbox import Sandbox


class SandboxRegistry:
    def __init__(self) -> None:
        self._sandboxes: dict[str, Sandbox] = {}
        self._names: dict[str, str] = {}  # reserved name -> sandbox id
        self._locks: dict[str, asyncio.Lock] = {}
        self._generation = 0  # bumped whenever a pod is added or dropped

    def find(self, sid: str) -> Sandbox | None:
        """Exact id or a unique id prefix; None when none matches."""
        return by_id_or_prefix(self._sandboxes, sid, "pod sandbox")

    def get(self, sid: str) -> Sandbox:
        """Exact id or a unique id prefix; NotFound otherwise."""
        sb = self.find(sid)
        if sb is None:
            raise NotFound(f"pod sandbox {sid!r} not found")
        return sb

    def exact(self, sid: str) -> Sandbox | None:
        return self._sandboxes.get(sid)

    def ids(self) -> set[str]:
        return set(self._sandboxes)

    def all(self) -> builtins.list[Sandbox]:
        return list(self._sandboxes.values())

    def list_version(self) -> tuple[int, int]:
        """Changes whenever a list reply would: a pod added or dropped, or any pod's
        state (nothing else a list shows ever changes)."""
        return self._generation, Sandbox.state_changes

    def list(self, flt: pb.PodSandboxFilter | None = None) -> builtins.list[Sandbox]:
        items = self.all()
        if flt is not None:
            if flt.id:
                items = [s for s in items if s.id.startswith(flt.id)]
            if flt.HasField("state"):
                items = [s for s in items if s.state == flt.state.state]
            for key, value in flt.label_selector.items():
                items = [s for s in items if s.config.labels.get(key) == value]
        return sorted(items, key=lambda s: s.created_at)

    def pod_lock(self, sid: str) -> asyncio.Lock:
        """The per-pod lock that run/stop/remove hold (not re-entrant). The container
        manager holds it around CreateContainer/StartContainer, so those never interleave
        with a StopPodSandbox; the pod's container stop/remove steps run with it held, so
        they must not take it."""
        return self._locks.setdefault(sid, asyncio.Lock())

    def reserve(self, name: str, sid: str) -> None:
        """Reserve `name` for `sid`, synchronously (no await between check and claim)."""
        existing = self._names.get(name)
        if existing is not None:
            raise AlreadyExists(f"pod sandbox name {name!r} is reserved for sandbox "
                                f"{existing}; remove it first or use another attempt")
        self._names[name] = sid

    def unreserve(self, name: str, sid: str) -> None:
        """Free `name` when `sid` holds it and never became a pod (a failed run)."""
        if self._names.get(name) == sid and sid not in self._sandboxes:
            del self._names[name]

    def add(self, sb: Sandbox) -> None:
        self._generation += 1
        self._sandboxes[sb.id] = sb
        self._names[sb.name] = sb.id

    def drop(self, sb: Sandbox) -> None:
        self._generation += 1
        self._sandboxes.pop(sb.id, None)
        if self._names.get(sb.name) == sb.id:
            del self._names[sb.name]

    def forget_lock(self, sid: str) -> None:
        self._locks.pop(sid, None)

    def clear(self) -> None:
        """Forget every pod (tests: a daemon that is gone)."""
        self._generation += 1
        self._sandboxes.clear()
        self._names.clear()
