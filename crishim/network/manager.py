"""Attach pods to the node's CNI network and detach them again, crash-safely.

Every attachment is recorded in the result cache before ADD runs, so a crash at any
point leaves a record that `teardown`/`reconcile` can replay DEL from, even after the
conf dir changed or the pod's netns is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

from crishim.config import Config
from crishim.errors import FailedPrecondition, NotFound
from crishim.host.remove import Roots
from crishim.log import get_logger
from crishim.network.args import cni_args, plugin_runtime_config, runtime_config
from crishim.network.cache import CacheEntry, ResultCache
from crishim.network.cni_config import CNIConfigError, ConfigLoader, NetworkConfig, find_plugin
from crishim.network.invoke import CNIPluginError, Invocation, exec_plugin
from crishim.network.netns import is_netns_pinned, remove_netns
from crishim.network.result import parse_result
from crishim.network.types import NetworkResult, PodNetwork

log = get_logger(__name__)

IFNAME = "eth0"
STATUS_INTERVAL = 10.0  # seconds between CNI STATUS polls (1.1.0 networks only)


def _version_tuple(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in v.split("."))
    except ValueError:
        return (0,)


def plugin_conf(network: dict[str, Any], plugin: dict[str, Any],
                prev_result: dict[str, Any] | None,
                offered: dict[str, Any]) -> dict[str, Any]:
    """The stdin config for one plugin of a chain (name/version from the list)."""
    conf = dict(plugin)
    conf["name"] = network.get("name", "")
    conf["cniVersion"] = network.get("cniVersion", "")
    conf.pop("runtimeConfig", None)
    rc = plugin_runtime_config(plugin, offered)
    if rc:
        conf["runtimeConfig"] = rc
    if prev_result is not None:
        conf["prevResult"] = prev_result
    else:
        conf.pop("prevResult", None)
    return conf


class NetworkManager:
    def __init__(self, cfg: Config, pod_cidr: Callable[[], str]) -> None:
        self.cfg = cfg
        self.pod_cidr = pod_cidr
        self.loader = ConfigLoader(cfg.cni.conf_dir, cfg.cni.bin_dirs)
        self.cache = ResultCache(cfg.cni_cache_dir())
        self.netns_dir = os.path.join(cfg.state, "netns")
        self._locks: dict[str, asyncio.Lock] = {}
        self._status_error = ""
        self._status_task: asyncio.Task[None] | None = None

    # --- lifecycle ---

    async def start(self) -> None:
        await asyncio.to_thread(os.makedirs, self.cache.directory, 0o700, True)
        await self._poll_status()
        self._status_task = asyncio.create_task(self._status_loop(), name="cni-status")

    async def stop(self) -> None:
        if self._status_task is not None:
            self._status_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._status_task
            self._status_task = None

    # --- readiness ---

    async def status(self) -> tuple[bool, str]:
        """(ready, reason): ready when a valid network config exists and, for CNI 1.1
        networks, every plugin's STATUS succeeded at the last poll."""
        try:
            await self.loader.get()
        except CNIConfigError as exc:
            return False, f"cni plugin not initialized: {exc}"
        if self._status_error:
            return False, self._status_error
        return True, ""

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(STATUS_INTERVAL)
            try:
                await self._poll_status()
            except Exception as exc:  # never let the poller die
                log.warning("cni status poll failed", error=str(exc))

    async def _poll_status(self) -> None:
        try:
            net = await self.loader.get()
        except CNIConfigError:
            self._status_error = ""
            return
        if _version_tuple(net.cni_version) < (1, 1, 0):
            self._status_error = ""
            return
        for plugin in net.plugins:
            inv = Invocation("STATUS", path=self._cni_path())
            try:
                await exec_plugin(net.binaries[plugin["type"]],
                                  plugin_conf(net.raw, plugin, None, {}), inv)
            except CNIPluginError as exc:
                self._status_error = f"network {net.name} not ready: {exc}"
                return
        self._status_error = ""

    # --- helpers ---

    def netns_path(self, pod_id: str) -> str:
        """Where a pod's netns pin belongs ({state}/netns/<pod-id>); reconcile looks there."""
        return os.path.join(self.netns_dir, pod_id)

    def _cni_path(self) -> str:
        return ":".join(self.cfg.cni.bin_dirs)

    def _lock(self, pod_id: str) -> asyncio.Lock:
        lock = self._locks.get(pod_id)
        if lock is None:
            lock = self._locks[pod_id] = asyncio.Lock()
        return lock

    async def _binary(self, plugin: dict[str, Any], command: str) -> str:
        ptype = str(plugin.get("type", ""))
        found = await asyncio.to_thread(find_plugin, ptype, self.cfg.cni.bin_dirs)
        if found is None:
            raise CNIPluginError(ptype, command, 0, "plugin binary not found in "
                                 + ", ".join(self.cfg.cni.bin_dirs), missing=True)
        return found

    async def _network(self) -> NetworkConfig:
        try:
            return await self.loader.get()
        except CNIConfigError as exc:
            raise FailedPrecondition(f"network not ready (cni plugin not initialized): "
                                     f"{exc}") from None

    # --- ADD ---

    async def setup(self, pod_id: str, netns_path: str, pod: PodNetwork) -> NetworkResult:
        """CNI ADD of the default network's whole chain into the pinned `netns_path`."""
        async with self._lock(pod_id):
            net = await self._network()
            if not is_netns_pinned(netns_path):
                raise FailedPrecondition(f"{netns_path} is not a pinned network namespace")
            existing = await asyncio.to_thread(self.cache.read, pod_id)
            if existing is not None:
                if existing.result is not None and existing.netns == netns_path:
                    return parse_result(existing.result, existing.ifname)  # a retried call
                # A half-done or stale attachment: undo it before attaching afresh.
                await self._del_chain(existing, netns_path)
                await asyncio.to_thread(self.cache.remove, pod_id)
            entry = CacheEntry(pod_id=pod_id, network=net.raw, cni_args=cni_args(pod_id, pod),
                               runtime_config=runtime_config(pod, self.pod_cidr()),
                               ifname=IFNAME, netns=netns_path)
            await asyncio.to_thread(self.cache.write, entry)
            prev: dict[str, Any] | None = None
            try:
                for plugin in net.plugins:
                    inv = self._invocation("ADD", entry, netns_path)
                    out = await exec_plugin(net.binaries[plugin["type"]],
                                            plugin_conf(entry.network, plugin, prev,
                                                        entry.runtime_config), inv)
                    if out is not None:
                        prev = out
            except BaseException as exc:
                await asyncio.shield(self._rollback(entry, prev, exc))
                raise
            entry.result = prev or {}
            await asyncio.to_thread(self.cache.write, entry)
            result = parse_result(entry.result, IFNAME)
            log.info("pod network attached", pod=pod_id, network=net.name, ips=result.ips)
            return result

    async def _rollback(self, entry: CacheEntry, partial: dict[str, Any] | None,
                        cause: BaseException) -> None:
        entry.result = partial
        try:
            await self._del_chain(entry, entry.netns)
        except Exception as exc:
            # The cache entry stays, so teardown/reconcile retry this DEL later.
            log.error("cni rollback DEL failed; kept for retry", pod=entry.pod_id,
                      error=str(exc), cause=str(cause))
            return
        await asyncio.to_thread(self.cache.remove, entry.pod_id)

    def _invocation(self, command: str, entry: CacheEntry, netns: str) -> Invocation:
        return Invocation(command, container_id=entry.pod_id, netns=netns, ifname=entry.ifname,
                          args=entry.cni_args, path=self._cni_path())

    # --- DEL ---

    async def _del_chain(self, entry: CacheEntry, netns_path: str | None) -> None:
        """DEL every plugin in reverse order from the cached config; all are tried, the
        first failure is raised afterwards."""
        netns = netns_path or entry.netns
        if not netns or not is_netns_pinned(netns):
            netns = ""  # gone already: plugins then only release host-side state
        first_error: Exception | None = None
        plugins = entry.network.get("plugins") or []
        for plugin in reversed(plugins):
            try:
                inv = self._invocation("DEL", entry, netns)
                await exec_plugin(await self._binary(plugin, "DEL"),
                                  plugin_conf(entry.network, plugin, entry.result,
                                              entry.runtime_config), inv)
            except Exception as exc:
                log.warning("cni DEL failed", pod=entry.pod_id, plugin=plugin.get("type"),
                            error=str(exc))
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    async def teardown(self, pod_id: str, netns_path: str | None) -> None:
        """Replay CNI DEL from the cache and drop the entry. Unknown pods are a no-op."""
        async with self._lock(pod_id):
            try:
                entry = await asyncio.to_thread(self.cache.read, pod_id)
            except ValueError as exc:
                log.error("dropping unreadable cni cache entry", pod=pod_id, error=str(exc))
                await asyncio.to_thread(self.cache.remove, pod_id)
                return
            if entry is None:
                return
            await self._del_chain(entry, netns_path)
            await asyncio.to_thread(self.cache.remove, pod_id)
            log.info("pod network detached", pod=pod_id)
        self._locks.pop(pod_id, None)

    # --- CHECK ---

    async def check(self, pod_id: str, netns_path: str) -> None:
        """CNI CHECK of the cached attachment (networks >= 0.4.0 unless disableCheck)."""
        async with self._lock(pod_id):
            entry = await asyncio.to_thread(self.cache.read, pod_id)
            if entry is None:
                raise NotFound(f"pod {pod_id} has no network attachment")
            if entry.result is None:
                raise FailedPrecondition(f"network attachment of pod {pod_id} is incomplete")
            if (_version_tuple(str(entry.network.get("cniVersion", ""))) < (0, 4, 0)
                    or entry.network.get("disableCheck") is True):
                return
            if not is_netns_pinned(netns_path):
                raise FailedPrecondition(f"{netns_path} is not a pinned network namespace")
            for plugin in entry.network.get("plugins") or []:
                inv = self._invocation("CHECK", entry, netns_path)
                await exec_plugin(await self._binary(plugin, "CHECK"),
                                  plugin_conf(entry.network, plugin, entry.result,
                                              entry.runtime_config), inv)

    # --- reconciliation ---

    def cached_pod_ids(self) -> set[str]:
        return self.cache.pod_ids()

    async def reconcile(self, live_pod_ids: set[str]) -> None:
        """DEL attachments and remove netns pins that no live pod owns."""
        for pod_id in sorted(self.cached_pod_ids() - live_pod_ids):
            try:
                await self.teardown(pod_id, None)
            except Exception as exc:
                log.error("reconcile: cni DEL of a leftover pod failed", pod=pod_id,
                          error=str(exc))
        await asyncio.to_thread(self.cache.remove_partial_writes)
        try:
            pins = await asyncio.to_thread(os.listdir, self.netns_dir)
        except FileNotFoundError:
            pins = []
        for name in sorted(set(pins) - live_pod_ids):
            path = os.path.join(self.netns_dir, name)
            try:
                await remove_netns(path, roots=Roots(self.cfg.root, self.cfg.state))
                log.info("reconcile: removed leftover netns pin", path=path)
            except OSError as exc:
                log.error("reconcile: removing netns pin failed", path=path, error=str(exc))
