"""crishim/observe/sampling.py decides as the SDK's ParentBased(TraceIdRatioBased) does."""

from __future__ import annotations

import random

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from crishim.observe.sampling import PerMillion


def _parent(sampled: bool, remote: bool) -> object:
    ctx = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331,
                      is_remote=remote, trace_flags=TraceFlags(1 if sampled else 0),
                      trace_state=TraceState([("k", "v")]))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


@pytest.mark.parametrize("per_million", [0, 1, 250_000, 999_999, 1_000_000])
def test_roots_as_the_sdk_decides(per_million: int) -> None:
    ours, sdk = PerMillion(per_million), ParentBased(TraceIdRatioBased(per_million / 1e6))
    rnd = random.Random(per_million)
    for _ in range(2000):
        tid = rnd.getrandbits(128)
        assert (ours.should_sample(None, tid, "x").decision ==
                sdk.should_sample(None, tid, "x").decision)


@pytest.mark.parametrize("sampled", [True, False])
@pytest.mark.parametrize("remote", [True, False])
def test_parent_decision_and_trace_state_followed(sampled: bool, remote: bool) -> None:
    ctx = _parent(sampled, remote)
    attrs = {"a": 1}
    for per_million in (1, 1_000_000):
        got = PerMillion(per_million).should_sample(ctx, 7, "x", attributes=attrs)
        want = ParentBased(TraceIdRatioBased(per_million / 1e6)).should_sample(
            ctx, 7, "x", attributes=attrs)
        assert got.decision == want.decision
        assert got.trace_state == want.trace_state
        assert dict(got.attributes) == dict(want.attributes)
