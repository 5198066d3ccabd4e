"""The request validators, field by field: each bad value refused with InvalidArgument
naming its field, and the values stock kubelets and critest send accepted."""

from __future__ import annotations

from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.host.cgroups import CgroupFacts
from crishim.host.topology import HostTopology, parse_cpu_list
from crishim.oci.resources import ResourceMapper
from crishim.validate import fields
from crishim.validate.container import validate_container_config
from crishim.validate.resources import check as validate
from crishim.validate.resources import check_for
from crishim.validate.sandbox import validate_cgroup_parent, validate_config

R = pb.LinuxContainerResources
BAD_ENUM: Any = 9  # a value no enum of the API has
MAPPER = ResourceMapper(CgroupFacts.everything(1),
                        topology=HostTopology(frozenset(range(4)), frozenset({0})))


def _set(c: Any, kw: dict[str, object]) -> Any:
    """`c` with the fields of `kw` set (scalars), extended (lists) or copied (messages)."""
    for k, v in kw.items():
        if isinstance(v, (str, int, bytes)):
            setattr(c, k, v)
        elif isinstance(v, list):
            getattr(c, k).extend(v)
        else:
            getattr(c, k).CopyFrom(v)
    return c


def pod(**kw: object) -> pb.PodSandboxConfig:
    return _set(pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="n"),
        log_directory="/var/log/pods/n_p_u", hostname="p"), kw)


def ctr(**kw: object) -> pb.ContainerConfig:
    return _set(pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c"),
        image=pb.ImageSpec(image="docker.io/library/busybox:1.36"), log_path="c/0.log"), kw)


# --- log paths (issue 45 item 5) ---

@pytest.mark.parametrize("value", ["c/0.log", "c.log", "a/b/c.log"])
def test_log_path_accepted(value: str) -> None:
    fields.log_path(value)
    assert fields.join_log_path("/var/log/pods/x", value) == "/var/log/pods/x/" + value


@pytest.mark.parametrize(("value", "rule"), [
    ("/etc/shadow", "not absolute"),
    ("../../../etc/cron.d/x", r"'\.\.'"),
    ("c/../../x.log", r"'\.\.'"),
    ("c//0.log", "normalised"),
    ("./c.log", "normalised"),
    ("c/0.log\n", "control character"),
])
def test_log_path_refused(value: str, rule: str) -> None:
    with pytest.raises(InvalidArgument, match=f"log_path.*{rule}"):
        fields.log_path(value)


def test_log_path_needs_an_absolute_log_directory() -> None:
    with pytest.raises(InvalidArgument, match="log_directory"):
        fields.join_log_path("", "c.log")
    with pytest.raises(InvalidArgument, match=r"log_directory.*absolute"):
        fields.join_log_path("logs/pod", "c.log")


def test_pod_log_directory_must_be_absolute() -> None:
    validate_config(pod())
    for bad in ("relative/dir", "/var/log/pods/../../etc"):
        with pytest.raises(InvalidArgument, match="log_directory"):
            validate_config(pod(log_directory=bad))


# --- pod sandbox config ---

@pytest.mark.parametrize(("driver", "parent"), [
    ("cgroupfs", "/kubepods.slice/../../etc"),
    ("cgroupfs", "kubepods/besteffort"),
    ("cgroupfs", "/kubepods/./pod1"),
    ("systemd", "/kubepods.slice/../../etc"),
    ("systemd", "../kubepods.slice"),
])
def test_cgroup_parent_escapes_refused(driver: str, parent: str) -> None:
    with pytest.raises(InvalidArgument, match="cgroup_parent"):
        validate_cgroup_parent(driver, parent)


@pytest.mark.parametrize(("driver", "parent"), [
    ("cgroupfs", ""), ("cgroupfs", "/"), ("cgroupfs", "/kubepods/burstable/pod12-ab"),
    ("cgroupfs", "/kubepods/besteffort/"),
    ("systemd", "kubepods-besteffort-pod12_ab.slice"), ("systemd", "system.slice"),
])
def test_kubelet_cgroup_parents_accepted(driver: str, parent: str) -> None:
    validate_cgroup_parent(driver, parent)


def _ns(**kw: int) -> pb.PodSandboxConfig:
    c = pod()
    for k, v in kw.items():
        setattr(c.linux.security_context.namespace_options, k, v)
    return c


@pytest.mark.parametrize(("config", "field"), [
    (_ns(network=7), "namespace_options.network"),
    (_ns(pid=-1), "namespace_options.pid"),
    (_ns(ipc=42), "namespace_options.ipc"),
    (pod(hostname="-bad-"), "hostname"),
    (pod(hostname="under_score"), "hostname"),
    (pod(hostname="a" * 65), "hostname"),
    (pod(hostname="a..b"), "hostname"),
    (pod(dns_config=pb.DNSConfig(servers=["not-an-ip"])), "dns_config.servers"),
    (pod(dns_config=pb.DNSConfig(searches=["a b"])), "dns_config.searches"),
    (pod(dns_config=pb.DNSConfig(searches=[f"d{i}.example" for i in range(33)])),
     "dns_config.searches"),
    (pod(dns_config=pb.DNSConfig(options=["ndots:5\nnameserver 6.6.6.6"])),
     "dns_config.options"),
    (pod(port_mappings=[pb.PortMapping(container_port=80, protocol=BAD_ENUM)]),
     "port_mappings.protocol"),
    (pod(port_mappings=[pb.PortMapping(container_port=80, host_ip="localhost")]),
     "port_mappings.host_ip"),
    (pod(metadata=pb.PodSandboxMetadata(name="a/b", uid="u", namespace="n")),
     "metadata.name"),
    (pod(metadata=pb.PodSandboxMetadata(name="p", uid="u\n", namespace="n")),
     "metadata.uid"),
    (pod(metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="n" * 300)),
     "metadata.namespace"),
])
def test_pod_field_refused(config: pb.PodSandboxConfig, field: str) -> None:
    with pytest.raises(InvalidArgument, match=field.replace(".", r"\.")):
        validate_config(config)


def test_userns_mode_unknown_refused() -> None:
    c = pod()
    c.linux.security_context.namespace_options.userns_options.mode = BAD_ENUM
    with pytest.raises(InvalidArgument, match=r"userns_options\.mode"):
        validate_config(c)


@pytest.mark.parametrize("name", ["net.ipv4..ip_forward", "Net.ipv4.ip_forward",
                                  "net.ipv4.ip_forward\n", "net ipv4"])
def test_sysctl_names_refused(name: str) -> None:
    c = pod()
    c.linux.sysctls[name] = "1"
    with pytest.raises(InvalidArgument, match="sysctl"):
        validate_config(c)


@pytest.mark.parametrize("value", ["1+kernel.core_pattern=|/tmp/x", "1=2", "1+1"])
def test_sysctl_value_smuggling_another_key_refused(value: str) -> None:
    c = pod()
    c.linux.sysctls["kernel.shm_rmid_forced"] = value
    with pytest.raises(InvalidArgument, match=r"sysctls\[kernel\.shm_rmid_forced\] value"):
        validate_config(c)


def test_kubelet_pod_config_accepted() -> None:
    c = pod(hostname="web-7d9f8-abcde",
            dns_config=pb.DNSConfig(servers=["10.96.0.10", "fd00::a"],
                                    searches=["default.svc.cluster.local", "svc.cluster.local",
                                              "cluster.local"],
                                    options=["ndots:5"]))
    c.linux.sysctls["net.ipv4.ip_unprivileged_port_start"] = "0"
    c.linux.sysctls["net/ipv4/ping_group_range"] = "0 2147483647"
    validate_config(c)


# --- resources ---

def test_cpu_list_parsing() -> None:
    assert parse_cpu_list("0-2,5\n") == {0, 1, 2, 5}
    with pytest.raises(ValueError):
        parse_cpu_list("3-1")


@pytest.mark.parametrize(("res", "field"), [
    (R(cpu_shares=-1), "cpu_shares"),
    (R(cpu_shares=262145), "cpu_shares"),
    (R(cpu_quota=-5), "cpu_quota"),
    (R(cpu_period=10), "cpu_period"),
    (R(memory_limit_in_bytes=4096), "memory_limit_in_bytes"),
    (R(cpuset_cpus="0-999"), "cpuset_cpus.*does not have"),
    (R(cpuset_cpus="3-1"), "cpuset_cpus"),
    (R(cpuset_mems="1"), "cpuset_mems.*memory nodes"),
    (R(oom_score_adj=-1001), "oom_score_adj"),
    (R(hugepage_limits=[pb.HugepageLimit(page_size="2MB"),
                        pb.HugepageLimit(page_size="2MB")]), "hugepage_limits"),
])
def test_resources_refused_against_the_host(res: pb.LinuxContainerResources,
                                            field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        check_for(MAPPER, res)


def test_cpuset_within_the_host_accepted() -> None:
    check_for(MAPPER, R(cpuset_cpus="0-3", cpuset_mems="0"))
    validate(R(cpuset_cpus="0-999"), cgroup_v2=False)  # topology unknown: syntax only


def test_unified_value_must_be_one_line() -> None:
    with pytest.raises(InvalidArgument, match="unified"):
        validate(R(unified={"memory.high": "1\nmemory.max 2"}), cgroup_v2=True)


# --- container config ---

@pytest.mark.parametrize(("config", "field"), [
    (ctr(log_path="/etc/cron.d/evil"), "log_path"),
    (ctr(log_path="../../x"), "log_path"),
    (ctr(image=pb.ImageSpec(image="bad::ref")), "image.image"),
    (ctr(image=pb.ImageSpec(image="busybox:bad tag")), "image.image"),
    (ctr(image=pb.ImageSpec(image="")), "image.image"),
    (ctr(metadata=pb.ContainerMetadata(name="a/b")), "metadata.name"),
    (ctr(working_dir="relative"), "working_dir"),
    (ctr(mounts=[pb.Mount(container_path="data", host_path="/tmp")]),
     r"mounts\[0\].container_path"),
    (ctr(mounts=[pb.Mount(container_path="/data", host_path="tmp")]),
     r"mounts\[0\].host_path"),
    (ctr(mounts=[pb.Mount(container_path="/data", host_path="/tmp", propagation=BAD_ENUM)]),
     r"mounts\[0\].propagation"),
    (ctr(mounts=[pb.Mount(container_path="/a", host_path="/tmp"),
                 pb.Mount(container_path="/b", host_path="/tmp",
                          mount_options=["noexec", "exec"])]),
     r"mounts\[1\].mount_options \['exec'\]: only nodev, noexec, nosuid"),
    (ctr(mounts=[pb.Mount(container_path="/b", host_path="/tmp", mount_options=["rw"])]),
     r"mount_options \['rw'\]"),
    (ctr(mounts=[pb.Mount(container_path="/b", host_path="/tmp",
                          mount_options=["NOEXEC", "uid=0"])]), r"\['NOEXEC', 'uid=0'\]"),
    (ctr(devices=[pb.Device(container_path="/dev/x", host_path="dev/null")]),
     r"devices\[0\].host_path"),
    (ctr(envs=[pb.KeyValue(key="A=B", value=b"1")]), "envs"),
    (ctr(devices=[pb.Device(container_path="/dev/x", host_path="/dev/null",
                            permissions="rwx")]), r"devices\[0\].permissions"),
    (ctr(linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        run_as_user=pb.Int64Value(value=-1)))), "run_as_user"),
    (ctr(linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        run_as_group=pb.Int64Value(value=1 << 32), run_as_user=pb.Int64Value(value=0)))),
     "run_as_group"),
    (ctr(linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        supplemental_groups=[5, -3]))), r"supplemental_groups\[1\]"),
    (ctr(linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        masked_paths=["proc/kcore"]))), r"masked_paths\[0\]"),
    (ctr(linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        seccomp=pb.SecurityProfile(profile_type=BAD_ENUM)))), r"seccomp\.profile_type"),
    (ctr(linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        apparmor=pb.SecurityProfile(profile_type=pb.SecurityProfile.Localhost)))),
     "apparmor is Localhost"),
    (ctr(linux=pb.LinuxContainerConfig(resources=R(cpu_shares=-1))), "cpu_shares"),
    (ctr(linux=pb.LinuxContainerConfig(resources=R(cpuset_cpus="0-999"))), "cpuset_cpus"),
])
def test_container_field_refused(config: pb.ContainerConfig, field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        validate_container_config(config, MAPPER)


@pytest.mark.parametrize("image", [
    "busybox", "docker.io/library/busybox:1.36", "127.0.0.1:5000/test/busybox:latest",
    "sha256:" + "a" * 64, "a" * 64, "abc123",
    "busybox@sha256:" + "b" * 64,
])
def test_image_refs_and_ids_accepted(image: str) -> None:
    validate_container_config(ctr(image=pb.ImageSpec(image=image)), MAPPER)


def test_bind_mount_flags_accepted() -> None:
    validate_container_config(ctr(mounts=[pb.Mount(
        container_path="/data", host_path="/tmp",
        mount_options=["noexec", "nodev", "nosuid", "noexec"])]), MAPPER)


def test_container_namespace_modes() -> None:
    c = ctr()
    c.linux.security_context.namespace_options.pid = pb.TARGET
    with pytest.raises(InvalidArgument, match="target_id"):
        validate_container_config(c, MAPPER)
    c.linux.security_context.namespace_options.target_id = "abc"
    validate_container_config(c, MAPPER)
    c.linux.security_context.namespace_options.network = BAD_ENUM
    with pytest.raises(InvalidArgument, match=r"namespace_options\.network"):
        validate_container_config(c, MAPPER)


# --- what build_spec used to check again (issue 54 item 2) ---

@pytest.mark.parametrize(("mount", "rule"), [
    (pb.Mount(container_path="/rro", host_path="/srv", recursive_read_only=True),
     "needs readonly=true"),
    (pb.Mount(container_path="/rro", host_path="/srv", readonly=True, recursive_read_only=True,
              propagation=pb.PROPAGATION_HOST_TO_CONTAINER), "private propagation"),
    (pb.Mount(container_path="/data"), "both container_path and host_path"),
])
def test_container_mount_rules(mount: pb.Mount, rule: str) -> None:
    with pytest.raises(InvalidArgument, match=rule):
        validate_container_config(ctr(mounts=[mount]), MAPPER)


def test_recursive_read_only_needs_the_kernel_for_it() -> None:
    rro = pb.Mount(container_path="/rro", host_path="/srv", readonly=True,
                   recursive_read_only=True)
    validate_container_config(ctr(mounts=[rro]), MAPPER)
    with pytest.raises(InvalidArgument, match=r"5\.12"):
        validate_container_config(ctr(mounts=[rro]), MAPPER, rro=False)


def test_unknown_capabilities_refused_unless_privileged() -> None:
    def caps(add: list[str], privileged: bool = False) -> pb.ContainerConfig:
        sc = pb.LinuxContainerSecurityContext(
            privileged=privileged, capabilities=pb.Capability(add_capabilities=add))
        return ctr(linux=pb.LinuxContainerConfig(security_context=sc))
    validate_container_config(caps(["NET_ADMIN", "ALL"]), MAPPER)
    validate_container_config(caps(["CAP_FLY"], privileged=True), MAPPER)
    with pytest.raises(InvalidArgument, match="unknown capability 'CAP_FLY'"):
        validate_container_config(caps(["fly"]), MAPPER)
