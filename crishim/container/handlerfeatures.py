"""What each runtime handler supports, for Status.runtime_handlers[].features.

The kubelet only sends recursive read-only mounts to a handler that announces them, so
this asks the OCI runtime itself (`<runtime> features`, runc >= 1.1: its "mountOptions"
list has "rro") and the kernel (mount_setattr, Linux >= 5.12). A runtime without the
`features` command (crun 1.8) announces nothing. Answers are cached per binary, from the
daemon's start-up probe of its handlers.

User namespaces (the kubelet's `hostUsers: false`) are announced when the runtime can join
a user namespace (`features` lists "user" under linux.namespaces) and the filesystem of
the image layers takes idmapped mounts, which crishim makes itself for the rootfs (the
probe is what critest does: an idmapped clone of the directory, never attached).
"""

from __future__ import annotations

import json

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host import idmap
from crishim.host.facts import kernel_supports_rro
from crishim.log import get_logger
from crishim.oci.runc import OCIRuntime

log = get_logger(__name__)

_raw: dict[str, bytes] = {}
_mount_options: dict[str, frozenset[str]] = {}
_namespaces: dict[str, frozenset[str]] = {}
_idmap_ok: dict[str, bool] = {}


def parse_mount_options(features_json: bytes) -> frozenset[str]:
    """The "mountOptions" of `runc features` output (empty if unreadable)."""
    try:
        data = json.loads(features_json)
    except ValueError:
        return frozenset()
    opts = data.get("mountOptions") if isinstance(data, dict) else None
    return frozenset(o for o in opts if isinstance(o, str)) if isinstance(opts, list) \
        else frozenset()


def parse_namespaces(features_json: bytes) -> frozenset[str]:
    """linux.namespaces of `runc features` output (empty if unreadable)."""
    try:
        data = json.loads(features_json)
    except ValueError:
        return frozenset()
    linux = data.get("linux") if isinstance(data, dict) else None
    names = linux.get("namespaces") if isinstance(linux, dict) else None
    return frozenset(n for n in names if isinstance(n, str)) if isinstance(names, list) \
        else frozenset()


def remember(runtime: OCIRuntime, raw: bytes) -> None:
    """Keep what the start-up probe read (`RuntimeRegistry.probe`), so no request runs
    `features` again."""
    _raw[runtime.binary] = raw
    _mount_options[runtime.binary] = parse_mount_options(raw)
    _namespaces[runtime.binary] = parse_namespaces(raw)


async def _probe(runtime: OCIRuntime) -> None:
    remember(runtime, await runtime.features())


async def features(runtime: OCIRuntime) -> bytes:
    """The runtime's `features` output as probed (once per binary; b"" without one)."""
    if runtime.binary not in _raw:
        await _probe(runtime)
    return _raw[runtime.binary]


async def mount_options(runtime: OCIRuntime) -> frozenset[str]:
    if runtime.binary not in _mount_options:
        await _probe(runtime)
    return _mount_options[runtime.binary]


async def namespaces(runtime: OCIRuntime) -> frozenset[str]:
    if runtime.binary not in _namespaces:
        await _probe(runtime)
    return _namespaces[runtime.binary]


async def idmap_supported(layers_dir: str) -> bool:
    cached = _idmap_ok.get(layers_dir)
    if cached is None:
        why = await idmap.supports_idmap(layers_dir)
        if why:
            log.info("no idmapped mounts on the image store; user namespaces are not "
                     "offered", path=layers_dir, reason=why)
        cached = _idmap_ok[layers_dir] = not why
    return cached


async def handler_features(runtime: OCIRuntime, layers_dir: str) -> pb.RuntimeHandlerFeatures:
    """`layers_dir`: where image layers live (the idmap probe's directory)."""
    rro = kernel_supports_rro() and "rro" in await mount_options(runtime)
    userns = "user" in await namespaces(runtime) and await idmap_supported(layers_dir)
    return pb.RuntimeHandlerFeatures(recursive_read_only_mounts=rro, user_namespaces=userns)
