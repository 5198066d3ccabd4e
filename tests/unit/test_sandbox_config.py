"""Sandbox config validation, pod files, the record and the pause spec (no root)."""

from __future__ import annotations

import os
import re

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.sandbox import podfiles
from crishim.sandbox.pause import pause_spec
from crishim.store.sandbox import READY, Sandbox, reserved_name
from crishim.validate.sandbox import validate_config


def config(**kw: object) -> pb.PodSandboxConfig:
    c = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="n",
                                                           attempt=2))
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def test_valid_config_passes_and_reserved_name() -> None:
    c = config()
    validate_config(c)
    assert reserved_name(c.metadata) == "p_n_u_2"


@pytest.mark.parametrize("sysctl", ["vm.swappiness", "kernel.pid_max", "fs.file-max"])
def test_node_wide_sysctls_rejected(sysctl: str) -> None:
    c = config()
    c.linux.sysctls[sysctl] = "1"
    with pytest.raises(InvalidArgument, match=sysctl.replace(".", r"\.")):
        validate_config(c)


def test_net_sysctl_rejected_for_host_network() -> None:
    c = config()
    c.linux.security_context.namespace_options.network = pb.NODE
    c.linux.sysctls["net.ipv4.ip_forward"] = "1"
    with pytest.raises(InvalidArgument, match="host-network"):
        validate_config(c)


@pytest.mark.parametrize("field,value", [
    ("run_as_user", -1), ("run_as_user", 2**31), ("run_as_group", 2**32),
    ("supplemental_groups[1]", 2**32 - 1)])
def test_pod_ids_out_of_range_rejected(field: str, value: int) -> None:
    # Unchecked, runc failed on them at start (an internal error), and a runtime reading
    # them into 32 bits could wrap 2^32 to root.
    c = config()
    sc = c.linux.security_context
    if field == "supplemental_groups[1]":
        sc.supplemental_groups.extend([5, value])
    else:
        sc.run_as_user.value = 0
        getattr(sc, field).value = value
    with pytest.raises(InvalidArgument, match=re.escape(f"{field} {value} is out of range")):
        validate_config(c)
    c = config()
    c.linux.security_context.run_as_user.value = 2**31 - 1
    c.linux.security_context.supplemental_groups.append(2**31 - 1)
    validate_config(c)


def test_target_namespace_rejected_for_sandbox() -> None:
    c = config()
    c.linux.security_context.namespace_options.pid = pb.TARGET
    with pytest.raises(InvalidArgument, match="TARGET"):
        validate_config(c)


def test_resolv_conf_from_dns_config() -> None:
    dns = pb.DNSConfig(servers=["1.2.3.4", "5.6.7.8"], searches=["a.b", "c"],
                       options=["ndots:5"])
    text = podfiles.resolv_conf_content(dns, host_network=False)
    assert text == "nameserver 1.2.3.4\nnameserver 5.6.7.8\nsearch a.b c\noptions ndots:5\n"


def test_resolv_conf_from_host_drops_loopback_resolvers(tmp_path: str) -> None:
    host = os.path.join(str(tmp_path), "resolv.conf")
    with open(host, "w") as fh:
        fh.write("nameserver 127.0.0.53\nnameserver ::1\nnameserver 9.9.9.9\nsearch x\n")
    pod = podfiles.resolv_conf_content(None, host_network=False, host_resolv=host)
    assert pod == "nameserver 9.9.9.9\nsearch x\n"
    # A host-network pod shares the node's loopback, so its resolvers work there.
    assert "127.0.0.53" in podfiles.resolv_conf_content(None, True, host_resolv=host)


def test_hosts_file_has_localhost_and_pod_ip() -> None:
    text = podfiles.hosts_content("web", ["10.1.0.5", "fd00::5"], host_network=False)
    assert text.startswith("127.0.0.1\tlocalhost\n")
    assert "10.1.0.5\tweb\n" in text and "fd00::5\tweb\n" in text


def test_record_round_trip_and_status() -> None:
    c = config(hostname="h")
    c.labels["a"] = "b"
    c.linux.security_context.namespace_options.pid = pb.POD
    sb = Sandbox(id="f" * 64, name="p_n_u_2", config=c, runtime_handler="runc",
                 created_at=42, state=READY, ips=["10.0.0.2", "fd00::2"])
    back = Sandbox.from_dict(sb.to_dict())
    assert back == sb
    st = back.status_proto()
    assert st.network.ip == "10.0.0.2"
    assert [p.ip for p in st.network.additional_ips] == ["fd00::2"]
    assert st.linux.namespaces.options.pid == pb.POD
    assert dict(st.labels) == {"a": "b"} and st.state == pb.SANDBOX_READY


def _spec(c: pb.PodSandboxConfig) -> dict[str, object]:
    return pause_spec(sandbox_id="s" * 64, config=c, rootfs="/r", args=["/catatonit", "-P"],
                      env=[], cwd="/", hostname="h", netns_path="/run/x/netns/s",
                      shm_path="/sb/shm", cgroups_path="/crishim/crishim-s", oom_floor=-100)


def test_pause_spec_namespaces_and_clamp() -> None:
    c = config()
    c.linux.security_context.namespace_options.pid = pb.POD
    s = _spec(c)
    ns = {n["type"]: n.get("path", "") for n in s["linux"]["namespaces"]}  # type: ignore[index]
    assert ns["network"] == "/run/x/netns/s" and "pid" in ns and "ipc" in ns and "uts" in ns
    assert s["process"]["oomScoreAdj"] == -100  # type: ignore[index]
    assert s["root"] == {"path": "/r", "readonly": True}
    shm = [m for m in s["mounts"] if m["destination"] == "/dev/shm"]  # type: ignore[attr-defined]
    assert shm[0]["source"] == "/sb/shm"
    assert s["annotations"]["io.kubernetes.cri.container-type"] == "sandbox"  # type: ignore[index]


def test_pause_spec_host_namespaces_user_and_privileged() -> None:
    c = config()
    sc = c.linux.security_context
    sc.namespace_options.network = pb.NODE
    sc.namespace_options.pid = pb.NODE
    sc.namespace_options.ipc = pb.NODE
    sc.run_as_user.value = 65534
    sc.run_as_group.value = 65534
    sc.supplemental_groups.extend([5, 6])
    sc.privileged = True
    s = _spec(c)
    types = {n["type"] for n in s["linux"]["namespaces"]}  # type: ignore[index]
    assert types == {"mount"}
    assert s["process"]["user"] == {"uid": 65534, "gid": 65534,  # type: ignore[index]
                                    "additionalGids": [5, 6]}
    assert "CAP_SYS_ADMIN" in s["process"]["capabilities"]["bounding"]  # type: ignore[index]
    assert "hostname" not in s


def test_pause_spec_seccomp_runtime_default_and_unconfined() -> None:
    c = config()
    c.linux.security_context.seccomp.profile_type = pb.SecurityProfile.RuntimeDefault
    assert "seccomp" in _spec(c)["linux"]  # type: ignore[operator]
    c.linux.security_context.seccomp.profile_type = pb.SecurityProfile.Unconfined
    assert "seccomp" not in _spec(c)["linux"]  # type: ignore[operator]
