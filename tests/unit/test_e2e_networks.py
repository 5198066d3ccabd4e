"""The e2e modules' CNI networks come from one table: no two modules (nor the two kubelet
versions) share a bridge or a subnet, in any run, and every bridge name fits the kernel's
15 characters."""

from __future__ import annotations

import ipaddress

import pytest

from tests.e2e.cni import NETWORKS, module_network


@pytest.mark.parametrize("run", [0, 7, 249])
def test_modules_never_share_a_bridge_or_a_subnet(run: int) -> None:
    nets = [module_network(key, run) for key in NETWORKS]
    bridges = [b for b, _ in nets]
    subnets = [ipaddress.ip_network(s) for _, s in nets]
    assert len(set(bridges)) == len(nets), bridges
    assert all(len(b) <= 15 for b in bridges), bridges
    for i, a in enumerate(subnets):
        for b in subnets[i + 1:]:
            assert not a.overlaps(b), (a, b)
    assert module_network("kubelet-1.32", run) != module_network("kubelet-1.36", run)


def test_another_run_gets_other_networks() -> None:
    assert module_network("cdi", 1) != module_network("cdi", 2)


def test_an_unlisted_module_is_refused() -> None:
    with pytest.raises(ValueError):
        module_network("nobody")
