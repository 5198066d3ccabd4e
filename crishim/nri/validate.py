"""The default validator: containerd's built-in NRI policy on what plugins may adjust.

Off unless `enable`; then, with its knobs (the keys of containerd's
`[plugins."io.containerd.nri.v1.nri".default_validator]`, under `[nri.default_validator]`
here), it refuses a container whose merged adjustment injects OCI hooks, replaces the
seccomp policy of a container that runs under the runtime-default, unconfined or a custom
(localhost) profile, changes namespaces or sets sysctls, and a container that some
required plugin did not see. Required plugins come from the config and from the pod
annotation `required-plugins.noderesource.dev` (a YAML/JSON list; scoped keys
`<key>/container.<name>` and `<key>/pod` first), unless the pod carries the annotation
named by `tolerate_missing_plugins_annotation` set to true.

It reads the same ValidateContainerAdjustmentRequest a validator plugin gets (the owners
there say who set what), so it runs before the plugins' own validators, as containerd
runs it at index 00.
"""

from __future__ import annotations

import json

import yaml

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.config import DefaultValidatorConfig
from crishim.errors import FailedPrecondition

REQUIRED_PLUGINS_ANNOTATION = "required-plugins.noderesource.dev"
# What the validator is called where a plugin's name would be (containerd's).
NAME = "default-validator"
INDEX = "00"


class AdjustmentRejected(FailedPrecondition):
    """The default validator refused a container's adjustment."""


def effective_annotation(pod: nri.PodSandbox, key: str, container: str) -> str | None:
    """A pod annotation as it applies to one container: `<key>/container.<name>`, then
    `<key>/pod`, then `<key>`."""
    for k in (f"{key}/container.{container}", f"{key}/pod", key):
        if k in pod.annotations:
            return pod.annotations[k]
    return None


_TRUE = {"1", "t", "true", "TRUE", "True"}
_FALSE = {"0", "f", "false", "FALSE", "False"}


def _parse_bool(value: str, what: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise AdjustmentRejected(f"invalid {what} annotation {value!r}: not a boolean")


def _parse_list(value: str) -> list[str]:
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise AdjustmentRejected(f"invalid {REQUIRED_PLUGINS_ANNOTATION} annotation "
                                 f"{value!r}: {exc}") from None
    if parsed is None:
        return []
    if not isinstance(parsed, list) or not all(isinstance(p, str) for p in parsed):
        raise AdjustmentRejected(f"invalid {REQUIRED_PLUGINS_ANNOTATION} annotation "
                                 f"{value!r}: not a list of plugin names")
    return parsed


def _owners(req: nri.ValidateContainerAdjustmentRequest) -> nri.FieldOwners | None:
    return req.owners.owners.get(req.container.id)


def validate_adjustment(cfg: DefaultValidatorConfig,
                        req: nri.ValidateContainerAdjustmentRequest) -> None:
    """Raise AdjustmentRejected (FAILED_PRECONDITION) when `cfg` forbids the adjustment
    in `req`; nothing when the validator is disabled."""
    if not cfg.enable:
        return
    owners = _owners(req)
    has_adjust = req.HasField("adjust")
    if has_adjust and cfg.reject_oci_hook_adjustment and owners is not None:
        hook_owners = owners.simple.get(nri.OciHooks)
        if hook_owners:
            who = (f"plugins {hook_owners!r}" if "," in hook_owners
                   else f"plugin {hook_owners!r}")
            raise AdjustmentRejected(f"NRI default validator: {who} attempted restricted "
                                     "OCI hook injection")
    if has_adjust and owners is not None:
        owner = owners.simple.get(nri.SeccompPolicy)
        if owner:
            _check_seccomp(cfg, req, owner)
    if has_adjust and cfg.reject_namespace_adjustment and owners is not None:
        ns = owners.compound.get(nri.Namespace)
        if ns is not None and ns.owners:
            who = ", ".join(f"{p!r} (namespace {kind!r})"
                            for kind, p in sorted(ns.owners.items()))
            raise AdjustmentRejected(f"NRI default validator: attempted restricted namespace "
                                     f"adjustment by plugin(s) {who}")
    _check_required(cfg, req)
    if has_adjust and cfg.reject_sysctl_adjustment and owners is not None:
        sysctl = owners.compound.get(nri.Sysctl)
        setters = sorted({sysctl.owners[k] for k in req.adjust.linux.sysctl
                          if sysctl is not None and k in sysctl.owners})
        if setters:
            raise AdjustmentRejected(f"NRI default validator: attempted restricted sysctl "
                                     f"adjustment by plugin(s) {', '.join(setters)}")


def _check_seccomp(cfg: DefaultValidatorConfig, req: nri.ValidateContainerAdjustmentRequest,
                   owner: str) -> None:
    linux = req.container.linux
    profile = linux.seccomp_profile if linux.HasField("seccomp_profile") else None
    if profile is None or profile.profile_type == nri.SecurityProfile.UNCONFINED:
        refuse, kind = cfg.reject_unconfined_seccomp_adjustment, "unconfined"
    elif profile.profile_type == nri.SecurityProfile.RUNTIME_DEFAULT:
        refuse, kind = cfg.reject_runtime_default_seccomp_adjustment, "runtime default"
    else:
        refuse, kind = cfg.reject_custom_seccomp_adjustment, "custom"
    if refuse:
        raise AdjustmentRejected(f"NRI default validator: plugin {owner!r} attempted "
                                 f"restricted {kind} seccomp policy adjustment")


def _check_required(cfg: DefaultValidatorConfig,
                    req: nri.ValidateContainerAdjustmentRequest) -> None:
    container = req.container.name
    if cfg.tolerate_missing_plugins_annotation:
        value = effective_annotation(req.pod, cfg.tolerate_missing_plugins_annotation,
                                     container)
        if value is not None and _parse_bool(value, cfg.tolerate_missing_plugins_annotation):
            return
    required = list(cfg.required_plugins)
    value = effective_annotation(req.pod, REQUIRED_PLUGINS_ANNOTATION, container)
    if value is not None:
        required += _parse_list(value)
    if not required:
        return
    # A plugin is known by its name and by "<index>-<name>".
    present = {p.name for p in req.plugins} | {f"{p.index}-{p.name}" for p in req.plugins}
    missing = [r for r in required if r not in present]
    if len(missing) == 1:
        raise AdjustmentRejected(f"NRI default validator: required plugin {missing[0]!r} "
                                 "not present")
    if missing:
        raise AdjustmentRejected(f"NRI default validator: required plugins "
                                 f"{json.dumps(','.join(missing))} not present")
