"""Container and pod stats, cAdvisor-style metrics, and their 1.36 streaming variants.

Thin: pick the records (filters as the kubelet sends them), let crishim.stats.targets map
them to collector targets and crishim.stats.collector read cgroups / layer usage / pod
network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context
from crishim.cri.batching import batches
from crishim.errors import InvalidArgument
from crishim.node.daemon import Daemon
from crishim.stats import descriptors
from crishim.stats.collector import ContainerTarget, PodTarget, StatsCollector
from crishim.stats.targets import container_target, pod_target
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox


def _labels_match(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class StatsRPCs:
    daemon: Daemon

    # -- record → target ------------------------------------------------------------------
    def _stats_collector(self) -> StatsCollector:
        return self.daemon.stats

    def _stats_container_target(self, c: Container) -> ContainerTarget:
        return container_target(c, self.daemon.containers.containers_dir)

    def _stats_pod_target(self, sb: Sandbox, containers: list[Container]) -> PodTarget:
        return pod_target(sb, containers, self.daemon.containers.containers_dir)

    def _stats_containers(self, flt: pb.ContainerStatsFilter | None) -> list[Container]:
        items: list[Container] = self.daemon.containers.list_containers(None)
        if flt is not None:
            if flt.id:
                items = [c for c in items if c.id.startswith(flt.id)]
            if flt.pod_sandbox_id:
                items = [c for c in items if c.pod_id.startswith(flt.pod_sandbox_id)]
            if flt.label_selector:
                items = [c for c in items if _labels_match(c.config.labels, flt.label_selector)]
        return items

    def _stats_pods(self, flt: pb.PodSandboxStatsFilter | None) -> list[PodTarget]:
        sandboxes: list[Sandbox] = self.daemon.sandboxes.list_sandboxes(None)
        if flt is not None:
            if flt.id:
                sandboxes = [s for s in sandboxes if s.id.startswith(flt.id)]
            if flt.label_selector:
                sandboxes = [s for s in sandboxes
                             if _labels_match(s.config.labels, flt.label_selector)]
        containers: list[Container] = self.daemon.containers.list_containers(None)
        return [self._stats_pod_target(s, containers) for s in sandboxes]

    def _stats_forget_gone(self) -> None:
        containers = {c.id for c in self.daemon.containers.list_containers(None)}
        pods = {s.id for s in self.daemon.sandboxes.list_sandboxes(None)}
        self._stats_collector().retain(containers, pods)

    async def _stats_list_container_stats(self, flt: pb.ContainerStatsFilter | None
                                    ) -> list[pb.ContainerStats]:
        self._stats_forget_gone()
        targets = [self._stats_container_target(c) for c in self._stats_containers(flt)]
        return await self._stats_collector().container_stats(targets)

    async def _stats_list_pod_stats(self, flt: pb.PodSandboxStatsFilter | None
                              ) -> list[pb.PodSandboxStats]:
        self._stats_forget_gone()
        return await self._stats_collector().pod_stats(self._stats_pods(flt))

    async def _stats_pod_metrics(self) -> list[pb.PodSandboxMetrics]:
        self._stats_forget_gone()
        return await self._stats_collector().pod_metrics(self._stats_pods(None))

    # -- unary ------------------------------------------------------------------------------
    async def ContainerStats(self, request: pb.ContainerStatsRequest,
                             context: Context) -> pb.ContainerStatsResponse:
        if not request.container_id:
            raise InvalidArgument("container_id is required")
        c: Container = self.daemon.containers.get(request.container_id)  # or NotFound
        (stats,) = await self._stats_collector().container_stats([self._stats_container_target(c)])
        return pb.ContainerStatsResponse(stats=stats)

    async def ListContainerStats(self, request: pb.ListContainerStatsRequest,
                                 context: Context) -> pb.ListContainerStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListContainerStatsResponse(stats=await self._stats_list_container_stats(flt))

    async def PodSandboxStats(self, request: pb.PodSandboxStatsRequest,
                              context: Context) -> pb.PodSandboxStatsResponse:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        sb: Sandbox = self.daemon.sandboxes.get(request.pod_sandbox_id)
        containers: list[Container] = self.daemon.containers.list_containers(None)
        (stats,) = await self._stats_collector().pod_stats([self._stats_pod_target(sb, containers)])
        return pb.PodSandboxStatsResponse(stats=stats)

    async def ListPodSandboxStats(self, request: pb.ListPodSandboxStatsRequest,
                                  context: Context) -> pb.ListPodSandboxStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListPodSandboxStatsResponse(stats=await self._stats_list_pod_stats(flt))

    async def ListMetricDescriptors(self, request: pb.ListMetricDescriptorsRequest,
                                    context: Context) -> pb.ListMetricDescriptorsResponse:
        return pb.ListMetricDescriptorsResponse(descriptors=descriptors.descriptors())

    async def ListPodSandboxMetrics(self, request: pb.ListPodSandboxMetricsRequest,
                                    context: Context) -> pb.ListPodSandboxMetricsResponse:
        return pb.ListPodSandboxMetricsResponse(pod_metrics=await self._stats_pod_metrics())

    # -- 1.36 streaming ---------------------------------------------------------------------
    async def StreamContainerStats(self, request: pb.StreamContainerStatsRequest,
                                   context: Context
                                   ) -> AsyncIterator[pb.StreamContainerStatsResponse]:
        flt = request.filter if request.HasField("filter") else None
        for batch in batches(await self._stats_list_container_stats(flt)):
            yield pb.StreamContainerStatsResponse(container_stats=batch)

    async def StreamPodSandboxStats(self, request: pb.StreamPodSandboxStatsRequest,
                                    context: Context
                                    ) -> AsyncIterator[pb.StreamPodSandboxStatsResponse]:
        flt = request.filter if request.HasField("filter") else None
        for batch in batches(await self._stats_list_pod_stats(flt)):
            yield pb.StreamPodSandboxStatsResponse(pod_sandbox_stats=batch)

    async def StreamPodSandboxMetrics(self, request: pb.StreamPodSandboxMetricsRequest,
                                      context: Context
                                      ) -> AsyncIterator[pb.StreamPodSandboxMetricsResponse]:
        for batch in batches(await self._stats_pod_metrics()):
            yield pb.StreamPodSandboxMetricsResponse(pod_sandbox_metrics=batch)

