"""ListContainers / ListPodSandbox replies serialized once per change, not once per call.

The kubelet's PLEG relists every second and a node's pods change far less often; building
and serializing a reply of hundreds of items was most of those calls' cost. A reply is the
records' serialized items joined (each cached on its record until its state changes, see
store/records.py), so a change re-serializes one item. A reply for no filter, or a state
filter alone, is kept as bytes by the request's serialized form, with the registry's list
version it was joined at, and sent as is (cri/handlers.py lets a reply be bytes). Filters
by id, pod or labels select a few items out of many: those are joined per call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from google.protobuf.message import Message

MAX_KEPT = 16  # a kubelet sends two or three kinds of list request

R = TypeVar("R", bound=Message)


class ListReplyCache:
    def __init__(self) -> None:
        # serialized request → (registry list version, serialized reply)
        self._replies: dict[bytes, tuple[Hashable, bytes]] = {}

    def get(self, request: bytes, version: Hashable) -> bytes | None:
        """The reply kept for `request`, if joined at `version`."""
        kept = self._replies.get(request)
        return kept[1] if kept is not None and kept[0] == version else None

    def keep(self, request: bytes, version: Hashable, reply: bytes) -> None:
        if len(self._replies) >= MAX_KEPT and request not in self._replies:
            self._replies.clear()
        self._replies[request] = (version, reply)

    def reply(self, raw: bytes, version: Hashable, request: R | None,
              parse: Callable[[bytes], R], join: Callable[[R], tuple[bytes, bool]]) -> bytes:
        """The reply to the serialized request `raw`: the one kept for it at `version`,
        else `join`'s for the request (parsed from `raw` unless given), kept when `join`
        says so (not for a filter that picks a few items out of many)."""
        reply = self.get(raw, version)
        if reply is None:
            reply, keep = join(parse(raw) if request is None else request)
            if keep:
                self.keep(raw, version, reply)
        return reply
