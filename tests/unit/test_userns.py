"""User namespaces (userns_options mode POD): validation of the kubelet's mappings, the
pause's and containers' OCI specs, and the pod files' owner."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.spec import PodInfo, SpecInputs, build_spec
from crishim.container.user import ResolvedUser
from crishim.errors import InvalidArgument
from crishim.host.idmap import map_text
from crishim.host.runtimes import parse_namespaces
from crishim.oci.userns import PodUserns, check_container, pod_userns
from crishim.sandbox import podfiles
from crishim.sandbox.pause import pause_spec
from crishim.validate.sandbox import validate_config

H = 65536 * 3


def m(c: int, h: int, n: int) -> pb.IDMapping:
    return pb.IDMapping(container_id=c, host_id=h, length=n)


def opts(mode: int = pb.POD, uids: list[pb.IDMapping] | None = None,
         gids: list[pb.IDMapping] | None = None, **ns: int) -> pb.NamespaceOption:
    return pb.NamespaceOption(userns_options=pb.UserNamespace(
        mode=mode,  # type: ignore[arg-type]
        uids=[m(0, H, 65536)] if uids is None else uids,
        gids=[m(0, H, 65536)] if gids is None else gids), **ns)


def pod(o: pb.NamespaceOption) -> pb.PodSandboxConfig:
    c = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="n"))
    c.linux.security_context.namespace_options.CopyFrom(o)
    return c


def test_kubelet_mapping_is_accepted() -> None:
    u = pod_userns(opts())
    assert u == PodUserns(uids=((0, H, 65536),), gids=((0, H, 65536),))
    assert (u.root_uid, u.root_gid) == (H, H)
    assert u.oci() == {"uidMappings": [{"containerID": 0, "hostID": H, "size": 65536}],
                       "gidMappings": [{"containerID": 0, "hostID": H, "size": 65536}]}
    validate_config(pod(opts()))
    # Several disjoint lines are fine too; the kernel gets them in one write.
    several = [m(0, H, 1000), m(1000, H + 5000, 10)]
    assert pod_userns(opts(uids=several)).uids == ((0, H, 1000), (1000, H + 5000, 10))  # type: ignore[union-attr]
    assert map_text(((0, H, 1000), (1000, H + 5000, 10))) == f"0 {H} 1000\n1000 {H + 5000} 10\n"


def test_host_user_namespace() -> None:
    assert pod_userns(pb.NamespaceOption()) is None
    assert pod_userns(pb.NamespaceOption(userns_options=pb.UserNamespace(mode=pb.NODE))) is None


@pytest.mark.parametrize(("o", "words"), [
    (opts(uids=[]), "at least one uid mapping"),
    (opts(gids=[]), "at least one gid mapping"),
    (opts(uids=[m(1, H, 65536)]), "do not map container id 0"),
    (opts(uids=[m(0, H, 100000), m(0, H * 2, 100000)]), "overlap in their container ids"),
    (opts(gids=[m(0, H, 10), m(10, H + 5, 10)]), "overlap in their host ids"),
    (opts(uids=[m(0, H, 0)]), "length 0"),
    (opts(uids=[m(0, 2**32 - 5, 10)]), "past the largest id"),
    (opts(uids=[m(i * 2, H + i * 2, 1) for i in range(341)]), "at most 340"),
    (opts(mode=pb.NODE), "NODE takes no"),
    (opts(mode=pb.CONTAINER), "CONTAINER is not supported"),
    (opts(mode=pb.TARGET), "TARGET is not supported"),
    (opts(pid=pb.NODE, ipc=pb.NODE), "host's pid/ipc"),
    (opts(network=pb.NODE, pid=pb.NODE), "host's pid namespace"),
])
def test_bad_user_namespaces_are_invalid_argument(o: pb.NamespaceOption, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        validate_config(pod(o))


def test_host_network_with_a_user_namespace_is_accepted() -> None:
    validate_config(pod(opts(network=pb.NODE)))  # KEP-5607


def test_a_container_is_in_its_pods_user_namespace() -> None:
    u = pod_userns(opts())
    check_container(u, pb.NamespaceOption())  # no userns_options: the pod's
    check_container(u, opts())
    with pytest.raises(InvalidArgument, match="its pod's"):
        check_container(u, opts(uids=[m(0, H * 2, 65536)]))
    with pytest.raises(InvalidArgument, match="the host's"):
        check_container(None, opts())
    check_container(None, pb.NamespaceOption(userns_options=pb.UserNamespace(mode=pb.NODE)))


def _container_spec(mounts: list[pb.Mount] | None = None,
                    idmapped: dict[int, str] | None = None, **ns: int) -> dict[str, Any]:
    o = opts(**ns)
    info = PodInfo(id="p1", netns_path="" if ns else "/run/crishim/netns/p1", pause_pid=42,
                   namespace_options=o, userns=pod_userns(o),
                   userns_path="/run/crishim/userns/p1")
    cfg = pb.ContainerConfig(command=["sh"], mounts=mounts or [])
    cfg.linux.security_context.namespace_options.CopyFrom(o)
    return build_spec(SpecInputs(container_id="c1", config=cfg, pod=info, image_config={},
                                 image_name="busybox", rootfs="/r/c1/rootfs",
                                 user=ResolvedUser(), idmapped_volumes=idmapped or {}))


def test_container_spec_joins_the_pods_user_namespace() -> None:
    linux = _container_spec()["linux"]
    assert {"type": "user", "path": "/run/crishim/userns/p1"} in linux["namespaces"]
    assert {"type": "network", "path": "/run/crishim/netns/p1"} in linux["namespaces"]
    assert linux["uidMappings"] == [{"containerID": 0, "hostID": H, "size": 65536}]
    assert linux["gidMappings"] == linux["uidMappings"]


def _sys(spec: dict[str, Any]) -> dict[str, Any]:
    return next(x for x in spec["mounts"] if x["destination"] == "/sys")


def test_host_network_in_a_user_namespace_binds_the_hosts_sys() -> None:
    # The kernel mounts sysfs only for the owner of the network namespace: the host's.
    spec = _container_spec(network=pb.NODE)
    kinds = [n["type"] for n in spec["linux"]["namespaces"]]
    assert "user" in kinds and "network" not in kinds and "uts" not in kinds
    assert _sys(spec) == {"destination": "/sys", "type": "bind", "source": "/sys",
                          "options": ["rbind", "rprivate", "nosuid", "noexec", "nodev", "ro"]}
    assert _sys(_container_spec())["type"] == "sysfs"  # its own netns: its own sysfs
    c = pod(opts(network=pb.NODE))
    s = pause_spec(sandbox_id="s", config=c, rootfs="/r", args=["/pause"], env=[], cwd="/",
                   hostname="h", netns_path="", shm_path="/sb/shm",
                   cgroups_path="/crishim/crishim-s", oom_floor=-100,
                   userns=pod_userns(c.linux.security_context.namespace_options),
                   userns_path="/run/x/userns/s")
    assert _sys(s)["source"] == "/sys" and "ro" in _sys(s)["options"]
    assert "network" not in [n["type"] for n in s["linux"]["namespaces"]]


def test_idmapped_cri_mount_binds_crishims_idmapped_mount(tmp_path: Path) -> None:
    vol = pb.Mount(container_path="/data", host_path=str(tmp_path), readonly=True,
                   uidMappings=[m(0, H, 65536)], gidMappings=[m(0, H, 65536)])
    spec = _container_spec([vol], {0: "/r/c1/idmapped/0"})
    data = next(x for x in spec["mounts"] if x["destination"] == "/data")
    assert (data["source"], data["options"]) == ("/r/c1/idmapped/0",
                                                 ["rbind", "rprivate", "ro"])
    with pytest.raises(InvalidArgument, match="was not made"):
        _container_spec([vol])


def test_pause_spec_in_the_pods_user_namespace() -> None:
    c = pod(opts())
    s = pause_spec(sandbox_id="s", config=c, rootfs="/r", args=["/pause"], env=[], cwd="/",
                   hostname="h", netns_path="/run/x/netns/s", shm_path="/sb/shm",
                   cgroups_path="/crishim/crishim-s", oom_floor=-100,
                   userns=pod_userns(c.linux.security_context.namespace_options),
                   userns_path="/run/x/userns/s")
    linux: Any = s["linux"]
    assert {"type": "user", "path": "/run/x/userns/s"} in linux["namespaces"]
    assert linux["uidMappings"] == [{"containerID": 0, "hostID": H, "size": 65536}]
    # pid, ipc and uts are new (created inside the user namespace, so owned by it).
    for kind in ("pid", "ipc", "uts"):
        assert {"type": kind} in linux["namespaces"]


def test_pod_files_belong_to_the_pods_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    podfiles.write_pod_files(str(tmp_path), pod(opts()), ["10.0.0.2"], False, (H, H + 1))
    for name in ("hosts", "hostname", "resolv.conf"):
        st = os.stat(tmp_path / name)
        assert (st.st_uid, st.st_gid) == (H, H + 1)


def test_runtime_features_user_namespace() -> None:
    assert "user" in parse_namespaces(b'{"linux": {"namespaces": ["mount", "user"]}}')
    assert parse_namespaces(b"not json") == frozenset()
    assert parse_namespaces(b'{"linux": {}}') == frozenset()
