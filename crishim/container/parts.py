"""The container manager's view of the node (`ContainerHost`) and the helpers of its
steps (`container_parts`), built from the groups of sandbox/parts.py where the daemon is
wired (node/daemon.py) or by a test's builder."""

from __future__ import annotations

import os
from dataclasses import dataclass

from crishim.cdi.registry import CDIRegistry
from crishim.config import Config
from crishim.container.bundle import BundleFiles
from crishim.container.events import ContainerEvents
from crishim.container.exit import ContainerExits
from crishim.container.launch import ContainerLauncher
from crishim.container.recover import ContainerRecovery
from crishim.container.registry import ContainerRegistry
from crishim.container.rootfssize import RootfsSizes
from crishim.container.spec import SpecHost
from crishim.container.stop import ContainerStopper
from crishim.host.quota import WritableLayerQuotas
from crishim.host.remove import Roots
from crishim.sandbox.parts import RuntimeSide, Stores


@dataclass(frozen=True)
class ContainerHost:
    """The node as a container sees it: what its spec needs (facts, the resource mapping,
    AppArmor) and the CDI spec directories, for containers that ask for CDI devices."""

    spec: SpecHost
    cdi: CDIRegistry


@dataclass(frozen=True)
class ContainerParts:
    """The container records and the helpers of the manager's steps."""

    records: ContainerRegistry
    notify: ContainerEvents
    exits: ContainerExits
    bundles: BundleFiles
    launcher: ContainerLauncher
    stopper: ContainerStopper
    rootfs_sizes: RootfsSizes
    recovery: ContainerRecovery


def containers_dir(cfg: Config) -> str:
    return os.path.join(cfg.root, "containers")


def conmon_dir(cfg: Config) -> str:
    return os.path.join(cfg.state, "conmon")


def container_parts(cfg: Config, stores: Stores, runtime: RuntimeSide,
                    host: ContainerHost) -> ContainerParts:
    runtimes, exit_files = runtime.runtimes, runtime.exit_files
    records = ContainerRegistry()
    notify = ContainerEvents(stores.events, stores.pods, records)
    exits = ContainerExits(stores.db, records, notify, runtimes, exit_files, host.spec.facts)
    bundles = BundleFiles(containers_dir(cfg), exit_files.exit_dir, Roots(cfg.root, cfg.state))
    launcher = ContainerLauncher(runtimes, cfg.conmon_path, exit_files.exit_dir, bundles.roots)
    stopper = ContainerStopper(runtimes, records, exits)
    rootfs_sizes = RootfsSizes(cfg.storage, WritableLayerQuotas(containers_dir(cfg)))
    recovery = ContainerRecovery(stores.db, records, exits, runtimes, bundles, stores.images,
                                 conmon_dir(cfg))
    return ContainerParts(records, notify, exits, bundles, launcher, stopper, rootfs_sizes,
                          recovery)
