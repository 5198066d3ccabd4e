"""A pod's user namespace as the kubelet asks for it (`hostUsers: false`): CRI
UserNamespace → validated id mappings, or None for the host's user namespace.

Mode POD gives the whole pod (pause and every container) one user namespace with the
given uid and gid mappings; NODE (or no userns_options) is the host's. CONTAINER and
TARGET are refused, as containerd and CRI-O refuse them: the kubelet never sends them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.host.idmap import Mapping

# The kernel's limit of lines in a uid_map/gid_map.
MAX_MAPPINGS = 340
_ID_LIMIT = 1 << 32  # ids are u32; (u32)-1 is "no id"
_MODES = {pb.POD: "POD", pb.CONTAINER: "CONTAINER", pb.NODE: "NODE", pb.TARGET: "TARGET"}


@dataclass(frozen=True)
class PodUserns:
    uids: tuple[Mapping, ...]
    gids: tuple[Mapping, ...]

    @property
    def root_uid(self) -> int:
        """The host uid of the pod's root (container uid 0)."""
        return to_host(self.uids, 0)

    @property
    def root_gid(self) -> int:
        return to_host(self.gids, 0)

    def oci(self) -> dict[str, list[dict[str, int]]]:
        """The OCI linux.uidMappings/gidMappings."""
        return {"uidMappings": _oci(self.uids), "gidMappings": _oci(self.gids)}


def _oci(mappings: Sequence[Mapping]) -> list[dict[str, int]]:
    return [{"containerID": c, "hostID": h, "size": n} for c, h, n in mappings]


def to_host(mappings: Sequence[Mapping], inside: int) -> int:
    for c, h, n in mappings:
        if c <= inside < c + n:
            return h + inside - c
    raise ValueError(f"id {inside} is not mapped")


def parse_mappings(kind: str, given: Sequence[pb.IDMapping], what: str = "user namespace "
                   "mode POD", need_root: bool = True) -> tuple[Mapping, ...]:
    """Validated (container_id, host_id, length) tuples: non-empty, no zero lengths or
    u32 overflow, no overlap on either side, and (`need_root`) container id 0 mapped."""
    if not given:
        raise InvalidArgument(f"{what} needs at least one {kind} mapping")
    if len(given) > MAX_MAPPINGS:
        raise InvalidArgument(f"{len(given)} {kind} mappings: the kernel takes at most "
                              f"{MAX_MAPPINGS}")
    out = tuple((m.container_id, m.host_id, m.length) for m in given)
    for c, h, n in out:
        if n == 0:
            raise InvalidArgument(f"{kind} mapping {c}:{h}:{n} has length 0")
        if c + n > _ID_LIMIT - 1 or h + n > _ID_LIMIT - 1:
            raise InvalidArgument(f"{kind} mapping {c}:{h}:{n} runs past the largest id "
                                  f"({_ID_LIMIT - 2})")
    for side, name in ((0, "container"), (1, "host")):
        spans = sorted((m[side], m[side] + m[2]) for m in out)
        for (_, end), (start, _) in itertools.pairwise(spans):
            if start < end:
                raise InvalidArgument(f"{kind} mappings overlap in their {name} ids: "
                                      + ", ".join(f"{c}:{h}:{n}" for c, h, n in out))
    try:
        if need_root:
            to_host(out, 0)
    except ValueError:
        raise InvalidArgument(f"{kind} mappings do not map container id 0 (the pod's root): "
                              + ", ".join(f"{c}:{h}:{n}" for c, h, n in out)) from None
    return out


def pod_userns(opts: pb.NamespaceOption) -> PodUserns | None:
    """The validated mappings of mode POD; None for the host's user namespace."""
    if not opts.HasField("userns_options"):
        return None
    u = opts.userns_options
    if u.mode == pb.NODE:
        if u.uids or u.gids:
            raise InvalidArgument("user namespace mode NODE takes no uid/gid mappings")
        return None
    if u.mode != pb.POD:
        raise InvalidArgument(f"user namespace mode {_MODES.get(u.mode, u.mode)} is not "
                              "supported; use POD (a pod-wide user namespace) or NODE")
    return PodUserns(uids=parse_mappings("uid", u.uids), gids=parse_mappings("gid", u.gids))


def check_pod_namespaces(opts: pb.NamespaceOption) -> PodUserns | None:
    """pod_userns, and a pod in its own user namespace may share the host's network
    (KEP-5607, announced in Status as user_namespaces_host_network) but not its PID or IPC
    namespace (Kubernetes refuses hostUsers: false with hostPID/hostIPC as well)."""
    userns = pod_userns(opts)
    if userns is not None:
        shared = [k for k in ("pid", "ipc") if getattr(opts, k) == pb.NODE]
        if shared:
            raise InvalidArgument("a pod in its own user namespace cannot share the host's "
                                  f"{'/'.join(shared)} namespace")
    return userns


def check_container(pod: PodUserns | None, opts: pb.NamespaceOption) -> None:
    """A container always runs in its pod's user namespace: what it asks for, if
    anything, must be the pod's."""
    if not opts.HasField("userns_options"):
        return
    mine = pod_userns(opts)
    if mine != pod:
        want = "the host's" if pod is None else f"POD with uids {list(pod.uids)} gids " \
            f"{list(pod.gids)}"
        raise InvalidArgument("a container's user namespace must be its pod's "
                              f"({want})")
