"""The CDI devices a CRI ContainerConfig asks for: its CDI_devices field, then the
`cdi.k8s.io/*` annotations (kubelets before the field, and DRA drivers that still write
both), each device once, as containerd and CRI-O take them."""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.names import CDINameError, requested
from crishim.errors import InvalidArgument


def cdi_requested(config: pb.ContainerConfig) -> list[str]:
    try:
        return requested([d.name for d in config.CDI_devices], config.annotations)
    except CDINameError as exc:
        raise InvalidArgument(str(exc)) from None
