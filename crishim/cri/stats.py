"""Container and pod stats, cAdvisor-style metrics, and their 1.36 streaming variants.

Thin: pick the records (filters as the kubelet sends them), let crishim.stats.targets map
them to collector targets and crishim.stats.collector read cgroups / layer usage / pod
network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.registry import pod_of
from crishim.cri.base import Context
from crishim.cri.batching import batches
from crishim.errors import InvalidArgument
from crishim.node.daemon import Daemon
from crishim.stats import descriptors
from crishim.stats.collector import ContainerTarget, PodTarget
from crishim.stats.targets import container_target, pod_target
from crishim.store.container import Container
from crishim.store.registry import select
from crishim.store.sandbox import Sandbox


def _container_target(daemon: Daemon, c: Container) -> ContainerTarget:
    return container_target(c, daemon.containers.containers_dir,
                            daemon.containers.parts.rootfs_sizes.quotas.device)


def _pod_target(daemon: Daemon, sb: Sandbox, containers: list[Container]) -> PodTarget:
    return pod_target(sb, containers, daemon.containers.containers_dir,
                      daemon.containers.parts.rootfs_sizes.quotas.device)


def _pod_targets(daemon: Daemon, flt: pb.PodSandboxStatsFilter | None) -> list[PodTarget]:
    sandboxes = select(daemon.sandboxes.list_sandboxes(None), flt)
    containers: list[Container] = daemon.containers.list_containers(None)
    return [_pod_target(daemon, s, containers) for s in sandboxes]


def _forget_gone(daemon: Daemon) -> None:
    containers = {c.id for c in daemon.containers.list_containers(None)}
    pods = {s.id for s in daemon.sandboxes.list_sandboxes(None)}
    daemon.stats.retain(containers, pods)


async def _container_stats(daemon: Daemon, flt: pb.ContainerStatsFilter | None
                           ) -> list[pb.ContainerStats]:
    _forget_gone(daemon)
    containers = select(daemon.containers.list_containers(None), flt, pod_of)
    return await daemon.stats.container_stats([_container_target(daemon, c)
                                               for c in containers])


async def _pod_stats(daemon: Daemon, flt: pb.PodSandboxStatsFilter | None
                     ) -> list[pb.PodSandboxStats]:
    _forget_gone(daemon)
    return await daemon.stats.pod_stats(_pod_targets(daemon, flt))


async def _pod_metrics(daemon: Daemon) -> list[pb.PodSandboxMetrics]:
    _forget_gone(daemon)
    return await daemon.stats.pod_metrics(_pod_targets(daemon, None))


class StatsRPCs:
    daemon: Daemon

    # -- unary ------------------------------------------------------------------------------
    async def ContainerStats(self, request: pb.ContainerStatsRequest,
                             context: Context) -> pb.ContainerStatsResponse:
        if not request.container_id:
            raise InvalidArgument("container_id is required")
        c: Container = self.daemon.containers.get(request.container_id)  # or NotFound
        (stats,) = await self.daemon.stats.container_stats([_container_target(self.daemon, c)])
        return pb.ContainerStatsResponse(stats=stats)

    async def ListContainerStats(self, request: pb.ListContainerStatsRequest,
                                 context: Context) -> pb.ListContainerStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListContainerStatsResponse(stats=await _container_stats(self.daemon, flt))

    async def PodSandboxStats(self, request: pb.PodSandboxStatsRequest,
                              context: Context) -> pb.PodSandboxStatsResponse:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        sb: Sandbox = self.daemon.sandboxes.get(request.pod_sandbox_id)
        containers: list[Container] = self.daemon.containers.list_containers(None)
        (stats,) = await self.daemon.stats.pod_stats([_pod_target(self.daemon, sb, containers)])
        return pb.PodSandboxStatsResponse(stats=stats)

    async def ListPodSandboxStats(self, request: pb.ListPodSandboxStatsRequest,
                                  context: Context) -> pb.ListPodSandboxStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListPodSandboxStatsResponse(stats=await _pod_stats(self.daemon, flt))

    async def ListMetricDescriptors(self, request: pb.ListMetricDescriptorsRequest,
                                    context: Context) -> pb.ListMetricDescriptorsResponse:
        return pb.ListMetricDescriptorsResponse(descriptors=descriptors.descriptors())

    async def ListPodSandboxMetrics(self, request: pb.ListPodSandboxMetricsRequest,
                                    context: Context) -> pb.ListPodSandboxMetricsResponse:
        return pb.ListPodSandboxMetricsResponse(pod_metrics=await _pod_metrics(self.daemon))

    # -- 1.36 streaming ---------------------------------------------------------------------
    async def StreamContainerStats(self, request: pb.StreamContainerStatsRequest,
                                   context: Context
                                   ) -> AsyncIterator[pb.StreamContainerStatsResponse]:
        flt = request.filter if request.HasField("filter") else None
        for batch in batches(await _container_stats(self.daemon, flt)):
            yield pb.StreamContainerStatsResponse(container_stats=batch)

    async def StreamPodSandboxStats(self, request: pb.StreamPodSandboxStatsRequest,
                                    context: Context
                                    ) -> AsyncIterator[pb.StreamPodSandboxStatsResponse]:
        flt = request.filter if request.HasField("filter") else None
        for batch in batches(await _pod_stats(self.daemon, flt)):
            yield pb.StreamPodSandboxStatsResponse(pod_sandbox_stats=batch)

    async def StreamPodSandboxMetrics(self, request: pb.StreamPodSandboxMetricsRequest,
                                      context: Context
                                      ) -> AsyncIterator[pb.StreamPodSandboxMetricsResponse]:
        for batch in batches(await _pod_metrics(self.daemon)):
            yield pb.StreamPodSandboxMetricsResponse(pod_sandbox_metrics=batch)

