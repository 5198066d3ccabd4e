"""The one registry (by id or prefix, reserved names, list version) and the one filter of
pod and container records, for the list and the stats RPCs alike."""

from __future__ import annotations

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.registry import ContainerRegistry, pod_of
from crishim.errors import AlreadyExists, NotFound
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.container import CREATED, RUNNING, Container
from crishim.store.registry import select
from crishim.store.sandbox import NOTREADY, READY, Sandbox


def _pod(sid: str, created: int, state: int = READY, **labels: str) -> Sandbox:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=sid), labels=labels)
    return Sandbox(id=sid, name="n-" + sid, config=cfg, runtime_handler="runc",
                   created_at=created, state=state)  # type: ignore[arg-type]


def _ctr(cid: str, pod: str, created: int, state: int = CREATED, **labels: str) -> Container:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=cid), labels=labels)
    return Container(id=cid, pod_id=pod, name="n-" + cid, config=cfg, runtime_handler="runc",
                     created_at=created, image_name="i", image_id="sha256:aa",
                     image_ref="sha256:aa", bundle="/b", rootfs="/r", persist_dir="/p",
                     state=state)  # type: ignore[arg-type]


def test_lookup_by_id_or_unique_prefix() -> None:
    pods = SandboxRegistry()
    for sb in (_pod("ab12", 1), _pod("ab34", 2), _pod("cd56", 3)):
        pods.add(sb)
    assert pods.get("cd").id == "cd56" and pods.find("ab12") is pods.exact("ab12")
    assert pods.find("ef") is None
    with pytest.raises(NotFound, match="ambiguous"):
        pods.get("ab")
    with pytest.raises(NotFound, match="pod sandbox 'ef'"):
        pods.get("ef")


def test_a_reserved_name_is_refused_until_freed() -> None:
    ctrs = ContainerRegistry()
    ctrs.reserve("web", "c1")
    with pytest.raises(AlreadyExists, match="c1"):
        ctrs.reserve("web", "c2")
    ctrs.unreserve("web", "c2")  # not its holder: nothing freed
    with pytest.raises(AlreadyExists):
        ctrs.reserve("web", "c2")
    ctrs.unreserve("web", "c1")
    ctrs.reserve("web", "c2")


def test_a_record_holds_its_name_until_dropped() -> None:
    ctrs = ContainerRegistry()
    rec = _ctr("c1", "p1", 1)
    ctrs.reserve(rec.name, rec.id)
    ctrs.add(rec)
    ctrs.unreserve(rec.name, rec.id)  # a failure after the add: the record keeps it
    with pytest.raises(AlreadyExists):
        ctrs.reserve(rec.name, "c2")
    ctrs.drop(rec)
    ctrs.reserve(rec.name, "c2")
    assert ctrs.for_pod("p1") == [] and ctrs.list() == []


def test_list_is_oldest_first_and_filtered() -> None:
    ctrs = ContainerRegistry()
    for rec in (_ctr("bb", "p2", 2, RUNNING, app="x"), _ctr("aa", "p1", 1, app="x"),
                _ctr("cc", "p1", 3, RUNNING, app="y")):
        ctrs.add(rec)
    ids = lambda flt: [c.id for c in ctrs.list(flt)]  # noqa: E731
    assert ids(None) == ["aa", "bb", "cc"]
    assert ids(pb.ContainerFilter(pod_sandbox_id="p1")) == ["aa", "cc"]  # by the pod index
    assert ids(pb.ContainerFilter(pod_sandbox_id="p")) == ["aa", "bb", "cc"]  # a prefix
    assert ids(pb.ContainerFilter(state=pb.ContainerStateValue(state=RUNNING))) == ["bb", "cc"]
    assert ids(pb.ContainerFilter(label_selector={"app": "x"})) == ["aa", "bb"]
    assert ids(pb.ContainerFilter(id="c", label_selector={"app": "x"})) == []


def test_one_filter_for_lists_and_stats() -> None:
    pods = [_pod("p1", 1, READY, app="x"), _pod("p2", 2, NOTREADY, app="y")]
    ctrs = [_ctr("aa", "p1", 1, app="x"), _ctr("bb", "p2", 2, app="x")]
    assert [s.id for s in select(pods, pb.PodSandboxFilter(
        state=pb.PodSandboxStateValue(state=NOTREADY)))] == ["p2"]
    assert [s.id for s in select(pods, pb.PodSandboxStatsFilter(
        label_selector={"app": "x"}))] == ["p1"]
    assert [c.id for c in select(ctrs, pb.ContainerStatsFilter(pod_sandbox_id="p2"),
                                 pod_of)] == ["bb"]
    assert [c.id for c in select(ctrs, pb.ContainerStatsFilter(id="a"), pod_of)] == ["aa"]
    assert select(ctrs, None, pod_of) == ctrs


def test_list_version_moves_on_add_drop_and_state() -> None:
    pods = SandboxRegistry()
    v0 = pods.list_version()
    sb = _pod("p1", 1, NOTREADY)
    pods.add(sb)
    v1 = pods.list_version()
    assert v1 != v0
    sb.state = READY
    assert pods.list_version() != v1
    v2 = pods.list_version()
    pods.drop(sb)
    assert pods.list_version() != v2
