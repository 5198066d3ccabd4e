"""Fixtures more than one unit test module uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crishim.config import TracingConfig
from crishim.observe import tracing


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on at every trace (rate 1000000), into memory."""
    exporter = InMemorySpanExporter()
    tracing.setup(TracingConfig(sampling_rate_per_million=1_000_000), exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()
