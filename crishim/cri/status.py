"""Version, Status, RuntimeConfig and UpdateRuntimeConfig."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import shutil
from typing import Any

from crishim import __version__
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import as_dict
from crishim.cri.base import Context
from crishim.errors import InvalidArgument
from crishim.host.runtimes import RuntimeFeatures
from crishim.network.cni_config import CNIConfigError
from crishim.node.daemon import Daemon

# Version.version is the version of the CRI API the runtime speaks (kubelet convention).
CRI_API_VERSION = "0.1.0"


_VERSION = pb.VersionResponse(version=CRI_API_VERSION, runtime_name="crishim",
                              runtime_version=__version__, runtime_api_version="v1")
_VERSION_REPLY = _VERSION.SerializeToString()


def node_features(handlers: list[pb.RuntimeHandlerFeatures]) -> pb.RuntimeFeatures:
    """Status.features: supplemental groups policies; the bind-mount flags of
    Mount.mount_options (runc and crun both set noexec, nodev and nosuid on a bind); a
    user namespace with the host's network wherever a handler takes user namespaces (the
    pod then binds the host's /sys, which it may not mount: oci/spec.py bind_host_sys)."""
    return pb.RuntimeFeatures(
        supplemental_groups_policy=True, mount_options=True,
        user_namespaces_host_network=any(h.user_namespaces for h in handlers))


def handler_features(found: RuntimeFeatures | None) -> pb.RuntimeHandlerFeatures:
    """What Status.runtime_handlers[].features says of a handler (nothing when unknown)."""
    if found is None:
        return pb.RuntimeHandlerFeatures()
    return pb.RuntimeHandlerFeatures(
        recursive_read_only_mounts=found.recursive_read_only_mounts,
        user_namespaces=found.user_namespaces)


class StatusRPCs:
    daemon: Daemon

    async def Version(self, request: pb.VersionRequest, context: Context) -> pb.VersionResponse:
        return _VERSION

    def answer_version(self, raw: bytes) -> bytes:
        """The kubelet's liveness check. The request is parsed only to refuse one that is
        not a VersionRequest (the handler then reports it)."""
        pb.VersionRequest.FromString(raw)
        return _VERSION_REPLY

    def _runtime_condition(self) -> pb.RuntimeCondition:
        cfg = self.daemon.cfg
        handler = cfg.runtimes[cfg.default_runtime]
        missing = [p for p in (handler.path, cfg.conmon_path) if shutil.which(p) is None]
        if missing:
            return pb.RuntimeCondition(type="RuntimeReady", status=False,
                                       reason="RuntimeBinaryMissing",
                                       message="not found on PATH: " + ", ".join(missing))
        default = self.daemon.runtimes.readiness("")
        if not default.ready:
            return pb.RuntimeCondition(type="RuntimeReady", status=False,
                                       reason="RuntimeHandlerCannotRun",
                                       message=f"default runtime handler "
                                               f"{cfg.default_runtime!r}: {default.reason}")
        return pb.RuntimeCondition(type="RuntimeReady", status=True)

    async def _network(self) -> tuple[pb.RuntimeCondition, dict[str, Any]]:
        """NetworkReady (config found, plugins present, CNI 1.1 STATUS passing), and what
        `crictl info` shows as cniconfig. The network manager caches the config by mtime,
        so the kubelet's Status poll does not re-read the conf dir every time."""
        network = self.daemon.network
        ready, reason = await network.status()
        try:
            net = network.loader.last()  # what status() has just read
            cni_info: dict[str, Any] = {"path": net.path, "config": net.raw,
                                        "plugins": net.binaries}
        except CNIConfigError as exc:
            cni_info = {"error": str(exc)}
        if not ready:
            return (pb.RuntimeCondition(type="NetworkReady", status=False,
                                        reason="NetworkPluginNotReady",
                                        message=f"Network plugin returns error: {reason}"),
                    cni_info)
        return pb.RuntimeCondition(type="NetworkReady", status=True), cni_info

    async def Status(self, request: pb.StatusRequest, context: Context) -> pb.StatusResponse:
        cfg = self.daemon.cfg
        network, cni_info = await self._network()
        # The binaries are looked up on PATH: stats of disk directories, off the loop.
        runtime = await asyncio.to_thread(self._runtime_condition)
        status = pb.RuntimeStatus(conditions=[runtime, network])
        # Only the handlers that can run here (the start-up probe; verbose info says why
        # the others cannot): the kubelet takes each listed one as usable.
        runtimes = self.daemon.runtimes
        names = [n for n in cfg.runtimes if runtimes.readiness(n).ready]
        probed = self.daemon.runtime_features
        features = [handler_features(probed.get(n)) for n in names]
        handlers = [pb.RuntimeHandler(name=name, features=f)
                    for name, f in zip(names, features, strict=True)]
        # The default handler is also reachable as "" (no RuntimeClass).
        if cfg.default_runtime in names:
            handlers.insert(0, pb.RuntimeHandler(
                name="", features=features[names.index(cfg.default_runtime)]))
        info: dict[str, str] = {}
        if request.verbose:
            ready = {n: runtimes.readiness(n) for n in cfg.runtimes}
            info["runtimeHandlers"] = json.dumps({
                n: {"ready": r.ready, "reason": r.reason, "version": r.version}
                for n, r in ready.items()})
            info["config"] = json.dumps(as_dict(cfg))
            # As found at start: the runtimes' by their probe, the other tools' by
            # host/tools.py; a runtime without a version says why it has none.
            versions = {n: r.version or r.reason for n, r in ready.items()}
            info["versions"] = json.dumps({"crishim": __version__, **versions,
                                           **self.daemon.tools.versions})
            info["podCIDR"] = json.dumps(self.daemon.pod_cidr)
            info["cniconfig"] = json.dumps(cni_info)
            cgroups = self.daemon.host.cgroups
            info["cgroups"] = json.dumps({
                "version": cgroups.version, "controllers": sorted(cgroups.controllers),
                "missing": cgroups.missing(), "missingPolicy": cfg.missing_cgroup_controller})
            info["apparmor"] = json.dumps(self.daemon.apparmor.info())
            nri = self.daemon.nri
            info["nri"] = json.dumps({"enabled": nri.cfg.enable,
                                      "socket": nri.listening_on, "plugins": nri.describe()})
        return pb.StatusResponse(status=status, info=info, runtime_handlers=handlers,
                                 features=node_features(features))

    async def RuntimeConfig(self, request: pb.RuntimeConfigRequest,
                            context: Context) -> pb.RuntimeConfigResponse:
        driver = (pb.CgroupDriver.SYSTEMD if self.daemon.cfg.effective_cgroup_driver() == "systemd"
                  else pb.CgroupDriver.CGROUPFS)
        return pb.RuntimeConfigResponse(linux=pb.LinuxRuntimeConfiguration(cgroup_driver=driver))

    async def UpdateRuntimeConfig(self, request: pb.UpdateRuntimeConfigRequest,
                                  context: Context) -> pb.UpdateRuntimeConfigResponse:
        cidr = request.runtime_config.network_config.pod_cidr
        if cidr:
            for part in cidr.split(","):
                try:
                    ipaddress.ip_network(part.strip(), strict=False)
                except ValueError:
                    raise InvalidArgument(f"pod_cidr {part!r} is not a CIDR") from None
            await self.daemon.set_pod_cidr(cidr)
        return pb.UpdateRuntimeConfigResponse()
