"""Pure statistics over latency samples (seconds)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) with linear interpolation; NaN for no samples."""
    if not samples:
        return math.nan
    data = sorted(samples)
    if len(data) == 1:
        return data[0]
    rank = (p / 100.0) * (len(data) - 1)
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return data[lo] + (data[hi] - data[lo]) * (rank - lo)


def p50(samples: Sequence[float]) -> float:
    return percentile(samples, 50)


def p90(samples: Sequence[float]) -> float:
    return percentile(samples, 90)


def summary(samples: Sequence[float]) -> dict[str, float]:
    """p50/p90/min/max/n of a sample list, JSON-friendly."""
    return {"p50": p50(samples), "p90": p90(samples),
            "min": min(samples) if samples else math.nan,
            "max": max(samples) if samples else math.nan,
            "n": float(len(samples))}


def ratio(a: float | None, b: float | None) -> float | None:
    """a/b, or None when either side is missing or b is zero."""
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return None
    return a / b
