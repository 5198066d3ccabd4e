"""Prometheus metrics (exposed only when `metrics.address` is set)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

RPC_LATENCY = Histogram(
    "crishim_cri_operation_duration_seconds", "Latency of CRI RPCs", ["method"],
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RPC_ERRORS = Counter(
    "crishim_cri_operation_errors_total", "CRI RPCs that returned an error", ["method", "code"],
    registry=REGISTRY,
)


def observe_rpc(method: str, seconds: float, code: str | None) -> None:
    RPC_LATENCY.labels(method).observe(seconds)
    if code is not None:
        RPC_ERRORS.labels(method, code).inc()
