"""The network layer against the real CNI plugins (/usr/lib/cni), on a private bridge.

Each test gets its own bridge name, subnet and host-local dataDir (tests/e2e/cni.py), so
nothing touches the host's default network; leftovers are DELed and unpinned at the end.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import subprocess
from collections.abc import AsyncIterator

import pytest

from crishim.network.invoke import CNIPluginError
from crishim.network.manager import NetworkManager
from crishim.network.netns import create_netns, in_netns, is_netns_pinned, remove_netns
from crishim.network.types import Bandwidth, PodNetwork, PortMapping
from tests.e2e.cni import host_local_ips
from tests.e2e.cninet import Net, cleanup, make_net


# Small blocking helpers: the tests are async only because the API is.
def sh(*args: str, check: bool = True) -> str:
    return run(*args, check=check).stdout


def run(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def exists(path: str) -> bool:
    return os.path.lexists(path)


def read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


@pytest.fixture
async def net() -> AsyncIterator[Net]:
    n = await make_net()
    try:
        yield n
    finally:
        await cleanup(n)


@pytest.fixture
async def plain_net() -> AsyncIterator[Net]:
    """bridge + host-local only (portmap's CHECK is broken for IPv4-only pods upstream)."""
    n = await make_net(portmap=False)
    try:
        yield n
    finally:
        await cleanup(n)


async def test_add_gives_ip_in_range_with_eth0_and_lo_up(net: Net) -> None:
    ns, ips = await net.pod("pod-a")
    assert len(ips) == 1
    assert ipaddress.ip_address(ips[0]) in ipaddress.ip_network(net.subnet)
    assert host_local_ips(net.tmpdir) == ips
    links = sh("nsenter", f"--net={ns}", "ip", "-o", "link", "show", "up")
    assert ": lo:" in links and ": eth0@" in links
    addrs = sh("nsenter", f"--net={ns}", "ip", "-o", "-4", "addr", "show", "eth0")
    assert f"{ips[0]}/24" in addrs
    # in_netns sees the pod's interfaces, not the host's.
    dev = await in_netns(ns, lambda: open("/proc/thread-self/net/dev").read())
    names = {line.split(":")[0].strip() for line in dev.splitlines()[2:]}
    assert names == {"lo", "eth0"}

    await net.manager.teardown("pod-a", ns)
    assert host_local_ips(net.tmpdir) == []
    assert net.manager.cached_pod_ids() == set()
    assert "eth0" not in sh("nsenter", f"--net={ns}", "ip", "-o", "link")
    await net.manager.teardown("pod-a", ns)  # idempotent
    await remove_netns(ns, roots=(net.cfg.state,))
    await remove_netns(ns, roots=(net.cfg.state,))
    assert not exists(ns) and not is_netns_pinned(ns)


async def test_two_pods_can_ping_each_other(net: Net) -> None:
    ns1, ips1 = await net.pod("pod-1")
    ns2, ips2 = await net.pod("pod-2")
    assert ips1 != ips2
    for src, dst in ((ns1, ips2[0]), (ns2, ips1[0])):
        out = run("nsenter", f"--net={src}", "busybox", "ping", "-c1", "-W3", dst)
        assert out.returncode == 0, out.stdout + out.stderr


async def test_del_after_netns_removed_still_frees_ip(net: Net) -> None:
    ns, ips = await net.pod("pod-gone")
    assert host_local_ips(net.tmpdir) == ips
    await remove_netns(ns, roots=(net.cfg.state,))  # e.g. the node rebooted: /run is gone
    await net.manager.teardown("pod-gone", ns)
    assert host_local_ips(net.tmpdir) == []
    assert net.manager.cached_pod_ids() == set()


async def test_plugin_error_rolls_back_everything(net: Net) -> None:
    path = os.path.join(net.conf_dir, "10-crishim-e2e.conflist")
    conf = json.loads(read(path))
    # tuning refuses an unknown sysctl: ADD fails after bridge already attached the pod.
    conf["plugins"].append({"type": "tuning",
                            "sysctl": {"net.ipv4.conf.eth0.nonexistent": "1"}})
    write(path, json.dumps(conf))
    ns = net.netns("pod-bad")
    await create_netns(ns, roots=(net.cfg.state,))
    with pytest.raises(CNIPluginError) as err:
        await net.manager.setup("pod-bad", ns, PodNetwork("pod-bad", "e2e", "uid-bad"))
    assert "tuning ADD failed" in str(err.value) and "nonexistent" in str(err.value)
    assert host_local_ips(net.tmpdir) == []
    assert net.manager.cached_pod_ids() == set()
    assert "eth0" not in sh("nsenter", f"--net={ns}", "ip", "-o", "link")


async def test_crash_after_add_is_cleaned_by_reconcile(net: Net) -> None:
    ns1, _ = await net.pod("pod-crash1")
    ns2, _ = await net.pod("pod-crash2")
    ns3, ips3 = await net.pod("pod-live")
    # pod-crash2 "crashed" before the result was recorded: only the intent is on disk.
    entry = net.manager.cache.read("pod-crash2")
    assert entry is not None
    entry.result = None
    net.manager.cache.write(entry)
    await net.manager.stop()  # the daemon dies without tearing anything down

    restarted = NetworkManager(net.cfg, lambda: "")
    assert restarted.cached_pod_ids() == {"pod-crash1", "pod-crash2", "pod-live"}
    await restarted.reconcile({"pod-live"})
    assert host_local_ips(net.tmpdir) == ips3
    assert restarted.cached_pod_ids() == {"pod-live"}
    assert not exists(ns1) and not exists(ns2)
    assert is_netns_pinned(ns3)


async def test_host_port_reaches_listener_in_pod_via_localhost(net: Net) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        host_port = probe.getsockname()[1]
    ns = net.netns("pod-web")
    await create_netns(ns, roots=(net.cfg.state,))

    def listen() -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 8080))
        s.listen(1)
        return s

    server = await in_netns(ns, listen)  # the socket stays in the pod's namespace
    try:
        await net.manager.setup("pod-web", ns, PodNetwork(
            "pod-web", "e2e", "uid-web", port_mappings=[PortMapping(8080, host_port, "tcp")]))
        # portmap (snat) enables route_localnet on the bridge so 127.0.0.1 can be DNATed.
        assert read(f"/proc/sys/net/ipv4/conf/{net.bridge}/route_localnet").strip() == "1"

        def serve() -> bytes:
            server.settimeout(10)
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"hello from the pod")
                return conn.recv(100)

        served = asyncio.create_task(asyncio.to_thread(serve))
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", host_port), 10)
        writer.write(b"hi")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(100), 10) == b"hello from the pod"
        writer.close()
        assert await served == b"hi"
        assert "pod-web" in sh("iptables-save", "-t", "nat")
    finally:
        server.close()
    await net.manager.teardown("pod-web", ns)
    # DEL removed the pod's DNAT chain and rules (they are tagged with the pod ID).
    assert "pod-web" not in sh("iptables-save", "-t", "nat")


async def test_check_detects_a_broken_attachment(plain_net: Net) -> None:
    ns, _ = await plain_net.pod("pod-chk")
    await plain_net.manager.check("pod-chk", ns)
    sh("nsenter", f"--net={ns}", "ip", "link", "del", "eth0")
    with pytest.raises(CNIPluginError, match="bridge CHECK failed"):
        await plain_net.manager.check("pod-chk", ns)


async def test_pod_cidr_from_runtime_config_feeds_ip_ranges(plain_net: Net) -> None:
    """With the ipRanges capability, IPs come from the CIDR UpdateRuntimeConfig handed in."""
    path = os.path.join(plain_net.conf_dir, "10-crishim-e2e.conflist")
    conf = json.loads(read(path))
    bridge = conf["plugins"][0]
    bridge["capabilities"] = {"ipRanges": True}
    del bridge["ipam"]["ranges"]
    write(path, json.dumps(conf))
    net = ipaddress.ip_network(plain_net.subnet)
    upper_half = list(net.subnets(prefixlen_diff=1))[1]
    plain_net.manager.pod_cidr = lambda: str(upper_half)
    _, ips = await plain_net.pod("pod-cidr")
    assert ipaddress.ip_address(ips[0]) in upper_half


async def test_bandwidth_limits_are_applied_and_removed(plain_net: Net) -> None:
    path = os.path.join(plain_net.conf_dir, "10-crishim-e2e.conflist")
    conf = json.loads(read(path))
    conf["plugins"].append({"type": "bandwidth", "capabilities": {"bandwidth": True}})
    write(path, json.dumps(conf))
    ns, _ = await plain_net.pod("pod-bw", bandwidth=Bandwidth(ingress_bps=10_000_000,
                                                              egress_bps=20_000_000))
    entry = plain_net.manager.cache.read("pod-bw")
    assert entry is not None and entry.result is not None
    host_ifaces = [i["name"] for i in entry.result["interfaces"] if not i.get("sandbox")]
    veth = next(n for n in host_ifaces if n.startswith("veth"))
    ifb = next(n for n in host_ifaces if n.startswith("bwp"))
    # Traffic to the pod is shaped on the host end of its veth, traffic from the pod on an
    # ifb device the plugin created.
    assert "rate 10Mbit" in sh("tc", "qdisc", "show", "dev", veth)
    assert "rate 20Mbit" in sh("tc", "qdisc", "show", "dev", ifb)
    await plain_net.manager.teardown("pod-bw", ns)
    assert run("ip", "link", "show", ifb).returncode != 0  # DEL removed the ifb device


async def test_del_replays_after_the_conf_dir_changed(net: Net) -> None:
    ns, ips = await net.pod("pod-old")
    assert host_local_ips(net.tmpdir) == ips
    # The admin removes the network the pod was attached with.
    os.unlink(os.path.join(net.conf_dir, "10-crishim-e2e.conflist"))
    assert (await net.manager.status())[0] is False
    await net.manager.teardown("pod-old", ns)
    assert host_local_ips(net.tmpdir) == []
    assert "eth0" not in sh("nsenter", f"--net={ns}", "ip", "-o", "link")


async def test_concurrent_pods_get_distinct_ips_and_all_are_freed(net: Net) -> None:
    pods = [f"pod-c{i}" for i in range(6)]
    results = await asyncio.gather(*(net.pod(p, port_mappings=[PortMapping(80, 21000 + i)])
                                     for i, p in enumerate(pods)))
    ips = [r[1][0] for r in results]
    assert len(set(ips)) == len(pods)
    assert sorted(host_local_ips(net.tmpdir)) == sorted(ips)
    await asyncio.gather(*(net.manager.teardown(p, net.netns(p)) for p in pods))
    assert host_local_ips(net.tmpdir) == []
    nat = sh("iptables-save", "-t", "nat")
    assert not [p for p in pods if p in nat]
