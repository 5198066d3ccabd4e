"""What each runtime handler supports on this host, judged once at start.

The kubelet only sends recursive read-only mounts to a handler that announces them, so
this reads what the OCI runtime says of itself (`<runtime> features`, runc >= 1.1: its
"mountOptions" list has "rro") and asks the kernel (mount_setattr, Linux >= 5.12). A
runtime without the `features` command (crun 1.8) announces nothing.

User namespaces (the kubelet's `hostUsers: false`) are announced when the runtime can join
a user namespace (`features` lists "user" under linux.namespaces) and the filesystem of
the image layers takes idmapped mounts, which crishim makes itself for the rootfs (the
probe is what critest does: an idmapped clone of the directory, never attached).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crishim.host import idmap
from crishim.log import get_logger

log = get_logger(__name__)


def _features(raw: bytes) -> dict[str, Any]:
    """`runc features` output as a JSON object (empty if unreadable)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _strings(value: object) -> frozenset[str]:
    return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) \
        else frozenset()


def parse_mount_options(features_json: bytes) -> frozenset[str]:
    """The "mountOptions" of `runc features` output (empty if unreadable)."""
    return _strings(_features(features_json).get("mountOptions"))


def parse_namespaces(features_json: bytes) -> frozenset[str]:
    """linux.namespaces of `runc features` output (empty if unreadable)."""
    linux = _features(features_json).get("linux")
    return _strings(linux.get("namespaces") if isinstance(linux, dict) else None)


@dataclass(frozen=True)
class RuntimeFeatures:
    """One handler's runtime on this host: its `features` output as read (b"" without
    one; NRI plugins get it verbatim) and what it can be announced as supporting."""

    raw: bytes = b""
    recursive_read_only_mounts: bool = False
    user_namespaces: bool = False


async def probe(features: Mapping[str, bytes], rro_kernel: bool,
                layers_dir: str) -> dict[str, RuntimeFeatures]:
    """Handler name → its features, from each runtime's `features` output (`features`,
    read by the runtime probe at start). `rro_kernel`: the kernel takes recursive
    read-only mounts; `layers_dir`: where image layers live, probed for idmapped mounts
    only when some runtime can join a user namespace."""
    userns = {name: "user" in parse_namespaces(raw) for name, raw in features.items()}
    idmap_ok = False
    if any(userns.values()):
        why = await idmap.supports_idmap(layers_dir)
        if why:
            log.info("no idmapped mounts on the image store; user namespaces are not "
                     "offered", path=layers_dir, reason=why)
        idmap_ok = not why
    return {name: RuntimeFeatures(
                raw, rro_kernel and "rro" in parse_mount_options(raw),
                userns[name] and idmap_ok)
            for name, raw in features.items()}
