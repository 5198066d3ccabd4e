"""Pod network counters parsed from /proc/<pid>/net/dev."""
# ruff: noqa: E501  (the fixture is a verbatim /proc/net/dev table)

from __future__ import annotations

import os

from crishim.stats.netdev import default_interface, parse_net_dev, read_pid_net_dev

SAMPLE = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    3193      29    0    0    0     0          0         0     3193      29    0    0    0     0       0          0
  net1:     100       2    0    0    0     0          0         0      200       3    0    0    0     0       0          0
  eth0: 205025381    4337    4    1    0     0          0         0   215889    2601    6    2    0     0       0          0
"""


def test_parse_skips_lo_and_maps_columns() -> None:
    ifaces = parse_net_dev(SAMPLE)
    assert [i.name for i in ifaces] == ["net1", "eth0"]
    eth0 = default_interface(ifaces)
    assert eth0 is not None and eth0.name == "eth0"
    assert (eth0.rx_bytes, eth0.rx_packets, eth0.rx_errors, eth0.rx_dropped) == (
        205025381, 4337, 4, 1)
    assert (eth0.tx_bytes, eth0.tx_packets, eth0.tx_errors, eth0.tx_dropped) == (
        215889, 2601, 6, 2)


def test_read_own_pid_and_gone_pid() -> None:
    assert read_pid_net_dev(os.getpid()) is not None
    assert read_pid_net_dev(0) is None
    assert read_pid_net_dev(2**22 + 12345) is None
