"""Build what a CNI plugin is told about a pod: CNI_ARGS and runtimeConfig capabilities."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from crishim.errors import InvalidArgument
from crishim.network.types import Bandwidth, PodNetwork

# kubelet's convention for "unlimited burst" with the bandwidth plugin.
MAX_BURST = 2**31 - 1
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
# The limits kubelet enforces for these annotations (bits per second).
MIN_BPS = 1000
MAX_BPS = 10**15

_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1), "m": Decimal("0.001"),
    **{s: Decimal(10) ** (3 * i) for i, s in enumerate("kMGTPE", 1)},
    **{s + "i": Decimal(2) ** (10 * i) for i, s in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|m)$")


def parse_quantity(text: str) -> int:
    """A Kubernetes resource quantity ("10M", "1.5Gi", "500k") as an integer."""
    m = _QUANTITY.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a quantity like 10M or 1Gi")
    try:
        value = Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a quantity like 10M or 1Gi") from None
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def bandwidth_from_annotations(annotations: dict[str, str]) -> Bandwidth | None:
    """The pod's kubernetes.io/{ingress,egress}-bandwidth annotations, as kubelet reads them."""
    rates: dict[str, int] = {}
    for key, attr in ((INGRESS_ANNOTATION, "ingress_bps"), (EGRESS_ANNOTATION, "egress_bps")):
        if key not in annotations:
            continue
        try:
            bps = parse_quantity(annotations[key])
        except ValueError as exc:
            raise InvalidArgument(f"annotation {key}: {exc}") from None
        if not MIN_BPS <= bps <= MAX_BPS:
            raise InvalidArgument(f"annotation {key}: {annotations[key]} is outside "
                                  f"1k..1P bits per second")
        rates[attr] = bps
    return Bandwidth(**rates) if rates else None


def cni_args(pod_id: str, pod: PodNetwork) -> str:
    pairs = [("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", pod.namespace),
             ("K8S_POD_NAME", pod.name), ("K8S_POD_INFRA_CONTAINER_ID", pod_id),
             ("K8S_POD_UID", pod.uid)]
    return ";".join(f"{k}={v}" for k, v in pairs)


def runtime_config(pod: PodNetwork, pod_cidr: str) -> dict[str, Any]:
    """Every capability value crishim can offer; `plugin_runtime_config` filters per plugin."""
    rc: dict[str, Any] = {}
    mappings = []
    for pm in pod.port_mappings:
        if pm.host_port <= 0:
            continue  # only hostPort mappings are the network's business
        entry: dict[str, Any] = {"hostPort": pm.host_port, "containerPort": pm.container_port,
                                 "protocol": (pm.protocol or "tcp").lower()}
        if pm.host_ip:
            entry["hostIP"] = pm.host_ip
        mappings.append(entry)
    if mappings:
        rc["portMappings"] = mappings
    bw = pod.bandwidth if pod.bandwidth is not None else bandwidth_from_annotations(
        pod.annotations)
    if bw is not None and (bw.ingress_bps or bw.egress_bps):
        shaping: dict[str, int] = {}
        if bw.ingress_bps:
            shaping.update(ingressRate=bw.ingress_bps, ingressBurst=MAX_BURST)
        if bw.egress_bps:
            shaping.update(egressRate=bw.egress_bps, egressBurst=MAX_BURST)
        rc["bandwidth"] = shaping
    cidrs = [c.strip() for c in pod_cidr.split(",") if c.strip()]
    if cidrs:
        rc["ipRanges"] = [[{"subnet": c}] for c in cidrs]
    if pod.dns is not None and (pod.dns.servers or pod.dns.searches or pod.dns.options):
        rc["dns"] = {"servers": list(pod.dns.servers), "searches": list(pod.dns.searches),
                     "options": list(pod.dns.options)}
    if pod.cgroup_parent:
        rc["cgroupPath"] = pod.cgroup_parent
    if pod.annotations:
        rc["io.kubernetes.cri.pod-annotations"] = dict(pod.annotations)
    return rc


def plugin_runtime_config(plugin: dict[str, Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The subset of `offered` the plugin declared under "capabilities"."""
    caps = plugin.get("capabilities")
    if not isinstance(caps, dict):
        return {}
    return {k: v for k, v in offered.items() if caps.get(k) is True}
