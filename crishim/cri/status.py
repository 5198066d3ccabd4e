"""Version, Status, RuntimeConfig and UpdateRuntimeConfig."""

from __future__ import annotations

import ipaddress
import json
import shutil

from crishim import __version__
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import as_dict
from crishim.cri.base import Context
from crishim.daemon import Daemon
from crishim.errors import InvalidArgument
from crishim.hostinfo import tool_version
from crishim.network.cni_config import CNIConfigError, load_default_network

# Version.version is the version of the CRI API the runtime speaks (kubelet convention).
CRI_API_VERSION = "0.1.0"


class StatusRPCs:
    daemon: Daemon

    async def Version(self, request: pb.VersionRequest, context: Context) -> pb.VersionResponse:
        return pb.VersionResponse(version=CRI_API_VERSION, runtime_name="crishim",
                                  runtime_version=__version__, runtime_api_version="v1")

    def _runtime_condition(self) -> pb.RuntimeCondition:
        cfg = self.daemon.cfg
        handler = cfg.runtimes[cfg.default_runtime]
        missing = [p for p in (handler.path, cfg.conmon_path) if shutil.which(p) is None]
        if missing:
            return pb.RuntimeCondition(type="RuntimeReady", status=False,
                                       reason="RuntimeBinaryMissing",
                                       message="not found on PATH: " + ", ".join(missing))
        return pb.RuntimeCondition(type="RuntimeReady", status=True)

    def _network_condition(self) -> pb.RuntimeCondition:
        cni = self.daemon.cfg.cni
        try:
            load_default_network(cni.conf_dir, cni.bin_dirs)
        except CNIConfigError as exc:
            return pb.RuntimeCondition(type="NetworkReady", status=False,
                                       reason="NetworkPluginNotReady",
                                       message=f"Network plugin returns error: {exc}")
        return pb.RuntimeCondition(type="NetworkReady", status=True)

    async def Status(self, request: pb.StatusRequest, context: Context) -> pb.StatusResponse:
        status = pb.RuntimeStatus(conditions=[self._runtime_condition(),
                                              self._network_condition()])
        handlers = [pb.RuntimeHandler(name=name, features=pb.RuntimeHandlerFeatures())
                    for name in self.daemon.cfg.runtimes]
        # The default handler is also reachable as "" (no RuntimeClass).
        handlers.insert(0, pb.RuntimeHandler(name="", features=pb.RuntimeHandlerFeatures()))
        info: dict[str, str] = {}
        if request.verbose:
            cfg = self.daemon.cfg
            versions = {name: await tool_version(h.path) for name, h in cfg.runtimes.items()}
            versions["conmon"] = await tool_version(cfg.conmon_path)
            info["config"] = json.dumps(as_dict(cfg))
            info["versions"] = json.dumps({"crishim": __version__, **versions})
            info["podCIDR"] = json.dumps(self.daemon.pod_cidr)
            try:
                net = load_default_network(cfg.cni.conf_dir, cfg.cni.bin_dirs)
                info["cniconfig"] = json.dumps({"path": net.path, "config": net.raw,
                                                "plugins": net.binaries})
            except CNIConfigError as exc:
                info["cniconfig"] = json.dumps({"error": str(exc)})
        return pb.StatusResponse(status=status, info=info, runtime_handlers=handlers,
                                 features=pb.RuntimeFeatures(supplemental_groups_policy=True))

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
