"""What each runtime handler supports, for Status.runtime_handlers[].features.

The kubelet only sends recursive read-only mounts to a handler that announces them, so
this asks the OCI runtime itself (`<runtime> features`, runc >= 1.1: its "mountOptions"
list has "rro") and the kernel (mount_setattr, Linux >= 5.12). A runtime without the
`features` command (crun 1.8) announces nothing. Answers are cached per binary.
"""

from __future__ import annotations

import asyncio
import json
import shutil

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host.facts import kernel_supports_rro
from crishim.log import get_logger

log = get_logger(__name__)

PROBE_TIMEOUT = 5.0
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


async def mount_options(binary: str) -> frozenset[str]:
    cached = _mount_options.get(binary)
    if cached is not None:
        return cached
    exe = shutil.which(binary)
    opts: frozenset[str] = frozenset()
    if exe is not None:
        try:
            proc = await asyncio.create_subprocess_exec(
                exe, "features", stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL)
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                out = b""
            if proc.returncode == 0:
                opts = parse_mount_options(out)
        except OSError as exc:
            log.warning("cannot ask the runtime for its features", runtime=binary,
                        error=str(exc))
    _mount_options[binary] = opts
    return opts


async def handler_features(binary: str) -> pb.RuntimeHandlerFeatures:
    rro = kernel_supports_rro() and "rro" in await mount_options(binary)
    return pb.RuntimeHandlerFeatures(recursive_read_only_mounts=rro)
