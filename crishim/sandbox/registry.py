"""The pods crishim knows (store/registry.py), and the per-pod lock both managers hold.

One object that both managers get at construction: the sandbox manager adds and drops
pods, the container manager looks them up and holds a pod's lock around CreateContainer
and StartContainer. Neither manager needs the other to look up a pod.
"""

from __future__ import annotations

import asyncio

from crishim.store.registry import Registry
from crishim.store.sandbox import Sandbox


class SandboxRegistry(Registry[Sandbox]):
    def __init__(self) -> None:
        super().__init__("pod sandbox", Sandbox)

    def pod_lock(self, sid: str) -> asyncio.Lock:
        """The per-pod lock that run/stop/remove hold (not re-entrant). The container
        manager holds it around CreateContainer/StartContainer, so those never interleave
        with a StopPodSandbox; the pod's container stop/remove steps run with it held, so
        they must not take it."""
        return self.lock(sid)
