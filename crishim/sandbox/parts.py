"""What the two managers are built from: a few typed groups of collaborators, made once
where the daemon is wired (node/daemon.py) or by a test's builder, and the helpers of the
sandbox manager's steps (`sandbox_parts`), built from those groups.

`Stores` and `RuntimeSide` are both managers'; `PodHost` is the sandbox manager's view of
the node (container/parts.py has the container manager's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from crishim.config import Config
from crishim.host.facts import HostFacts
from crishim.host.remove import Roots
from crishim.image.manager import ImageManager
from crishim.nri.hooks import NO_NRI, NRIHooks
from crishim.observe.events import EventBus
from crishim.runtime.exitfiles import ExitFileWatcher
from crishim.runtime.runc import RuntimeRegistry
from crishim.sandbox.build import NetworkSetup, SandboxBuilder
from crishim.sandbox.events import PodStatuses, SandboxEvents
from crishim.sandbox.pausewatch import PauseWatch
from crishim.sandbox.recover import NetworkReconciler, SandboxRecovery
from crishim.sandbox.registry import SandboxRegistry
from crishim.sandbox.slices import MadeSlices
from crishim.sandbox.teardown import NetworkTeardown, PodTeardown
from crishim.store.db import Database


class NetworkLike(NetworkSetup, NetworkTeardown, NetworkReconciler, Protocol):
    """What we need of crishim.network.manager.NetworkManager (a protocol for tests)."""


class PodContainers(PodStatuses, Protocol):
    """The pod-wide container steps of StopPodSandbox/RemovePodSandbox and the statuses
    that PodSandboxStatus and pod events carry (the container manager)."""

    async def stop_pod_containers(self, pod_id: str) -> None: ...
    async def remove_pod_containers(self, pod_id: str) -> None: ...


@dataclass(frozen=True)
class Stores:
    """Where the node's state is kept and told of: the database, the event bus, the pods
    (one registry both managers share; only the sandbox manager adds and drops pods) and
    the images."""

    db: Database
    events: EventBus
    pods: SandboxRegistry
    images: ImageManager


@dataclass(frozen=True)
class RuntimeSide:
    """What runs pods and containers and hears of each step: the OCI runtimes by
    handler, the exit-file watcher (started before the managers) and NRI (the null
    object when it is off)."""

    runtimes: RuntimeRegistry
    exit_files: ExitFileWatcher
    nri: NRIHooks = NO_NRI


@dataclass(frozen=True)
class PodHost:
    """The node as a pod sees it: its facts, probed once at start (the pause's OOM score
    floor), and its network."""

    facts: HostFacts
    network: NetworkLike


@dataclass(frozen=True)
class SandboxParts:
    """The helpers of the sandbox manager's steps."""

    slices: MadeSlices
    notify: SandboxEvents
    pauses: PauseWatch
    teardown: PodTeardown
    builder: SandboxBuilder
    recovery: SandboxRecovery


def sandbox_parts(cfg: Config, stores: Stores, runtime: RuntimeSide, host: PodHost,
                  containers: PodContainers) -> SandboxParts:
    # Where the pod's files may be deleted: a record naming a path elsewhere is refused.
    roots = Roots(cfg.root, cfg.state)
    # Slices crishim made for pods' parents under the systemd driver (sandbox/slices.py).
    slices = MadeSlices()
    notify = SandboxEvents(stores.events, containers)
    pauses = PauseWatch(stores.db, stores.pods, runtime.runtimes, notify)
    teardown = PodTeardown(host.network, roots)
    builder = SandboxBuilder(cfg, stores.db, host.network, stores.images, host.facts, slices,
                             roots, pauses, teardown)
    recovery = SandboxRecovery(cfg, stores.db, stores.pods, slices, runtime.runtimes,
                               host.network, roots, builder.rollback, pauses.watch)
    return SandboxParts(slices, notify, pauses, teardown, builder, recovery)
