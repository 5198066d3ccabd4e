"""usage_nano_cores from consecutive samples."""

from __future__ import annotations

from crishim.stats.cpurate import CpuRateTracker

S = 1_000_000_000


def test_first_sample_has_no_rate_then_rate_from_previous() -> None:
    t = CpuRateTracker()
    assert t.update("c", 10 * S, 100 * S) is None
    # one core busy for 2 s
    assert t.update("c", 12 * S, 102 * S) == S
    # half a core over the next 4 s
    assert t.update("c", 14 * S, 106 * S) == S // 2


def test_burst_inside_min_interval_reuses_last_rate() -> None:
    t = CpuRateTracker(min_interval=1.0)
    t.update("c", 0, 0)
    assert t.update("c", 2 * S, 2 * S) == S
    # 10 ms later: not a new baseline, the rate over 2 s stands
    assert t.update("c", 2 * S + 1_000_000, 2 * S + 10_000_000) == S


def test_counter_reset_starts_over_and_forget() -> None:
    t = CpuRateTracker()
    t.update("c", 50 * S, 0)
    assert t.update("c", 1 * S, 2 * S) is None  # cgroup re-created: counter went back
    t.retain([])
    assert t.update("c", 5 * S, 10 * S) is None
