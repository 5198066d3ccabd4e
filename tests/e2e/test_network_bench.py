"""Measure netns pin + CNI ADD (bridge+portmap) against the plugins' own exec time.

Prints numbers instead of asserting on them (timings vary with the machine). Slow suite:
CRISHIM_SLOW=1 pytest -s tests/e2e/test_network_bench.py
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import pytest

from crishim.network import manager as manager_mod
from crishim.network.netns import create_netns, remove_netns
from crishim.network.types import PodNetwork, PortMapping
from tests.e2e.cninet import cleanup, make_net

ROUNDS = 20


@pytest.mark.slow
async def test_measure_pin_and_add(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin_time = 0.0
    per_plugin: dict[str, list[float]] = {}
    real_exec = manager_mod.exec_plugin

    async def timed_exec(*args: Any, **kw: Any) -> Any:
        nonlocal plugin_time
        t0 = time.perf_counter()
        try:
            return await real_exec(*args, **kw)
        finally:
            took = time.perf_counter() - t0
            plugin_time += took
            key = f"{os.path.basename(args[0])} {args[2].command}"
            per_plugin.setdefault(key, []).append(took)

    monkeypatch.setattr(manager_mod, "exec_plugin", timed_exec)
    net = await make_net()
    pins, adds, plugins, dels = [], [], [], []
    try:
        for i in range(ROUNDS):
            pod_id = f"bench-{i}"
            ns = net.netns(pod_id)
            t0 = time.perf_counter()
            await create_netns(ns, roots=(net.cfg.state,))
            t1 = time.perf_counter()
            plugin_time = 0.0
            await net.manager.setup(pod_id, ns, PodNetwork(
                pod_id, "bench", f"uid-{i}", port_mappings=[PortMapping(80, 20000 + i)]))
            t2 = time.perf_counter()
            plugins.append(plugin_time)
            pins.append(t1 - t0)
            adds.append(t2 - t1)
            t3 = time.perf_counter()
            await net.manager.teardown(pod_id, ns)
            await remove_netns(ns, roots=(net.cfg.state,))
            dels.append(time.perf_counter() - t3)
    finally:
        await cleanup(net)

    def ms(xs: list[float]) -> str:
        return f"p50={statistics.median(xs) * 1000:.1f}ms max={max(xs) * 1000:.1f}ms"

    total = [p + a for p, a in zip(pins, adds, strict=True)]
    print(f"\nnetns pin: {ms(pins)}\nCNI ADD (manager): {ms(adds)}\n"
          f"plugin exec (bridge+portmap): {ms(plugins)}\npin+ADD: {ms(total)}\n"
          f"overhead (ADD - plugin exec): "
          f"{ms([a - p for a, p in zip(adds, plugins, strict=True)])}\n"
          f"DEL+unpin: {ms(dels)}")
    for key, times in sorted(per_plugin.items()):
        print(f"  {key}: {ms(times)}")
    assert len(adds) == ROUNDS
