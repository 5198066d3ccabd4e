"""What the pod and container managers tell NRI at each step, behind one object.

`NRIHooks` is the null object: every call does nothing (NRI off, and no default
validator). `LiveNRI` passes each call to the adaptation while it is active (a plugin
connected or the default validator on); plugins connect and go at any time, so that is
asked at each call, here and nowhere else. node/ builds the one the config asks for
and hands it to both managers.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.nri.adaptation import NRI
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox

# What CreateContainer hands the spec to before it is written (None: nothing to adjust).
Adjuster = Callable[[Container, dict[str, Any]], Awaitable[None]]


class NRIHooks:
    """The null object: NRI is off, every call does nothing."""

    async def run_pod_sandbox(self, sb: Sandbox) -> None:
        """A plugin's refusal fails the run."""

    async def update_pod_sandbox(self, sb: Sandbox, resources: pb.LinuxContainerResources,
                                 overhead: pb.LinuxContainerResources) -> None:
        pass

    async def post_update_pod_sandbox(self, sb: Sandbox) -> None:
        pass

    async def stop_pod_sandbox(self, sb: Sandbox) -> None:
        pass

    async def remove_pod_sandbox(self, sb: Sandbox) -> None:
        pass

    def adjuster(self, sb: Sandbox) -> Adjuster | None:
        """What adjusts a new container's spec in `sb`, or None."""
        return None

    async def post_create_container(self, sb: Sandbox, ctr: Container) -> None:
        pass

    async def start_container(self, sb: Sandbox, ctr: Container) -> None:
        """A plugin's refusal (FailedPrecondition) fails the start."""

    async def post_start_container(self, sb: Sandbox, ctr: Container,
                                   exited: asyncio.Event) -> None:
        """Also watches for the container's own exit (`exited`), told as a stop."""

    async def update_container(self, sb: Sandbox, ctr: Container,
                               requested: pb.LinuxContainerResources,
                               resources: dict[str, Any]
                               ) -> tuple[pb.LinuxContainerResources, dict[str, Any]]:
        return requested, resources

    async def post_update_container(self, sb: Sandbox, ctr: Container) -> None:
        pass

    async def stop_container(self, sb: Sandbox, ctr: Container) -> None:
        pass

    async def remove_container(self, sb: Sandbox, ctr: Container) -> None:
        pass


NO_NRI = NRIHooks()


class LiveNRI(NRIHooks):
    """Each call goes to the NRI adaptation while it is active."""

    def __init__(self, nri: NRI) -> None:
        self._nri = nri

    def _on(self) -> NRI | None:
        return self._nri if self._nri.active else None

    async def run_pod_sandbox(self, sb: Sandbox) -> None:
        if nri := self._on():
            await nri.run_pod_sandbox(sb)

    async def update_pod_sandbox(self, sb: Sandbox, resources: pb.LinuxContainerResources,
                                 overhead: pb.LinuxContainerResources) -> None:
        if nri := self._on():
            await nri.update_pod_sandbox(sb, resources, overhead)

    async def post_update_pod_sandbox(self, sb: Sandbox) -> None:
        if nri := self._on():
            await nri.post_update_pod_sandbox(sb)

    async def stop_pod_sandbox(self, sb: Sandbox) -> None:
        if nri := self._on():
            await nri.stop_pod_sandbox(sb)

    async def remove_pod_sandbox(self, sb: Sandbox) -> None:
        if nri := self._on():
            await nri.remove_pod_sandbox(sb)

    def adjuster(self, sb: Sandbox) -> Adjuster | None:
        if nri := self._on():
            return functools.partial(nri.create_container, sb)
        return None

    async def post_create_container(self, sb: Sandbox, ctr: Container) -> None:
        if nri := self._on():
            await nri.post_create_container(sb, ctr)

    async def start_container(self, sb: Sandbox, ctr: Container) -> None:
        if nri := self._on():
            await nri.start_container(sb, ctr)

    async def post_start_container(self, sb: Sandbox, ctr: Container,
                                   exited: asyncio.Event) -> None:
        if nri := self._on():
            await nri.post_start_container(sb, ctr)
            nri.watch_exit(sb, ctr, exited)

    async def update_container(self, sb: Sandbox, ctr: Container,
                               requested: pb.LinuxContainerResources,
                               resources: dict[str, Any]
                               ) -> tuple[pb.LinuxContainerResources, dict[str, Any]]:
        if nri := self._on():
            return await nri.update_container(sb, ctr, requested, resources)
        return requested, resources

    async def post_update_container(self, sb: Sandbox, ctr: Container) -> None:
        if nri := self._on():
            await nri.post_update_container(sb, ctr)

    async def stop_container(self, sb: Sandbox, ctr: Container) -> None:
        if nri := self._on():
            await nri.stop_container(sb, ctr)

    async def remove_container(self, sb: Sandbox, ctr: Container) -> None:
        if nri := self._on():
            await nri.remove_container(sb, ctr)

