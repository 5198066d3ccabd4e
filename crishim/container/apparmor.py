"""Which AppArmor profile a container runs under (process.apparmorProfile).

The kubelet sends `security_context.apparmor` (SecurityProfile, Kubernetes >= 1.30) or,
for older pods, the deprecated `apparmor_profile` string ("runtime/default",
"unconfined", "localhost/<name>"). Unset means RuntimeDefault, as containerd and CRI-O do.
"""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.oci.apparmor import AppArmorState

_LOCALHOST_PREFIX = "localhost/"
_KIND = pb.SecurityProfile.ProfileType


def requested(sc: pb.LinuxContainerSecurityContext) -> tuple[int, str]:
    """(profile type, localhost name) asked for; unset is RuntimeDefault."""
    if sc.HasField("apparmor"):
        kind, ref = sc.apparmor.profile_type, sc.apparmor.localhost_ref
        if kind != pb.SecurityProfile.Localhost and ref:
            raise InvalidArgument(f"apparmor localhost_ref {ref!r} is only valid with the "
                                  f"Localhost profile type, not "
                                  f"{_KIND.Name(kind)}")
        return kind, ref.removeprefix(_LOCALHOST_PREFIX)
    old = sc.apparmor_profile  # deprecated string form
    if old in ("", "runtime/default"):
        return pb.SecurityProfile.RuntimeDefault, ""
    if old == "unconfined":
        return pb.SecurityProfile.Unconfined, ""
    if old.startswith(_LOCALHOST_PREFIX):
        return pb.SecurityProfile.Localhost, old.removeprefix(_LOCALHOST_PREFIX)
    raise InvalidArgument(f"apparmor_profile {old!r} is not runtime/default, unconfined or "
                          "localhost/<profile>")


def select_profile(sc: pb.LinuxContainerSecurityContext, host: AppArmorState) -> str:
    """The profile name for process.apparmorProfile; "" for none (unconfined, or a host
    without AppArmor: there a request is ignored, as before the default existed)."""
    kind, ref = requested(sc)
    if kind == pb.SecurityProfile.Localhost and not ref:
        raise InvalidArgument("apparmor profile type Localhost needs a localhost_ref")
    if not host.enabled or kind == pb.SecurityProfile.Unconfined:
        return ""
    if kind == pb.SecurityProfile.Localhost:
        return ref
    if sc.privileged:  # RuntimeDefault does not confine privileged containers
        return ""
    if host.error:
        raise FailedPrecondition(f"the default AppArmor profile is unavailable: "
                                 f"{host.error}")
    return host.default_profile
