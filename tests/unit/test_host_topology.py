"""The host's CPUs and memory nodes are read once, with the other host facts."""

from __future__ import annotations

import pytest

from crishim.host.topology import HostTopology, parse_cpu_list


def test_cpu_lists() -> None:
    assert parse_cpu_list("0-3,6") == {0, 1, 2, 3, 6}
    with pytest.raises(ValueError):
        parse_cpu_list("x")


def test_probe_reads_this_host() -> None:
    topo = HostTopology.probe()
    assert topo.cpus and topo.mems
    assert HostTopology() == HostTopology(frozenset(), frozenset())  # nothing checked
