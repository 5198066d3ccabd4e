"""The Prometheus endpoint: RPC metrics, state gauges and image pull hooks over HTTP."""

from __future__ import annotations

import asyncio

import pytest

from crishim.observe import metrics


async def http_get(port: int, path: str) -> tuple[str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return head.splitlines()[0], body


def sample(body: str, name: str) -> float:
    line = next(x for x in body.splitlines() if x.startswith(name + " "))
    return float(line.rpartition(" ")[2])


async def test_endpoint_serves_rpc_state_and_pull_metrics() -> None:
    # The counters are process-wide: other tests' pulls may already have counted.
    pulled = metrics.REGISTRY.get_sample_value("crishim_image_pull_bytes_total") or 0.0
    failed = metrics.REGISTRY.get_sample_value("crishim_image_pulls_total",
                                               {"outcome": "failure"}) or 0.0
    metrics.observe_rpc("ListContainers", 0.002, None)
    metrics.observe_rpc("StartContainer", 0.01, "NOT_FOUND")
    metrics.observe_image_pull(1.5, ok=True, downloaded_bytes=1000)
    metrics.add_image_pull_bytes(234)
    metrics.observe_image_pull(0.5, ok=False)
    metrics.register_state_source("containers", lambda: {"running": 2, "exited": 1})
    metrics.register_state_source("pods", lambda: {"ready": 3})
    server = metrics.MetricsServer("127.0.0.1:0")
    await server.start()
    try:
        status, body = await http_get(server.port, "/metrics")
        assert "200" in status
        assert 'crishim_cri_operation_duration_seconds_count{method="ListContainers"}' in body
        assert ('crishim_cri_operation_errors_total{code="NOT_FOUND",method="StartContainer"}'
                in body)
        assert 'crishim_containers{state="running"} 2.0' in body
        assert 'crishim_pods{state="ready"} 3.0' in body
        assert sample(body, "crishim_image_pull_bytes_total") == pulled + 1234
        assert sample(body, 'crishim_image_pulls_total{outcome="failure"}') == failed + 1
        assert 'crishim_image_pull_duration_seconds_count{outcome="success"}' in body
        status, _ = await http_get(server.port, "/nope")
        assert "404" in status
    finally:
        metrics.unregister_state_source("containers")
        metrics.unregister_state_source("pods")
        await server.stop()


async def test_failing_state_source_does_not_break_scrape() -> None:
    def boom() -> dict[str, int]:
        raise RuntimeError("x")

    metrics.register_state_source("pods", boom)
    try:
        assert b"crishim_pods" in metrics.render()
    finally:
        metrics.unregister_state_source("pods")


def test_parse_address() -> None:
    assert metrics.parse_address("127.0.0.1:9090") == ("127.0.0.1", 9090)
    assert metrics.parse_address(":9090") == ("0.0.0.0", 9090)
    assert metrics.parse_address("[::1]:9090") == ("::1", 9090)
    with pytest.raises(ValueError):
        metrics.parse_address("localhost")


def test_config_rejects_bad_metrics_address() -> None:
    from crishim import config

    cfg = config.Config()
    cfg.metrics.address = "localhost"
    with pytest.raises(config.ConfigError, match=r"metrics\.address"):
        config.validate(cfg)


async def test_busy_port_is_a_clear_error() -> None:
    first = metrics.MetricsServer("127.0.0.1:0")
    await first.start()
    try:
        with pytest.raises(OSError, match=r"metrics\.address"):
            await metrics.MetricsServer(f"127.0.0.1:{first.port}").start()
    finally:
        await first.stop()


def test_rpc_latency_is_a_cumulative_histogram_per_method() -> None:
    name = "crishim_cri_operation_duration_seconds"

    def value(suffix: str, **labels: str) -> float:
        got = metrics.REGISTRY.get_sample_value(name + suffix, {"method": "Probe", **labels})
        return got or 0.0

    for seconds in (0.0003, 0.001, 0.002, 40.0):
        metrics.observe_rpc("Probe", seconds, None)
    assert value("_bucket", le="0.0005") == 1
    assert value("_bucket", le="0.001") == 2  # a bound is inclusive
    assert value("_bucket", le="0.0025") == 3  # cumulative
    assert value("_bucket", le="30.0") == 3
    assert value("_bucket", le="+Inf") == value("_count") == 4
    assert value("_sum") == pytest.approx(40.0033)
