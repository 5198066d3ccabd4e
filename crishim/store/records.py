"""What the container and sandbox records have in common: their JSON form (dataclass fields
plus the CRI config as base64 protobuf), a per-state cache of their list message and its
serialized list item, and lookup by id or id prefix."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields
from typing import Any, ClassVar, TypeVar

from google.protobuf.message import Message

from crishim.errors import NotFound

R = TypeVar("R")
M = TypeVar("M", bound=Message)
V = TypeVar("V")


class StateCounted:
    """A record whose `state` assignments are counted, per record class: a list reply
    built at one count stays current while the count holds, with no need to read every
    record's state: with a hundred pods or more, reading every scattered record would be
    most of a list call's cost."""

    state_changes: ClassVar[int] = 0

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "state":
            type(self).state_changes += 1
        object.__setattr__(self, name, value)


def to_dict(rec: Any) -> dict[str, Any]:
    """A record's fields as JSON-able values; `config` (a protobuf) as base64."""
    data = asdict(rec)
    data["config"] = base64.b64encode(rec.config.SerializeToString()).decode()
    return data


def from_dict(cls: Callable[..., R], data: dict[str, Any], config: Message) -> R:
    """The record `cls` from `to_dict` output; `config` is an empty message of the config
    type to parse into. Keys the class does not have (written by another version of
    crishim) are dropped."""
    values = dict(data)
    config.ParseFromString(base64.b64decode(values.pop("config")))
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(config=config, **{k: v for k, v in values.items() if k in known})


def listed(rec: Any, build: Callable[[], M]) -> M:
    """`build()`, cached on `rec` until its state changes: nothing else in a list message
    changes, and the kubelet relists every second (building the label/annotation maps is
    most of the cost)."""
    return _per_state(rec, "_listed", build)


def _per_state(rec: Any, key: str, build: Callable[[], V]) -> V:
    """`build()`, kept in `rec.__dict__[key]` with the state it was built in. Not a
    dataclass field, so never persisted."""
    cached: tuple[int, V] | None = rec.__dict__.get(key)
    if cached is not None and cached[0] == rec.state:
        return cached[1]
    value = build()
    rec.__dict__[key] = (rec.state, value)
    return value


# Field 1, length-delimited: ListContainersResponse.containers and
# ListPodSandboxResponse.items alike.
_ITEM_TAG = b"\x0a"


def list_item(rec: Any, message: Callable[[], Message]) -> bytes:
    """`message()` (the record's list message) serialized as one item of a list reply,
    cached like `listed`: a reply is then the items joined, and a state change while pods
    start re-serializes one item, not the whole list."""
    def item() -> bytes:
        data = message().SerializeToString()
        return _ITEM_TAG + _varint(len(data)) + data

    return _per_state(rec, "_list_item", item)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def by_id_or_prefix(records: Mapping[str, R], ref: str, kind: str) -> R | None:
    """The record whose id is `ref`, else the one whose id starts with it (crictl passes
    short ids); None when none does. A prefix several ids start with is NotFound naming
    the ambiguity, as CRI-O answers (containerd's error carries no code), for containers
    and pods alike: never a guess, and never a silent no-op for an idempotent stop."""
    rec = records.get(ref)
    if rec is not None or not ref:
        return rec
    matches = [r for rid, r in records.items() if rid.startswith(ref)]
    if len(matches) > 1:
        raise NotFound(f"{kind} id prefix {ref!r} is ambiguous: {len(matches)} ids start "
                       "with it; give more of the id")
    return matches[0] if matches else None
