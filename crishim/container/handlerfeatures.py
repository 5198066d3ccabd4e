"""What each runtime handler supports, for Status.runtime_handlers[].features.

The kubelet only sends recursive read-only mounts to a handler that announces them, so
this asks the OCI runtime itself (`<runtime> features`, runc >= 1.1: its "mountOptions"
list has "rro") and the kernel (mount_setattr, Linux >= 5.12). A runtime without the
`features` command (crun 1.8) announces nothing. Answers are cached per binary.
"""

from __future__ import annotations

import json

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host.facts import kernel_supports_rro
from crishim.oci.runc import OCIRuntime

_mount_options: dict[str, frozenset[str]] = {}


def parse_mount_options(features_json: bytes) -> frozenset[str]:
    """The "mountOptions" of `runc features` output (empty if unreadable)."""
    try:
        data = json.loads(features_json)
    except ValueError:
        return frozenset()
    opts = data.get("mountOptions") if isinstance(data, dict) else None
    return frozenset(o for o in opts if isinstance(o, str)) if isinstance(opts, list) \
        else frozenset()


async def mount_options(runtime: OCIRuntime) -> frozenset[str]:
    cached = _mount_options.get(runtime.binary)
    if cached is None:
        cached = _mount_options[runtime.binary] = parse_mount_options(
            await runtime.features())
    return cached


async def handler_features(runtime: OCIRuntime) -> pb.RuntimeHandlerFeatures:
    rro = kernel_supports_rro() and "rro" in await mount_options(runtime)
    return pb.RuntimeHandlerFeatures(recursive_read_only_mounts=rro)
