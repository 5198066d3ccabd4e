"""Find and validate the node's CNI network configuration.

The lexically first valid `.conflist`, `.conf` or `.json` file in the config dir wins
(the kubelet/containerd convention). `ConfigLoader` re-reads the dir only when a file in
it changed (mtime/size), so dropping a new file in is picked up without a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")


class CNIConfigError(Exception):
    """No usable network configuration; the message says why."""


@dataclass
class NetworkConfig:
    name: str
    cni_version: str
    plugins: list[dict[str, Any]]
    path: str
    raw: dict[str, Any] = field(default_factory=dict)
    # plugin type -> executable path
    binaries: dict[str, str] = field(default_factory=dict)


def find_plugin(plugin_type: str, bin_dirs: list[str]) -> str | None:
    for d in bin_dirs:
        candidate = os.path.join(d, plugin_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_network(path: str, bin_dirs: list[str]) -> NetworkConfig:
    try:
        with open(path, "rb") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CNIConfigError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise CNIConfigError(f"{path}: not a JSON object")
    if path.endswith(".conflist"):
        plugins = raw.get("plugins")
        if not isinstance(plugins, list) or not plugins:
            raise CNIConfigError(f"{path}: a conflist needs a non-empty 'plugins' list")
    else:
        # A single-plugin .conf is a one-element list.
        plugins = [raw]
        raw = {"cniVersion": raw.get("cniVersion", ""), "name": raw.get("name", ""),
               "plugins": plugins}
    name = raw.get("name")
    version = raw.get("cniVersion", "")
    versions = raw.get("cniVersions")
    if isinstance(versions, list):
        # CNI 1.1: a list of versions the config is valid for; use the newest we speak.
        usable = [v for v in versions if v in SUPPORTED_VERSIONS]
        if usable:
            version = max(usable, key=lambda v: tuple(int(p) for p in v.split(".")))
            raw = {**raw, "cniVersion": version}
    if not name or not isinstance(name, str):
        raise CNIConfigError(f"{path}: missing network 'name'")
    if version not in SUPPORTED_VERSIONS and not str(version).startswith("0.4"):
        raise CNIConfigError(f"{path}: cniVersion {version!r} not supported "
                             f"(use one of {', '.join(SUPPORTED_VERSIONS)})")
    binaries: dict[str, str] = {}
    for plugin in plugins:
        if not isinstance(plugin, dict) or not isinstance(plugin.get("type"), str):
            raise CNIConfigError(f"{path}: every plugin needs a 'type'")
        found = find_plugin(plugin["type"], bin_dirs)
        if found is None:
            raise CNIConfigError(f"{path}: plugin {plugin['type']!r} not found in "
                                 f"{', '.join(bin_dirs)}")
        binaries[plugin["type"]] = found
    return NetworkConfig(name=name, cni_version=version, plugins=plugins, path=path, raw=raw,
                         binaries=binaries)


def load_default_network(conf_dir: str, bin_dirs: list[str]) -> NetworkConfig:
    """Return the first valid network in `conf_dir`, or raise CNIConfigError with reasons."""
    try:
        names = sorted(os.listdir(conf_dir))
    except FileNotFoundError:
        raise CNIConfigError(f"CNI config dir {conf_dir} does not exist") from None
    candidates = [n for n in names if n.endswith((".conflist", ".conf", ".json"))]
    if not candidates:
        raise CNIConfigError(f"no network config found in {conf_dir}")
    reasons = []
    for name in candidates:
        try:
            return parse_network(os.path.join(conf_dir, name), bin_dirs)
        except CNIConfigError as exc:
            reasons.append(str(exc))
    raise CNIConfigError("no valid network config: " + "; ".join(reasons))


class ConfigLoader:
    """Caches the default network until the conf dir's listing or a file in it changes.
    A failed load is retried on every call, so installing a missing plugin is noticed.
    The dir is on disk: it is listed (and a changed network loaded) on a worker thread."""

    def __init__(self, conf_dir: str, bin_dirs: list[str]) -> None:
        self.conf_dir = conf_dir
        self.bin_dirs = bin_dirs
        self._signature: tuple[object, ...] | None = None
        self._network: NetworkConfig | None = None
        self._error = ""

    def _current_signature(self) -> tuple[object, ...]:
        try:
            names = sorted(os.listdir(self.conf_dir))
        except OSError as exc:
            return ("missing", exc.errno)
        sig: list[object] = []
        for name in names:
            try:
                st = os.stat(os.path.join(self.conf_dir, name))
            except OSError:
                continue
            sig.append((name, st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(sig)

    def _reload_if_changed(self, known: tuple[object, ...] | None
                           ) -> tuple[tuple[object, ...], NetworkConfig | None, str] | None:
        """(signature, network, error) when the dir no longer matches `known`."""
        sig = self._current_signature()
        if sig == known:
            return None
        try:
            return sig, load_default_network(self.conf_dir, self.bin_dirs), ""
        except CNIConfigError as exc:
            return sig, None, str(exc)

    async def get(self) -> NetworkConfig:
        """The current default network, or CNIConfigError saying why there is none."""
        known = self._signature if self._network is not None else None
        changed = await asyncio.to_thread(self._reload_if_changed, known)
        if changed is not None:
            self._signature, self._network, self._error = changed
        return self.last()

    def last(self) -> NetworkConfig:
        """What the last `get` found, without reading the dir again."""
        if self._network is None:
            raise CNIConfigError(self._error or "the CNI config was not read yet")
        return self._network
