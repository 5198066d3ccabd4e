"""ListContainers / ListPodSandbox replies serialized once per change, not once per call.

The kubelet's PLEG relists every second and a node's pods change far less often; building
and serializing a reply of hundreds of items was most of those calls' cost. A reply is the
records' serialized items joined (each cached on its record until its state changes, see
store/records.py), so a change re-serializes one item. A reply for no filter, or a state
filter alone, is kept as bytes with the registry's list version it was joined at, and
sent as is (cri/handlers.py lets a handler return bytes). Filters by id, pod or labels
select a few items out of many: those are joined per call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from google.protobuf.message import Message


class ListReplyCache:
    def __init__(self) -> None:
        # filter's serialized form → (registry list version, serialized reply)
        self._replies: dict[bytes, tuple[Hashable, bytes]] = {}

    def reply(self, flt: Message | None, version: Hashable,
              build: Callable[[], bytes]) -> bytes:
        """`build()` (a serialized reply), reused while `version` is unchanged for this
        filter."""
        key = b"" if flt is None else flt.SerializeToString(deterministic=True)
        cached = self._replies.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        data = build()
        self._replies[key] = (version, data)
        return data
