"""RestorePod: a pod checkpoint (container/podckpt.py) made into a new pod sandbox and its
containers, CREATED: each container's StartContainer restores its processes.

The request decides the pod (its config and handler) and each container's config, matched
to the checkpoint's archives by name; the archives decide only what a container restore
takes from one (container/restore.py). Anything that fails removes every container made
so far and the sandbox: nothing is left.
"""

from __future__ import annotations

import asyncio

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.log import get_logger
from crishim.node.daemon import Daemon

log = get_logger(__name__)


async def restore_pod(daemon: Daemon, request: pb.RestorePodRequest,
                      configs: list[pb.ContainerConfig]) -> pb.RestorePodResponse:
    """`configs`: the request's container configs, each image its archive's path."""
    sid = await daemon.sandboxes.run_sandbox(request.config, request.runtime_handler)
    made: list[pb.RestoredContainer] = []
    try:
        for config in configs:
            rec = await daemon.containers.create_container(sid, config, request.config)
            made.append(pb.RestoredContainer(name=config.metadata.name, container_id=rec.id))
    except BaseException:
        await asyncio.shield(_undo(daemon, sid, made))
        raise
    log.info("pod restored", id=sid, checkpoint=request.checkpoint_path,
             containers=len(made))
    return pb.RestorePodResponse(pod_sandbox_id=sid, restored_containers=made)


async def _undo(daemon: Daemon, sid: str, made: list[pb.RestoredContainer]) -> None:
    for c in made:
        try:
            await daemon.containers.remove_container(c.container_id)
        except Exception:
            log.exception("a failed RestorePod's container was not removed",
                          id=c.container_id)
    try:
        await daemon.sandboxes.stop_sandbox(sid)
        await daemon.sandboxes.remove_sandbox(sid)
    except Exception:
        log.exception("a failed RestorePod's sandbox was not removed", id=sid)
