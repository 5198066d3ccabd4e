"""CreateContainer's ContainerConfig, checked before any side effect."""

from __future__ import annotations

import posixpath
import re

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.image import reference
from crishim.oci import spec as oci_spec
from crishim.oci.apparmor import DEPRECATED_NAMES, LOCALHOST_PREFIX
from crishim.oci.resources import ResourceMapper
from crishim.oci.userns import parse_mappings
from crishim.validate import fields
from crishim.validate.resources import check_for

# An image ID, bare or prefixed, or a unique prefix of one (crictl's short ids).
_IMAGE_ID = re.compile(r"^(sha256:)?[0-9a-f]{1,64}$")
PROPAGATIONS = tuple(pb.MountPropagation.values())
PROPAGATION_NAMES = {v: pb.MountPropagation.Name(v) for v in PROPAGATIONS}
PROFILE_TYPES = tuple(pb.SecurityProfile.ProfileType.values())
PROFILE_NAMES = {v: pb.SecurityProfile.ProfileType.Name(v) for v in PROFILE_TYPES}
SIGNALS = tuple(pb.Signal.values())
# Mount.mount_options (KEP-5855, the kubelet's volumeMounts[].bindMountOptions): the
# per-mount flags a bind remount can set, and nothing else (no filesystem options, no
# way to undo ro or propagation).
MOUNT_OPTIONS = ("nodev", "noexec", "nosuid")


def image_ref(what: str, value: str) -> None:
    """A reference or an image ID: a malformed one is the caller's mistake
    (INVALID_ARGUMENT), not an image that is missing."""
    if not value:
        raise InvalidArgument(f"{what} is required")
    if _IMAGE_ID.match(value):
        return
    try:
        reference.parse(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{what}: {exc}") from None


def validate_container_config(config: pb.ContainerConfig, resources: ResourceMapper,
                              rro: bool = True,
                              known_caps: frozenset[str] | None = None) -> None:
    """Every field CreateContainer acts on; `rro`: this host's kernel makes recursive
    read-only mounts (Linux >= 5.12); `known_caps`: the capabilities the daemon holds
    (read from /proc when not given)."""
    if not config.metadata.name:
        raise InvalidArgument("container config metadata.name is required")
    fields.name("container metadata.name", config.metadata.name)
    if config.image.image.startswith("/"):  # a checkpoint archive to restore
        fields.absolute_path("container config image.image", config.image.image)
    else:
        image_ref("container config image.image", config.image.image)
    if config.log_path:
        fields.log_path(config.log_path)
    if config.working_dir:
        fields.absolute_path("working_dir", config.working_dir)
    for i, m in enumerate(config.mounts):
        fields.absolute_path(f"mounts[{i}].container_path", m.container_path)
        if m.host_path:
            fields.absolute_path(f"mounts[{i}].host_path", m.host_path)
        fields.enum(f"mounts[{i}].propagation", m.propagation, PROPAGATIONS,
                    PROPAGATION_NAMES)
        if m.HasField("image") and m.image.image:
            image_ref(f"mounts[{i}].image.image", m.image.image)
        elif not m.host_path:
            raise InvalidArgument("a mount needs both container_path and host_path")
        mount_options(f"mounts[{i}]", list(m.mount_options))
        recursive_read_only(m, rro)
        volume(m)
    for i, d in enumerate(config.devices):
        fields.absolute_path(f"devices[{i}].container_path", d.container_path)
        fields.absolute_path(f"devices[{i}].host_path", d.host_path)
        if d.permissions and not set(d.permissions) <= set("rwm"):
            raise InvalidArgument(f"devices[{i}].permissions {d.permissions!r} may hold only "
                                  "'r', 'w' and 'm'")
    if config.stop_signal not in SIGNALS:
        raise InvalidArgument(f"stop_signal {config.stop_signal} is not a CRI Signal")
    for kv in config.envs:
        if "=" in kv.key or "\0" in kv.key or b"\0" in kv.value:
            raise InvalidArgument(f"envs: key {kv.key!r} must not contain '=' or NUL, nor "
                                  "its value NUL")
    linux = config.linux
    if linux.HasField("resources"):
        check_for(resources, linux.resources)
    sc = linux.security_context
    fields.security_ids(sc)
    if not sc.privileged:  # a privileged container gets every capability the node has
        capabilities([*sc.capabilities.add_capabilities, *sc.capabilities.drop_capabilities],
                     known_caps if known_caps is not None
                     else frozenset(oci_spec.all_capabilities()))
    profiles(sc.seccomp if sc.HasField("seccomp") else None,
             sc.apparmor if sc.HasField("apparmor") else None)
    if not sc.HasField("apparmor"):
        apparmor_name(sc.apparmor_profile)
    for kind in ("masked_paths", "readonly_paths"):
        for i, path in enumerate(getattr(sc, kind)):
            fields.absolute_path(f"security_context.{kind}[{i}]", path)
    ns = sc.namespace_options
    for kind in ("network", "pid", "ipc"):
        fields.enum(f"namespace_options.{kind}", getattr(ns, kind),
                    fields.NAMESPACE_MODES, fields.MODE_NAMES)
    if ns.pid == pb.TARGET and not ns.target_id:
        raise InvalidArgument("namespace_options.pid is TARGET but target_id is empty")
    if ns.HasField("userns_options"):
        fields.enum("namespace_options.userns_options.mode", ns.userns_options.mode,
                    fields.NAMESPACE_MODES, fields.MODE_NAMES)


def volume(m: pb.Mount) -> None:
    """An image volume is read-only, names a path inside the image and is not idmapped;
    an idmapped mount's mappings are ones the kernel takes."""
    if m.HasField("image") and m.image.image:
        if not m.readonly:
            raise InvalidArgument(f"mount {m.container_path}: image volumes are read-only; "
                                  "set readonly=true")
        sub = m.image_sub_path
        if sub and (posixpath.isabs(sub) or ".." in sub.split("/")):
            raise InvalidArgument(f"mount {m.container_path}: image_sub_path {sub!r} must be "
                                  "a relative path inside the image")
        if m.uidMappings or m.gidMappings:
            raise InvalidArgument(f"mount {m.container_path}: an image volume cannot be "
                                  "idmapped")
    elif m.uidMappings or m.gidMappings:
        what = f"idmapped mount {m.container_path}"
        parse_mappings("uid", m.uidMappings, what, need_root=False)
        parse_mappings("gid", m.gidMappings, what, need_root=False)


def apparmor_name(old: str) -> None:
    """The deprecated apparmor_profile string: one of its names or localhost/<profile>."""
    if old == LOCALHOST_PREFIX:
        raise InvalidArgument("apparmor_profile 'localhost/' needs a localhost_ref (the "
                              "profile's name)")
    if old not in DEPRECATED_NAMES and not old.startswith(LOCALHOST_PREFIX):
        raise InvalidArgument(f"apparmor_profile {old!r} is not runtime/default, unconfined "
                              "or localhost/<profile>")


def recursive_read_only(m: pb.Mount, rro: bool) -> None:
    """recursive_read_only: read-only, private propagation, and a kernel that has it."""
    if not m.recursive_read_only:
        return
    if not m.readonly:
        raise InvalidArgument(f"mount {m.container_path}: recursive_read_only needs "
                              "readonly=true")
    if m.propagation != pb.PROPAGATION_PRIVATE:
        raise InvalidArgument(f"mount {m.container_path}: recursive_read_only needs "
                              "private propagation")
    if not rro:
        raise InvalidArgument(f"mount {m.container_path}: recursive read-only mounts "
                              "need Linux >= 5.12")


def capabilities(names: list[str], known: frozenset[str]) -> None:
    """Names of capabilities in `known` ("ALL" too), with or without CAP_."""
    for c in map(oci_spec.cap_name, names):
        if c != "ALL" and c not in known:
            raise InvalidArgument(f"unknown capability {c!r}")


def mount_options(what: str, options: list[str]) -> None:
    """Only the bind-mount flags KEP-5855 allows (repeats are harmless)."""
    bad = [o for o in options if o not in MOUNT_OPTIONS]
    if bad:
        raise InvalidArgument(f"{what}.mount_options {bad!r}: only {', '.join(MOUNT_OPTIONS)} "
                              "may be set on a container's mount")


def profiles(seccomp: pb.SecurityProfile | None, apparmor: pb.SecurityProfile | None) -> None:
    """The security profiles' types: known values only (a Localhost one needs its ref)."""
    for what, profile in (("seccomp", seccomp), ("apparmor", apparmor)):
        if profile is None:
            continue
        fields.enum(f"security_context.{what}.profile_type", profile.profile_type,
                    PROFILE_TYPES, PROFILE_NAMES)
        ref = profile.localhost_ref
        if what == "apparmor":  # a profile's name, "localhost/" before it or not
            ref = ref.removeprefix(LOCALHOST_PREFIX)
        if profile.profile_type == pb.SecurityProfile.Localhost and not ref:
            raise InvalidArgument(f"security_context.{what} is Localhost but localhost_ref "
                                  "is empty (needs a localhost_ref)")
        if what == "apparmor" and profile.profile_type != pb.SecurityProfile.Localhost \
                and profile.localhost_ref:
            raise InvalidArgument(f"apparmor localhost_ref {profile.localhost_ref!r} is only "
                                  "valid with the Localhost profile type, not "
                                  f"{PROFILE_NAMES.get(profile.profile_type)}")
