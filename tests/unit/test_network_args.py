"""What plugins are told: CNI_ARGS, runtimeConfig capabilities, results read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from crishim.errors import InvalidArgument
from crishim.network.args import (
    MAX_BURST,
    cni_args,
    parse_quantity,
    plugin_runtime_config,
    runtime_config,
)
from crishim.network.cache import CacheEntry, ResultCache
from crishim.network.invoke import error_message
from crishim.network.result import parse_result
from crishim.network.types import DNS, Bandwidth, PodNetwork, PortMapping


def pod(**kw: object) -> PodNetwork:
    return PodNetwork(name="web", namespace="prod", uid="u-1", **kw)  # type: ignore[arg-type]


def test_cni_args_carry_the_kubernetes_identity() -> None:
    assert cni_args("abc123", pod()) == ("IgnoreUnknown=1;K8S_POD_NAMESPACE=prod;"
                                         "K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=abc123;"
                                         "K8S_POD_UID=u-1")


def test_runtime_config_uses_cni_conventions() -> None:
    p = pod(port_mappings=[PortMapping(80, 8080, "TCP"), PortMapping(53, 5353, "udp", "127.0.0.1"),
                           PortMapping(9000, 0)],
            bandwidth=Bandwidth(ingress_bps=1_000_000),
            dns=DNS(servers=["10.0.0.10"], searches=["svc.cluster.local"], options=["ndots:5"]))
    rc = runtime_config(p, "10.88.0.0/16,fd00::/64")
    assert rc["portMappings"] == [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"},
    ]  # hostPort 0 is not a host port mapping
    assert rc["bandwidth"] == {"ingressRate": 1_000_000, "ingressBurst": MAX_BURST}
    assert rc["ipRanges"] == [[{"subnet": "10.88.0.0/16"}], [{"subnet": "fd00::/64"}]]
    assert rc["dns"]["servers"] == ["10.0.0.10"]


def test_empty_pod_offers_nothing() -> None:
    assert runtime_config(pod(), "") == {}


def test_capabilities_filter_per_plugin() -> None:
    offered = {"portMappings": [{"hostPort": 1}], "ipRanges": [[{"subnet": "10.0.0.0/8"}]]}
    assert plugin_runtime_config({"type": "bridge"}, offered) == {}
    assert plugin_runtime_config({"type": "portmap", "capabilities": {"portMappings": True}},
                                 offered) == {"portMappings": [{"hostPort": 1}]}
    assert plugin_runtime_config({"type": "x", "capabilities": {"ipRanges": False}},
                                 offered) == {}


def test_parse_result_040_shape_picks_pod_interface() -> None:
    raw = {"cniVersion": "0.4.0",
           "interfaces": [{"name": "cni0", "mac": "aa"}, {"name": "veth1", "mac": "bb"},
                          {"name": "eth0", "mac": "cc", "sandbox": "/run/netns/x"}],
           "ips": [{"version": "6", "address": "fd00::5/64", "interface": 2},
                   {"version": "4", "address": "10.1.0.5/24", "gateway": "10.1.0.1",
                    "interface": 2},
                   {"version": "4", "address": "10.1.0.1/24", "interface": 0}]}
    res = parse_result(raw)
    assert res.ips == ["10.1.0.5", "fd00::5"]  # IPv4 primary, the bridge's IP skipped
    assert len(res.interfaces) == 3


def test_parse_result_100_shape_without_interface_index() -> None:
    raw = {"cniVersion": "1.0.0", "ips": [{"address": "192.168.5.9/16"}]}
    assert parse_result(raw).ips == ["192.168.5.9"]
    assert parse_result({}).ips == []


def test_cache_roundtrip_and_listing(tmp_path: Path) -> None:
    cache = ResultCache(str(tmp_path / "cni"))
    assert cache.read("p1") is None and cache.pod_ids() == set()
    entry = CacheEntry(pod_id="p1", network={"name": "n", "plugins": []}, cni_args="a=b",
                       runtime_config={"portMappings": []}, ifname="eth0", netns="/x")
    cache.write(entry)
    assert cache.read("p1") == entry
    entry.result = {"ips": [{"address": "10.0.0.2/24"}]}
    cache.write(entry)
    assert cache.read("p1") == entry
    assert cache.pod_ids() == {"p1"}
    assert not [n for n in (tmp_path / "cni").iterdir() if n.name.endswith(".tmp")]
    cache.remove("p1")
    cache.remove("p1")
    assert cache.pod_ids() == set()
    # Ids that could escape the dir are refused for writing and unknown otherwise.
    assert cache.read("../x") is None
    cache.remove("")
    with pytest.raises(InvalidArgument):
        cache.write(CacheEntry(pod_id="../x", network={}, cni_args="", runtime_config={},
                               ifname="eth0", netns=""))


def test_a_cache_write_waits_for_no_disk_flush(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod start writes the cache twice; a disk flush in either is on its critical path
    whenever CNI ADD outlasts runc creating the pause."""
    def refuse(fd: int) -> None:
        raise AssertionError("the CNI cache synced a file")
    monkeypatch.setattr("os.fsync", refuse)
    cache = ResultCache(str(tmp_path / "cni"))
    entry = CacheEntry(pod_id="p1", network={"name": "n", "plugins": []}, cni_args="",
                       runtime_config={}, ifname="eth0", netns="/x")
    cache.write(entry)
    assert cache.read("p1") == entry


def test_error_json_becomes_the_message() -> None:
    err = error_message("bridge", "ADD", 1,
                        b'{"cniVersion":"1.0.0","code":11,"msg":"failed to allocate",'
                        b'"details":"range is full"}', b"noise")
    assert err.cni_code == 11
    assert str(err) == ("CNI plugin bridge ADD failed (code 11): failed to allocate: "
                        "range is full")
    plain = error_message("foo", "DEL", 2, b"", b"segfault\n")
    assert str(plain) == "CNI plugin foo DEL failed: segfault"


def test_bandwidth_annotations_like_kubelet() -> None:
    p = pod(annotations={"kubernetes.io/ingress-bandwidth": "10M",
                         "kubernetes.io/egress-bandwidth": "1.5Mi"})
    assert runtime_config(p, "")["bandwidth"] == {
        "ingressRate": 10_000_000, "ingressBurst": MAX_BURST,
        "egressRate": 1_572_864, "egressBurst": MAX_BURST}
    # An explicit Bandwidth wins over annotations.
    p.bandwidth = Bandwidth(egress_bps=5000)
    assert runtime_config(p, "")["bandwidth"] == {"egressRate": 5000, "egressBurst": MAX_BURST}


@pytest.mark.parametrize("value", ["ten", "10X", "", "1", "2P"])
def test_bad_bandwidth_annotation_is_invalid_argument(value: str) -> None:
    with pytest.raises(InvalidArgument, match=r"kubernetes\.io/ingress-bandwidth"):
        runtime_config(pod(annotations={"kubernetes.io/ingress-bandwidth": value}), "")


def test_parse_quantity() -> None:
    assert parse_quantity("100k") == 100_000
    assert parse_quantity("1Gi") == 2**30
    assert parse_quantity("0.5M") == 500_000
    assert parse_quantity("1500m") == 2  # milli rounds up
