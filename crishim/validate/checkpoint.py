"""CheckpointContainer, CheckpointPod and RestorePod requests, checked before anything
else (the archive paths are the caller's: absolute, as the kubelet sends them)."""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.validate import fields


def _required(what: str, value: str) -> None:
    if not value:
        raise InvalidArgument(f"{what} is required")


def checkpoint_container(req: pb.CheckpointContainerRequest) -> None:
    _required("container_id", req.container_id)
    _required("location", req.location)
    fields.absolute_path("location", req.location)
    if req.timeout < 0:
        raise InvalidArgument(f"timeout {req.timeout} must not be negative")


def checkpoint_pod(req: pb.CheckpointPodRequest) -> None:
    _required("pod_sandbox_id", req.pod_sandbox_id)
    _required("output_path", req.output_path)
    fields.absolute_path("output_path", req.output_path)
    for i, cid in enumerate(req.container_ids):
        _required(f"container_ids[{i}]", cid)


def restore_pod(req: pb.RestorePodRequest) -> None:
    _required("checkpoint_path", req.checkpoint_path)
    fields.absolute_path("checkpoint_path", req.checkpoint_path)
    if not req.HasField("config"):
        raise InvalidArgument("config (the restored pod's PodSandboxConfig) is required")
    meta = req.config.metadata
    missing = [f for f in ("name", "uid", "namespace") if not getattr(meta, f)]
    if missing:
        raise InvalidArgument(f"config.metadata is missing {', '.join(missing)} (name, uid "
                              "and namespace are required)")
    names = [c.metadata.name for c in req.container_configs]
    for i, name in enumerate(names):
        _required(f"container_configs[{i}].metadata.name", name)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidArgument(f"container_configs name {', '.join(dup)} more than once")
