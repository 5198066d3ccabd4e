"""usage_nano_cores: CPU rate between the previous sample of an id and the current one.

Callers (kubelet every ~10 s, crictl stats, the metrics endpoint) share one tracker, so a
sample is kept as the new baseline only if it is at least `min_interval` after the
previous baseline; a burst of calls inside that window reuses the last computed rate
instead of dividing by a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable

NANOS = 1_000_000_000


class CpuRateTracker:
    def __init__(self, min_interval: float = 1.0) -> None:
        self.min_interval_ns = int(min_interval * NANOS)
        # id → (usage_ns, timestamp_ns) of the baseline sample, and the last rate.
        self._prev: dict[str, tuple[int, int]] = {}
        self._rate: dict[str, int] = {}

    def update(self, key: str, usage_ns: int, timestamp_ns: int) -> int | None:
        """Record a sample; return nano-cores since the baseline (None on the first)."""
        prev = self._prev.get(key)
        if prev is None or usage_ns < prev[0] or timestamp_ns <= prev[1]:
            # First sample, or the counter went backwards (cgroup re-created): new baseline.
            self._prev[key] = (usage_ns, timestamp_ns)
            self._rate.pop(key, None)
            return None
        elapsed = timestamp_ns - prev[1]
        if elapsed < self.min_interval_ns and key in self._rate:
            return self._rate[key]
        rate = (usage_ns - prev[0]) * NANOS // elapsed
        self._rate[key] = rate
        if elapsed >= self.min_interval_ns:
            self._prev[key] = (usage_ns, timestamp_ns)
        return rate

    def forget(self, key: str) -> None:
        self._prev.pop(key, None)
        self._rate.pop(key, None)

    def retain(self, keys: Iterable[str]) -> None:
        """Drop every id not in `keys` (containers that were removed)."""
        keep = set(keys)
        for key in [k for k in self._prev if k not in keep]:
            self.forget(key)
