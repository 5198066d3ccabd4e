"""Applying CDI container edits to a container's OCI spec (as container/spec.py builds it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.edits import Injection, apply, resolve_node
from crishim.cdi.spec import ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice
from crishim.container.spec import PodInfo, SpecInputs, build_spec
from crishim.container.user import ResolvedUser
from crishim.errors import FailedPrecondition, InvalidArgument

NULL = os.stat("/dev/null")
NULL_NUMBERS = (os.major(NULL.st_rdev), os.minor(NULL.st_rdev))


def _spec(uid: int = 1000, **cfg: Any) -> dict[str, Any]:
    config = pb.ContainerConfig(command=["/bin/sh"], **cfg)
    return build_spec(SpecInputs(
        container_id="c1", config=config,
        pod=PodInfo(id="p1", name="pod", pause_pid=42), image_config={"Env": ["FOO=image"]},
        image_name="busybox", rootfs="/r", user=ResolvedUser(uid=uid, gid=uid,
                                                               additional_gids=[10])))


def _inject(**edits: Any) -> list[Injection]:
    return [Injection("CDI device vendor.com/dev=a", ContainerEdits(**edits))]


def test_env_replaces_the_same_variable_and_appends_new_ones() -> None:
    spec = _spec(envs=[pb.KeyValue(key="FOO", value=b"cri")])
    before = list(spec["process"]["env"])
    apply(spec, _inject(env=("FOO=cdi", "NEW=1")) + _inject(env=("NEW=2",)))
    env = spec["process"]["env"]
    assert env == [("FOO=cdi" if e.startswith("FOO=") else e) for e in before] + ["NEW=2"]


def test_device_node_from_the_host_node_under_another_path() -> None:
    spec = _spec()
    rules_before = list(spec["linux"]["resources"]["devices"])
    apply(spec, _inject(device_nodes=(DeviceNode("/dev/crishim-null", host_path="/dev/null"),)))
    dev = next(d for d in spec["linux"]["devices"] if d["path"] == "/dev/crishim-null")
    major, minor = NULL_NUMBERS
    assert dev == {"path": "/dev/crishim-null", "type": "c", "major": major, "minor": minor,
                   "fileMode": stat.S_IMODE(NULL.st_mode), "uid": 1000, "gid": 1000}
    # The default deny + allow-list stays; the device's own allow rule comes last.
    assert spec["linux"]["resources"]["devices"] == [
        *rules_before,
        {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"}]


def test_device_node_owner_defaults_to_root_for_root_containers_and_explicit_wins() -> None:
    spec = _spec(uid=0)
    apply(spec, _inject(device_nodes=(DeviceNode("/dev/a", host_path="/dev/null"),
                                      DeviceNode("/dev/b", host_path="/dev/null", uid=7,
                                                 gid=8, file_mode=0o600,
                                                 permissions="r"))))
    a, b = spec["linux"]["devices"][-2:]
    assert "uid" not in a and "gid" not in a
    assert (b["uid"], b["gid"], b["fileMode"]) == (7, 8, 0o600)
    assert spec["linux"]["resources"]["devices"][-1]["access"] == "r"


def test_device_node_replaces_one_at_the_same_path() -> None:
    spec = _spec(devices=[pb.Device(container_path="/dev/x", host_path="/dev/zero",
                                    permissions="r")])
    apply(spec, _inject(device_nodes=(DeviceNode("/dev/x", host_path="/dev/null"),)))
    xs = [d for d in spec["linux"]["devices"] if d["path"] == "/dev/x"]
    assert len(xs) == 1 and (xs[0]["major"], xs[0]["minor"]) == NULL_NUMBERS


def test_permissions_none_adds_the_node_but_no_cgroup_rule() -> None:
    spec = _spec()
    rules = list(spec["linux"]["resources"]["devices"])
    apply(spec, _inject(device_nodes=(DeviceNode("/dev/x", host_path="/dev/null",
                                                 permissions="none"),)))
    assert spec["linux"]["devices"][-1]["path"] == "/dev/x"
    assert spec["linux"]["resources"]["devices"] == rules


def test_fully_specified_nodes_need_no_host_node() -> None:
    node = DeviceNode("/dev/vendor0", type="c", major=240, minor=3)
    assert resolve_node(node, "x") == node
    fifo = DeviceNode("/dev/fifo", type="p")
    assert resolve_node(fifo, "x") == fifo
    spec = _spec()
    apply(spec, _inject(device_nodes=(node, fifo)))
    assert spec["linux"]["devices"][-2:] == [
        {"path": "/dev/vendor0", "type": "c", "major": 240, "minor": 3, "uid": 1000,
         "gid": 1000},
        {"path": "/dev/fifo", "type": "p", "uid": 1000, "gid": 1000}]
    assert spec["linux"]["resources"]["devices"][-1]["major"] == 240  # no rule for a fifo


def test_file_mode_comes_from_the_host_node_even_when_fully_specified() -> None:
    node = resolve_node(DeviceNode("/dev/null", type="c", major=1, minor=3), "x")
    assert node.file_mode == stat.S_IMODE(NULL.st_mode)


def test_fifo_and_unbuffered_types_from_the_host(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    node = resolve_node(DeviceNode("/dev/f", host_path=str(fifo)), "x")
    assert (node.type, node.major) == ("p", 0)
    # "u" is an unbuffered character device: a character node on the host matches it.
    node = resolve_node(DeviceNode("/dev/u", host_path="/dev/null", type="u"), "x")
    assert (node.type, (node.major, node.minor)) == ("u", NULL_NUMBERS)


def test_missing_or_wrong_host_nodes_are_failed_preconditions(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match=r"CDI device vendor.com/dev=a: host device "
                                                 r"/dev/crishim-missing: No such file"):
        apply(_spec(), _inject(device_nodes=(DeviceNode("/dev/crishim-missing"),)))
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(FailedPrecondition, match="is not a device node"):
        resolve_node(DeviceNode("/dev/x", host_path=str(regular)), "x")
    with pytest.raises(FailedPrecondition, match="declared type 'b' but /dev/null on the "
                                                 "host is type 'c'"):
        resolve_node(DeviceNode("/dev/x", host_path="/dev/null", type="b"), "x")


def test_mounts_replace_the_same_destination_and_are_ordered_by_depth() -> None:
    spec = _spec(mounts=[pb.Mount(container_path="/data", host_path="/tmp")])
    apply(spec, _inject(mounts=(Mount("/usr/lib/vendor", "/usr/lib/vendor/deep/x",
                                      ("ro", "bind")),
                                Mount("/srv", "/data", ("rbind", "rw"), "bind"),
                                Mount("/lib", "/a", ("bind",)))))
    dests = [m["destination"] for m in spec["mounts"]]
    assert dests.count("/data") == 1
    depths = [os.path.normpath(d).count("/") for d in dests]
    assert depths == sorted(depths)
    assert next(m for m in spec["mounts"] if m["destination"] == "/data") == {
        "destination": "/data", "source": "/srv", "options": ["rbind", "rw"], "type": "bind"}
    assert {"destination": "/usr/lib/vendor/deep/x", "source": "/usr/lib/vendor",
            "options": ["ro", "bind"]} in spec["mounts"]


def test_bind_mounts_are_idmapped_in_a_user_namespace() -> None:
    spec = _spec()
    spec["linux"]["namespaces"].append({"type": "user"})
    apply(spec, _inject(mounts=(Mount("/a", "/x", ("rbind",)), Mount("/b", "/y", ("bind",)),
                                Mount("tmpfs", "/z", ("size=1m",), "tmpfs"))))
    opts = {m["destination"]: m["options"] for m in spec["mounts"]}
    assert (opts["/x"], opts["/y"], opts["/z"]) == (["rbind", "ridmap"], ["bind", "idmap"],
                                                    ["size=1m"])


def test_hooks_join_the_oci_hook_list_of_their_name() -> None:
    spec = _spec()
    apply(spec, _inject(hooks=(Hook("createContainer", "/bin/hook", ("hook", "-v"), ("A=1",),
                                    5),
                               Hook("poststop", "/bin/cleanup"),
                               Hook("createContainer", "/bin/second"))))
    assert spec["hooks"] == {
        "createContainer": [{"path": "/bin/hook", "args": ["hook", "-v"], "env": ["A=1"],
                             "timeout": 5},
                            {"path": "/bin/second"}],
        "poststop": [{"path": "/bin/cleanup"}]}


def test_additional_gids_skip_zero_and_repeats() -> None:
    spec = _spec()
    apply(spec, _inject(additional_gids=(0, 44, 10, 44)))
    assert spec["process"]["user"]["additionalGids"] == [10, 44]


def test_intel_rdt_last_one_wins() -> None:
    spec = _spec()
    apply(spec, _inject(intel_rdt=IntelRdt(clos_id="a", l3_cache_schema="L3:0=f"))
          + _inject(intel_rdt=IntelRdt(clos_id="b", schemata=("MB:0=50",),
                                       enable_monitoring=True)))
    assert spec["linux"]["intelRdt"] == {"closID": "b", "schemata": ["MB:0=50"],
                                         "enableMonitoring": True}


def test_net_devices_are_refused_naming_the_device() -> None:
    with pytest.raises(InvalidArgument, match=r"CDI device vendor.com/dev=a: netDevices "
                                              r"edits are not supported"):
        apply(_spec(), _inject(net_devices=(NetDevice("eth1", "net1"),)))


def test_no_injections_leave_the_spec_alone() -> None:
    spec = _spec()
    copy = {k: v for k, v in spec.items()}
    apply(spec, [])
    assert spec == copy
