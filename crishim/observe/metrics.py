"""Prometheus metrics (exposed only when `metrics.address` is set).

- RPC latency histograms and error counters (observe_rpc, called by cri/base.py on the
  loop as each call ends: plain bucket counts, made a histogram when scraped)
- pods and containers by state: managers register a callback (`register_state_source`)
  that is asked for counts at scrape time, so there is no bookkeeping to drift
- image pulls: `observe_image_pull(seconds, ok)` per pull and `add_image_pull_bytes(n)`
  per downloaded blob, from the image manager
- `MetricsServer`: a small asyncio HTTP server for GET /metrics on the daemon's loop, so
  collectors read manager state from the loop thread that owns it
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from crishim.log import get_logger

log = get_logger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

RPC_ERRORS = Counter(
    "crishim_cri_operation_errors_total", "CRI RPCs that returned an error", ["method", "code"],
    registry=REGISTRY,
)
IMAGE_PULL_BYTES = Counter(
    "crishim_image_pull_bytes_total", "Bytes downloaded by image pulls", registry=REGISTRY,
)
IMAGE_PULLS = Counter(
    "crishim_image_pulls_total", "Image pulls by outcome", ["outcome"], registry=REGISTRY,
)
IMAGE_PULLS_IN_PROGRESS = Gauge(
    "crishim_image_pulls_in_progress", "Image pulls running now (one per image, however many "
    "clients wait for it)", registry=REGISTRY,
)
IMAGE_PULL_DURATION = Histogram(
    "crishim_image_pull_duration_seconds", "Duration of image pulls (successful and failed)",
    ["outcome"], registry=REGISTRY,
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)


# The steps of a CRI call that run something outside crishim, as the spans name them
# (observe/tracing.py): how long each CNI plugin, OCI runtime command, NRI plugin call and
# layer phase takes, whether tracing is on or not.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                60, 120)
CNI_PLUGIN_DURATION = Histogram(
    "crishim_cni_plugin_duration_seconds", "One run of one CNI plugin, by plugin and command",
    ["plugin", "command"], registry=REGISTRY, buckets=STEP_BUCKETS,
)
OCI_RUNTIME_DURATION = Histogram(
    "crishim_oci_runtime_duration_seconds",
    "One command of the OCI runtime (create through conmon counts as conmon_create)",
    ["runtime", "command"], registry=REGISTRY, buckets=STEP_BUCKETS,
)
NRI_PLUGIN_DURATION = Histogram(
    "crishim_nri_plugin_duration_seconds", "One call to one NRI plugin, by plugin and event",
    ["plugin", "method"], registry=REGISTRY, buckets=STEP_BUCKETS,
)
IMAGE_LAYER_DURATION = Histogram(
    "crishim_image_layer_duration_seconds",
    "A pulled layer's phases: fetch (its download, verified and unpacked as it arrives), "
    "unpack (what was left after the last byte), commit", ["phase"], registry=REGISTRY,
    buckets=STEP_BUCKETS,
)


class _Timed:
    """Observes the time its `with` block took into one histogram child."""

    __slots__ = ("_child", "_start")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._child.observe(time.perf_counter() - self._start)


def timed(histogram: Histogram, *labels: str) -> _Timed:
    """`with timed(CNI_PLUGIN_DURATION, "bridge", "ADD"):` — the block's seconds, failed
    or not."""
    return _Timed(histogram.labels(*labels))


class _LoopHistogram(Collector):
    """A latency histogram by method, owned by the event loop: an observation is a bisect
    and two additions (0.3 µs warm; prometheus_client's Histogram takes a lock, 1.8 µs),
    made inline as a call ends. Deferred with call_soon, it would cost the loop one more
    turn after each reply before it sleeps, and a client woken on the same CPU would wait
    for that turn (a sixth of a relist's time with a hundred pods). Made cumulative when
    scraped, on the same loop."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name, self.documentation, self.buckets = name, documentation, buckets
        self._le = [str(float(b)) for b in buckets] + ["+Inf"]  # as prometheus_client writes them
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, method: str, seconds: float) -> None:
        counts = self._counts.get(method)
        if counts is None:
            counts = self._counts[method] = [0] * (len(self.buckets) + 1)
            self._sums[method] = 0.0
        counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self._sums[method] += seconds

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["method"])
        for method, counts in self._counts.items():
            cumulative = itertools.accumulate(counts)
            family.add_metric([method], list(zip(self._le, cumulative, strict=True)),
                              self._sums[method])
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=["method"])


RPC_LATENCY = _LoopHistogram(
    "crishim_cri_operation_duration_seconds", "Latency of CRI RPCs",
    (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
REGISTRY.register(RPC_LATENCY)


def observe_rpc(method: str, seconds: float, code: str | None) -> None:
    """On the event loop's thread only (RPC_LATENCY has no lock)."""
    RPC_LATENCY.observe(method, seconds)
    if code is not None:
        RPC_ERRORS.labels(method, code).inc()


def observe_image_pull(seconds: float, ok: bool = True, downloaded_bytes: int = 0) -> None:
    """Called once per image pull (not per waiting client), successful or not."""
    outcome = "success" if ok else "failure"
    add_image_pull_bytes(downloaded_bytes)
    IMAGE_PULLS.labels(outcome).inc()
    IMAGE_PULL_DURATION.labels(outcome).observe(seconds)


def add_image_pull_bytes(n: int) -> None:
    """Bytes fetched from a registry (call per layer/blob download as it completes)."""
    if n > 0:
        IMAGE_PULL_BYTES.inc(n)


StateSource = Callable[[], Mapping[str, int]]


class _StateCollector(Collector):
    """crishim_pods{state=...} and crishim_containers{state=...} from registered callbacks."""

    def __init__(self) -> None:
        self.sources: dict[str, StateSource] = {}

    def collect(self) -> Iterator[Metric]:
        for kind, help_ in (("pods", "Pod sandboxes by state"),
                            ("containers", "Containers by state")):
            family = GaugeMetricFamily(f"crishim_{kind}", help_, labels=["state"])
            source = self.sources.get(kind)
            if source is not None:
                try:
                    counts = source()
                except Exception as exc:  # a scrape must not fail because of one source
                    log.warning("metrics state source failed", kind=kind, error=exc)
                    counts = {}
                for state, n in sorted(counts.items()):
                    family.add_metric([state], n)
            yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


_STATES = _StateCollector()
REGISTRY.register(_STATES)


def register_state_source(kind: str, source: StateSource) -> None:
    """kind is "pods" or "containers"; `source()` returns {state name: count}."""
    if kind not in ("pods", "containers"):
        raise ValueError(f"unknown state source kind {kind!r}")
    _STATES.sources[kind] = source


def state_counter(list_records: Callable[[], Iterable[Any]],
                  state_name: Callable[[int], str]) -> StateSource:
    """A StateSource counting records by `.state`, named like "running"/"ready"."""
    def count() -> dict[str, int]:
        counts: dict[str, int] = {}
        for rec in list_records():
            name = state_name(rec.state).lower().split("_", 1)[-1]
            counts[name] = counts.get(name, 0) + 1
        return counts
    return count


def unregister_state_source(kind: str) -> None:
    _STATES.sources.pop(kind, None)


def render() -> bytes:
    return generate_latest(REGISTRY)


def parse_address(address: str) -> tuple[str, int]:
    """'host:port', '[v6]:port' or ':port' → (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics.address must be host:port, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class MetricsServer:
    """GET /metrics on `address`; anything else is 404. HTTP/1.0, one request/connection."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        host, port = parse_address(self.address)
        try:
            self._server = await asyncio.start_server(self._handle, host, port)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics endpoint {self.address} (metrics.address): "
                          f"{exc.strerror}") from None
        log.info("metrics endpoint serving", address=f"{host}:{self.port}")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass  # headers are not needed
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            if len(parts) >= 2 and parts[0] in ("GET", "HEAD") and path == "/metrics":
                body = render()
                status, ctype = "200 OK", CONTENT_TYPE_LATEST
            else:
                body, status, ctype = b"not found; try /metrics\n", "404 Not Found", "text/plain"
            head = (f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            writer.write(head if parts and parts[0] == "HEAD" else head + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
