"""missing_cgroup_controller = "fail": a resource the host cannot enforce is refused."""

from __future__ import annotations

import json

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.daemon import running_daemon


def test_fail_policy_refuses_what_the_host_cannot_enforce(busybox_ref: str) -> None:
    with running_daemon('missing_cgroup_controller = "fail"\n') as d:
        info = json.loads(d.runtime().Status(pb.StatusRequest(verbose=True),
                                             timeout=15).info["cgroups"])
        assert info["missingPolicy"] == "fail"
        if "hugetlb" not in info["missing"]:
            pytest.skip("this host has a hugetlb controller: nothing to refuse")
        d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=busybox_ref)),
                             timeout=120)
        pod_cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name="p", namespace="e2e", uid="u-policy"),
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE))))
        rt = d.runtime()
        pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_cfg),
                                  timeout=60).pod_sandbox_id
        try:
            res = pb.LinuxContainerResources(
                cpu_shares=2, hugepage_limits=[pb.HugepageLimit(page_size="2MB")])
            cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"),
                                     image=pb.ImageSpec(image=busybox_ref),
                                     command=["sleep", "60"],
                                     linux=pb.LinuxContainerConfig(resources=res))
            with pytest.raises(grpc.RpcError) as err:
                rt.CreateContainer(pb.CreateContainerRequest(
                    pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg), timeout=60)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "hugetlb" in (err.value.details() or "")
            # Nothing was left behind by the refused create.
            assert not rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers
            # Without the hugepage part the same container is fine.
            del res.hugepage_limits[:]
            cfg.linux.resources.CopyFrom(res)
            rt.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg), timeout=60)
        finally:
            rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
            rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
