"""The records crishim keeps in memory, pods and containers alike: by id or unique id
prefix, reserved names, one lock per record, and the list a CRI filter selects.

`select` is the one filter for pod and container records, for the list RPCs and the stats
RPCs alike: id prefix, state, every label of the selector, pod id prefix.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, Protocol, TypeVar

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import AlreadyExists, NotFound
from crishim.store.records import StateCounted, by_id_or_prefix


class _Labelled(Protocol):
    @property
    def labels(self) -> Mapping[str, str]: ...


class Record(Protocol):
    """What a registry and a filter read of a record (store/sandbox.py, store/container.py)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def state(self) -> int: ...
    @property
    def created_at(self) -> int: ...
    @property
    def config(self) -> _Labelled: ...


R = TypeVar("R", bound=Record)

# The CRI filters of pods and containers, for lists and for stats.
Filter = (pb.PodSandboxFilter | pb.ContainerFilter | pb.PodSandboxStatsFilter
          | pb.ContainerStatsFilter)


def own_id(rec: Record) -> str:
    """The pod a pod record belongs to: itself."""
    return rec.id


def select(records: Iterable[R], flt: Filter | None,
           pod_of: Callable[[R], str] = own_id) -> builtins.list[R]:
    """The `records` that `flt` admits, in their order: its id prefix, state, every label
    of its selector and, in a container filter, its pod id prefix (`pod_of` names a
    record's pod)."""
    if flt is None:
        return list(records)
    rid = flt.id
    state: int | None = None
    if isinstance(flt, pb.PodSandboxFilter | pb.ContainerFilter) and flt.HasField("state"):
        state = flt.state.state
    pod = flt.pod_sandbox_id if isinstance(flt, pb.ContainerFilter | pb.ContainerStatsFilter) \
        else ""
    selector = tuple(flt.label_selector.items())
    out = []
    for rec in records:
        if rid and not rec.id.startswith(rid):
            continue
        if state is not None and rec.state != state:
            continue
        if pod and not pod_of(rec).startswith(pod):
            continue
        if selector:
            labels = rec.config.labels
            if any(labels.get(k) != v for k, v in selector):
                continue
        out.append(rec)
    return out


class Registry(Generic[R]):
    """`kind` names the records in errors ("container", "pod sandbox"); `counted` is their
    class, whose count of state assignments is part of the list version."""

    def __init__(self, kind: str, counted: type[StateCounted],
                 pod_of: Callable[[R], str] = own_id) -> None:
        self.kind = kind
        self._counted = counted
        self._pod_of = pod_of
        self._records: dict[str, R] = {}
        self._names: dict[str, str] = {}  # reserved name → id
        self._locks: dict[str, asyncio.Lock] = {}
        self._generation = 0  # bumped whenever a record is added or dropped

    def find(self, ref: str) -> R | None:
        """By full id or unique id prefix (as crictl passes short ids); None when none
        matches."""
        return by_id_or_prefix(self._records, ref, self.kind)

    def get(self, ref: str) -> R:
        """As `find`; NotFound when none matches."""
        rec = self.find(ref)
        if rec is None:
            raise NotFound(f"{self.kind} {ref!r} does not exist")
        return rec

    def exact(self, rid: str) -> R | None:
        return self._records.get(rid)

    def ids(self) -> set[str]:
        return set(self._records)

    def all(self) -> builtins.list[R]:
        return list(self._records.values())

    def list_version(self) -> tuple[int, int]:
        """Changes whenever a list reply would: a record added or dropped, or any record's
        state (nothing else a list shows ever changes)."""
        return self._generation, self._counted.state_changes

    def list(self, flt: Filter | None = None) -> builtins.list[R]:
        """The records `flt` admits, oldest first."""
        return sorted(select(self._candidates(flt), flt, self._pod_of),
                      key=lambda r: r.created_at)

    def _candidates(self, flt: Filter | None) -> Iterable[R]:
        """The records `flt` may admit (a subclass with an index narrows them)."""
        return self._records.values()

    def reserve(self, name: str, rid: str) -> None:
        """Reserve `name` for `rid`, synchronously (no await between check and claim)."""
        existing = self._names.get(name)
        if existing is not None:
            raise AlreadyExists(f"{self.kind} name {name!r} is reserved for {existing}; "
                                "remove it first or use another attempt")
        self._names[name] = rid

    def unreserve(self, name: str, rid: str) -> None:
        """Free `name` when `rid` holds it and never became a record (a failed create)."""
        if self._names.get(name) == rid and rid not in self._records:
            del self._names[name]

    def add(self, rec: R) -> None:
        self._generation += 1
        self._records[rec.id] = rec
        self._names[rec.name] = rec.id

    def drop(self, rec: R) -> None:
        self._generation += 1
        self._records.pop(rec.id, None)
        if self._names.get(rec.name) == rec.id:
            del self._names[rec.name]

    def lock(self, rid: str) -> asyncio.Lock:
        return self._locks.setdefault(rid, asyncio.Lock())

    def forget_locks(self, rid: str) -> None:
        self._locks.pop(rid, None)

    def clear(self) -> None:
        """Forget every record (tests: a daemon that is gone)."""
        self._generation += 1
        self._records.clear()
        self._names.clear()
