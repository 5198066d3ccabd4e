"""Which AppArmor profile a container runs under (process.apparmorProfile).

The kubelet sends `security_context.apparmor` (SecurityProfile, Kubernetes >= 1.30) or,
for older pods, the deprecated `apparmor_profile` string ("runtime/default",
"unconfined", "localhost/<name>"). Unset means RuntimeDefault, as containerd and CRI-O do.
"""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import FailedPrecondition
from crishim.oci.apparmor import DEPRECATED_NAMES, LOCALHOST_PREFIX, AppArmorState

_KIND = pb.SecurityProfile.ProfileType
_DEPRECATED = dict(zip(DEPRECATED_NAMES, (pb.SecurityProfile.RuntimeDefault,
                                          pb.SecurityProfile.RuntimeDefault,
                                          pb.SecurityProfile.Unconfined), strict=True))


def requested(sc: pb.LinuxContainerSecurityContext) -> tuple[int, str]:
    """(profile type, localhost name) asked for; unset is RuntimeDefault. The forms were
    checked by validate/container.py."""
    if sc.HasField("apparmor"):
        kind, ref = sc.apparmor.profile_type, sc.apparmor.localhost_ref
        return kind, ref.removeprefix(LOCALHOST_PREFIX)
    old = sc.apparmor_profile  # deprecated string form
    if old.startswith(LOCALHOST_PREFIX):
        return pb.SecurityProfile.Localhost, old.removeprefix(LOCALHOST_PREFIX)
    return _DEPRECATED[old], ""


def select_profile(sc: pb.LinuxContainerSecurityContext, host: AppArmorState) -> str:
    """The profile name for process.apparmorProfile; "" for none (unconfined, or a host
    without AppArmor: there a request is ignored, as before the default existed)."""
    kind, ref = requested(sc)
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
