"""Status announces only the runtime handlers the start-up probe found usable."""

from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config, RuntimeHandler
from crishim.cri.status import StatusRPCs, node_features
from crishim.host.cgroups import CgroupFacts
from crishim.host.facts import HostFacts
from crishim.host.runtimes import RuntimeFeatures
from crishim.host.tools import ToolVersions
from crishim.runtime.runc import RuntimeRegistry

V1_HYBRID = HostFacts(cgroups=CgroupFacts.everything(1),
                      hybrid_v2_controllers=frozenset({"hugetlb"}))


def _runtime(path: str, version: str) -> str:
    with open(path, "w") as fh:
        fh.write(f"""#!/bin/sh
case "$1" in
  --version) echo "{version}";;
  features) echo '{{"mountOptions":[]}}';;
  *) exit 1;;
esac
""")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


class _Network:
    loader = SimpleNamespace(last=lambda: SimpleNamespace(path="/cni", raw={}, binaries=[]))

    async def status(self) -> tuple[bool, str]:
        return True, ""


async def _status(tmp: str, default: str, verbose: bool = False) -> pb.StatusResponse:
    cfg = Config(root=os.path.join(tmp, "r"), state=os.path.join(tmp, "s"),
                 conmon_path="/bin/sh", default_runtime=default,
                 runtimes={"runc": RuntimeHandler(_runtime(os.path.join(tmp, "runc"),
                                                           "runc version 1.1.5")),
                           "crun": RuntimeHandler(_runtime(os.path.join(tmp, "crun"),
                                                           "crun version 1.8.1"))})
    runtimes = RuntimeRegistry(cfg, V1_HYBRID)
    await runtimes.probe()
    servicer = StatusRPCs()
    daemon: Any = SimpleNamespace(
        cfg=cfg, runtimes=runtimes, network=_Network(),
        runtime_features={"runc": RuntimeFeatures(b"{}", recursive_read_only_mounts=True)},
        tools=ToolVersions({"conmon": "conmon version 2.1.0"}),
        host=V1_HYBRID, pod_cidr="", apparmor=SimpleNamespace(info=lambda: {}),
        nri=SimpleNamespace(cfg=SimpleNamespace(enable=False), listening_on="",
                            describe=lambda: []))
    servicer.daemon = daemon
    return await servicer.Status(pb.StatusRequest(verbose=verbose),
                                 None)  # type: ignore[arg-type]


async def test_an_unusable_handler_is_not_announced(tmp_path: object) -> None:
    resp = await _status(str(tmp_path), "runc")
    assert [h.name for h in resp.runtime_handlers] == ["", "runc"]
    conds = {c.type: c for c in resp.status.conditions}
    assert conds["RuntimeReady"].status


async def test_an_unusable_default_handler_makes_the_runtime_not_ready(
        tmp_path: object) -> None:
    resp = await _status(str(tmp_path), "crun")
    assert [h.name for h in resp.runtime_handlers] == ["runc"]  # no "" either
    ready = {c.type: c for c in resp.status.conditions}["RuntimeReady"]
    assert not ready.status and ready.reason == "RuntimeHandlerCannotRun"
    assert "'crun'" in ready.message and "hybrid" in ready.message


async def test_features_and_versions_are_reported_as_probed_at_start(
        tmp_path: object) -> None:
    resp = await _status(str(tmp_path), "runc", verbose=True)
    runc = {h.name: h.features for h in resp.runtime_handlers}["runc"]
    assert runc.recursive_read_only_mounts and not runc.user_namespaces
    versions = json.loads(resp.info["versions"])
    assert versions["runc"] == "runc version 1.1.5"
    assert versions["crun"] == "crun version 1.8.1"
    assert versions["conmon"] == "conmon version 2.1.0"
    assert "crishim" in versions


async def test_node_features(tmp_path: object) -> None:
    resp = await _status(str(tmp_path), "runc")
    assert resp.features.supplemental_groups_policy and resp.features.mount_options
    # No handler here takes user namespaces, so neither does a host-network pod.
    assert not resp.features.user_namespaces_host_network
    with_userns = node_features([pb.RuntimeHandlerFeatures(),
                                 pb.RuntimeHandlerFeatures(user_namespaces=True)])
    assert with_userns.user_namespaces_host_network and with_userns.mount_options
