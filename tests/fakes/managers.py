"""The one builder of the two managers for tests: the groups node/daemon.py makes
(crishim/sandbox/parts.py, crishim/container/parts.py), each defaulting to a harmless
stand-in, and the managers built from them as the daemon builds them."""

from __future__ import annotations

import os

from crishim.cdi.registry import CDIRegistry
from crishim.config import Config
from crishim.container.manager import ContainerManager
from crishim.container.parts import ContainerHost, container_parts
from crishim.container.spec import SpecHost
from crishim.host.facts import HostFacts
from crishim.image.manager import ImageManager
from crishim.nri.hooks import NO_NRI, NRIHooks
from crishim.observe.events import EventBus
from crishim.runtime.exitfiles import ExitFileWatcher
from crishim.runtime.runc import RuntimeRegistry
from crishim.sandbox.manager import SandboxManager
from crishim.sandbox.parts import (
    NetworkLike,
    PodHost,
    RuntimeSide,
    Stores,
    sandbox_parts,
)
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.db import Database


def stores(cfg: Config, db: Database, pods: SandboxRegistry | None = None,
           events: EventBus | None = None, images: ImageManager | None = None) -> Stores:
    return Stores(db, events or EventBus(), pods if pods is not None else SandboxRegistry(),
                  images or ImageManager(cfg, db))


def runtime_side(cfg: Config, runtimes: RuntimeRegistry | None = None,
                 exit_files: ExitFileWatcher | None = None,
                 nri: NRIHooks = NO_NRI) -> RuntimeSide:
    return RuntimeSide(runtimes or RuntimeRegistry(cfg),
                       exit_files or ExitFileWatcher(os.path.join(cfg.state, "exits")), nri)


def container_manager(cfg: Config, db: Database, *, store: Stores | None = None,
                      runtime: RuntimeSide | None = None,
                      spec: SpecHost | None = None) -> ContainerManager:
    """A ContainerManager as the daemon builds one; unstarted (its `start()` is the
    caller's, as is the exit-file watcher's)."""
    store = store or stores(cfg, db)
    runtime = runtime or runtime_side(cfg)
    host = ContainerHost(spec or SpecHost(), CDIRegistry(cfg.cdi_spec_dirs))
    return ContainerManager(cfg, store, runtime, host,
                            container_parts(cfg, store, runtime, host))


def sandbox_manager(cfg: Config, db: Database, network: NetworkLike, facts: HostFacts, *,
                    store: Stores | None = None,
                    runtime: RuntimeSide | None = None) -> SandboxManager:
    """A SandboxManager with a ContainerManager over the same groups, as the daemon
    builds them; unstarted."""
    store = store or stores(cfg, db)
    runtime = runtime or runtime_side(cfg)
    containers = container_manager(cfg, db, store=store, runtime=runtime)
    return SandboxManager(cfg, store, runtime, containers,
                          sandbox_parts(cfg, store, runtime, PodHost(facts, network),
                                        containers))
