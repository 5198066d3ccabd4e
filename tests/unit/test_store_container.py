"""Container record persistence, CRI views, list filters and overlay options."""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.image.rootfs import overlay_options
from crishim.store.container import EXITED, RUNNING, Container, reserved_name
from crishim.store.db import Database
from tests.fakes.managers import container_manager


def _rec(cid: str, pod: str = "p1", labels: dict[str, str] | None = None,
         state: pb.ContainerState = RUNNING, created: int = 1) -> Container:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c-" + cid, attempt=2),
                             image=pb.ImageSpec(image="busybox"), labels=labels or {},
                             mounts=[pb.Mount(container_path="/d", host_path="/h",
                                              readonly=True)])
    return Container(id=cid, pod_id=pod, name="n-" + cid, config=cfg, runtime_handler="runc",
                     created_at=created, image_name="docker.io/library/busybox:latest",
                     image_id="sha256:aa", image_ref="busybox@sha256:bb", bundle="/b",
                     rootfs="/b/rootfs", persist_dir="/p", state=state, uid=1000, gid=1000,
                     gids=[1000, 10])


def test_round_trip_and_views() -> None:
    rec = _rec("abc")
    back = Container.from_dict(rec.to_dict())
    assert back == rec
    st = back.status_proto()
    assert st.image.image == "docker.io/library/busybox:latest"  # resolved repo tag
    assert st.image_ref == "busybox@sha256:bb" and st.image_id == "sha256:aa"
    assert list(st.user.linux.supplemental_groups) == [1000, 10]
    assert st.mounts[0].readonly and st.metadata.attempt == 2
    assert back.list_proto().image.image == "busybox"  # lists show what was asked for
    pod = pb.PodSandboxMetadata(name="web", namespace="ns", uid="u")
    assert reserved_name(rec.metadata, pod) == "c-abc_web_ns_u_2"


def test_listed_view_follows_state_changes() -> None:
    rec = _rec("abc")
    assert rec.list_proto().state == RUNNING
    assert rec.list_proto() is rec.list_proto()  # built once per state
    rec.state = EXITED
    assert rec.list_proto().state == EXITED
    assert Container.from_dict(rec.to_dict()) == rec  # the cached view is not persisted


def test_joined_list_items_are_the_reply_a_client_parses() -> None:
    small, big = _rec("abc"), _rec("def")
    big.config.labels["long"] = "x" * 300  # an item over 127 bytes: a 2-byte length
    reply = pb.ListContainersResponse.FromString(small.list_item() + big.list_item())
    assert list(reply.containers) == [small.list_proto(), big.list_proto()]
    assert small.list_item() is small.list_item()  # serialized once per state
    small.state = EXITED
    reply = pb.ListContainersResponse.FromString(small.list_item())
    assert reply.containers[0].state == EXITED
    assert Container.from_dict(small.to_dict()) == small  # nor is the item persisted


def test_list_filters_and_prefix_lookup(tmp_path: object) -> None:
    cfg, db = Config(root="/nonexistent", state="/nonexistent"), Database(":memory:")
    mgr = container_manager(cfg, db)
    for rec in (_rec("aa11", "p1", {"app": "x"}, RUNNING, 3), _rec("aa22", "p2", {"app": "y"},
                EXITED, 2), _rec("bb33", "p1", {"app": "x", "tier": "db"}, EXITED, 1)):
        mgr.records.add(rec)

    def ids(**kw: object) -> list[str]:
        return [c.id for c in mgr.list_containers(pb.ContainerFilter(**kw))]  # type: ignore[arg-type]

    assert ids() == ["bb33", "aa22", "aa11"]  # oldest first
    assert ids(id="aa") == ["aa22", "aa11"]
    assert ids(pod_sandbox_id="p1") == ["bb33", "aa11"]
    assert ids(state=pb.ContainerStateValue(state=EXITED)) == ["bb33", "aa22"]
    assert ids(label_selector={"app": "x", "tier": "db"}) == ["bb33"]
    assert mgr.find("bb") is not None and mgr.find("zz") is None
    assert [s.id for s in mgr.pod_statuses("p2")] == ["aa22"]


def test_overlay_options_order_and_relative() -> None:
    assert overlay_options(["/l/base", "/l/top"], "/u", "/w") == \
        "lowerdir=/l/top:/l/base,upperdir=/u,workdir=/w"
    assert overlay_options(["/l/x/0", "/l/x/1"], "/u", "/w", relative_to="/l/x") == \
        "lowerdir=1:0,upperdir=/u,workdir=/w"


def test_exec_reply_fits_one_message() -> None:
    from crishim.container.execsync import fit_reply
    assert fit_reply(b"a" * 5, b"b" * 5, budget=10) == (b"a" * 5, b"b" * 5)
    assert fit_reply(b"a" * 20, b"b" * 2, budget=10) == (b"a" * 8, b"b" * 2)
    assert fit_reply(b"a" * 2, b"b" * 20, budget=10) == (b"a" * 2, b"b" * 8)
    assert fit_reply(b"a" * 20, b"b" * 20, budget=11) == (b"a" * 5, b"b" * 6)
