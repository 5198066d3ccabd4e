"""CRI → OCI spec mapping for containers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.spec import PodInfo, SpecHost, SpecInputs, build_spec, capabilities
from crishim.container.user import ResolvedUser
from crishim.errors import InvalidArgument
from crishim.host.facts import HostFacts, kernel_supports_rro
from crishim.oci.spec import DEFAULT_CAPS, DEFAULT_MASKED_PATHS, all_capabilities


def _spec(cfg: pb.ContainerConfig, image: dict[str, Any] | None = None,
          pod: PodInfo | None = None, host: SpecHost | None = None) -> dict[str, Any]:
    if not cfg.command:
        cfg.command.append("/bin/sh")
    return build_spec(SpecInputs(
        container_id="c1", config=cfg,
        pod=pod or PodInfo(id="p1", name="pod", namespace="ns", uid="u", hostname="pod",
                           netns_path="/run/crishim/netns/p1", pause_pid=42,
                           cgroup_parent="/kubepods/podu", hosts_path="/s/hosts",
                           resolv_path="/s/resolv.conf", hostname_path="/s/hostname",
                           shm_path="/s/shm", sysctls={"net.ipv4.ip_forward": "1"}),
        image_config=image or {}, image_name="busybox:latest", rootfs="/r/c1/rootfs",
        user=ResolvedUser(uid=1000, gid=1000, additional_gids=[1000, 10]),
        host=host or SpecHost(HostFacts(oom_score_adj_floor=-500))))


def _mount(spec: dict[str, Any], dest: str) -> dict[str, Any]:
    return next(m for m in spec["mounts"] if m["destination"] == dest)


def test_defaults_for_a_plain_container() -> None:
    spec = _spec(pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app")))
    proc = spec["process"]
    assert proc["user"] == {"uid": 1000, "gid": 1000, "additionalGids": [1000, 10]}
    assert proc["capabilities"]["bounding"] == DEFAULT_CAPS
    assert proc["oomScoreAdj"] == 0  # the requested 0 is above the floor
    linux = spec["linux"]
    assert linux["maskedPaths"] == DEFAULT_MASKED_PATHS
    assert {"type": "network", "path": "/run/crishim/netns/p1"} in linux["namespaces"]
    assert {"type": "ipc", "path": "/proc/42/ns/ipc"} in linux["namespaces"]
    assert {"type": "pid", "path": "/proc/42/ns/pid"} in linux["namespaces"]
    assert linux["cgroupsPath"] == "/kubepods/podu/crishim-c1"
    assert linux["sysctl"] == {"net.ipv4.ip_forward": "1"}
    # Deny all: the OCI runtime adds its standard devices itself, as for containerd.
    assert linux["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    assert "seccomp" not in linux  # no profile requested = unconfined (kubelet default)
    assert _mount(spec, "/etc/hosts")["source"] == "/s/hosts"
    assert _mount(spec, "/dev/shm")["source"] == "/s/shm"
    assert spec["annotations"]["io.kubernetes.cri.sandbox-id"] == "p1"


def test_annotations_that_switch_the_runtime_never_reach_the_spec() -> None:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"), annotations={
        "org.systemd.property.ExecStartPost": "['/bin/sh']", "run.oci.keep_original_groups": "1",
        "run.oci.seccomp.plugins": "/x.so", "module.wasm.image/variant": "compat",
        "org.criu.config": "/c", "org.opencontainers.runc.exec.isolated-cpu-affinity-transition":
        "temporary", "io.kubernetes.cri.sandbox-id": "other",
        "io.kubernetes.cri.sandbox-log-directory": "/etc",
        "io.kubernetes.container.hash": "abc", "example.com/mine": "kept"})
    ann = _spec(cfg)["annotations"]
    assert ann["io.kubernetes.container.hash"] == "abc" and ann["example.com/mine"] == "kept"
    assert ann["io.kubernetes.cri.sandbox-id"] == "p1"
    assert ann["run.oci.systemd.subgroup"] == ""  # crishim's own, for crun
    assert not [k for k in ann if k.startswith(("org.systemd.", "org.criu.", "module.wasm",
                                                 "org.opencontainers.runc."))]
    assert [k for k in ann if k.startswith("run.oci.")] == ["run.oci.systemd.subgroup"]
    assert "io.kubernetes.cri.sandbox-log-directory" not in ann


@pytest.mark.parametrize("asked", [True, False])
def test_no_new_privs_reaches_the_spec(asked: bool) -> None:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                             linux=pb.LinuxContainerConfig(
                                 security_context=pb.LinuxContainerSecurityContext(
                                     no_new_privs=asked)))
    assert _spec(cfg)["process"]["noNewPrivileges"] is asked


def test_oom_score_adj_clamped_to_the_daemon_floor() -> None:
    cfg = pb.ContainerConfig(linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(oom_score_adj=-998)))
    assert _spec(cfg)["process"]["oomScoreAdj"] == -500
    cfg.linux.resources.oom_score_adj = 900
    assert _spec(cfg)["process"]["oomScoreAdj"] == 900


def test_capabilities_add_drop_all() -> None:
    assert capabilities(["NET_ADMIN"], ["CHOWN"], False) == \
        [c for c in DEFAULT_CAPS if c != "CAP_CHOWN"] + ["CAP_NET_ADMIN"]
    assert capabilities(["NET_ADMIN"], ["ALL"], False) == ["CAP_NET_ADMIN"]
    assert "CAP_SYS_ADMIN" in capabilities(["ALL"], ["CHOWN"], False)
    assert "CAP_CHOWN" not in capabilities(["ALL"], ["CHOWN"], False)
    assert capabilities([], [], True) == all_capabilities()


def test_privileged_has_no_masking_no_seccomp_all_devices() -> None:
    sc = pb.LinuxContainerSecurityContext(
        privileged=True, seccomp=pb.SecurityProfile(profile_type=0))
    spec = _spec(pb.ContainerConfig(linux=pb.LinuxContainerConfig(security_context=sc)))
    linux = spec["linux"]
    assert "maskedPaths" not in linux and "readonlyPaths" not in linux
    assert "seccomp" not in linux
    assert linux["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert any(d["path"] == "/dev/null" for d in linux["devices"])
    assert "ro" not in _mount(spec, "/sys")["options"]


def test_seccomp_profiles(tmp_path: Path) -> None:
    sc = pb.LinuxContainerSecurityContext(seccomp=pb.SecurityProfile(
        profile_type=pb.SecurityProfile.RuntimeDefault))
    cfg = pb.ContainerConfig(linux=pb.LinuxContainerConfig(security_context=sc))
    prof = _spec(cfg)["linux"]["seccomp"]
    allowed = {n for r in prof["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and
               "args" not in r for n in r["names"]}
    assert prof["defaultAction"] == "SCMP_ACT_ERRNO"
    assert {"read", "write", "execve"} <= allowed
    assert not {"unshare", "mount", "keyctl", "setns", "bpf", "ptrace"} & allowed
    # CAP_SYS_ADMIN brings mount & co back, like Docker's profile.
    cfg.linux.security_context.capabilities.add_capabilities.append("SYS_ADMIN")
    prof = _spec(cfg)["linux"]["seccomp"]
    assert any("mount" in r["names"] and r["action"] == "SCMP_ACT_ALLOW"
               for r in prof["syscalls"])
    path = tmp_path / "p.json"
    path.write_text('{"defaultAction": "SCMP_ACT_LOG"}')
    cfg.linux.security_context.seccomp.CopyFrom(pb.SecurityProfile(
        profile_type=pb.SecurityProfile.Localhost, localhost_ref=str(path)))
    assert _spec(cfg)["linux"]["seccomp"] == {"defaultAction": "SCMP_ACT_LOG"}
    cfg.linux.security_context.seccomp.localhost_ref = str(tmp_path / "missing.json")
    with pytest.raises(InvalidArgument, match="does not exist"):
        _spec(cfg)
    cfg.linux.security_context.seccomp.profile_type = pb.SecurityProfile.Unconfined
    assert "seccomp" not in _spec(cfg)["linux"]


def test_cri_mounts(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    cfg = pb.ContainerConfig(mounts=[
        pb.Mount(container_path="/data/sub", host_path=str(tmp_path / "new")),
        pb.Mount(container_path="/data", host_path=str(tmp_path / "link"), readonly=True,
                 propagation=pb.PROPAGATION_HOST_TO_CONTAINER),
        pb.Mount(container_path="/etc/hosts", host_path=str(real)),
        pb.Mount(container_path="/rro", host_path=str(real), readonly=True,
                 recursive_read_only=True),
    ])
    spec = _spec(cfg)
    data = _mount(spec, "/data")
    assert data["source"] == str(real)  # the symlink is resolved
    assert data["options"] == ["rbind", "rslave", "ro"]
    assert (tmp_path / "new").is_dir()  # a missing host path becomes a directory
    dests = [m["destination"] for m in spec["mounts"]]
    assert dests.index("/data") < dests.index("/data/sub")
    assert _mount(spec, "/etc/hosts")["source"] == str(real)  # CRI mount wins
    assert dests.count("/etc/hosts") == 1
    assert _mount(spec, "/rro")["options"][-1] == "rro"
    assert spec["linux"]["rootfsPropagation"] == "rslave"


def test_image_volume_mounts_bind_the_mounted_image_read_only() -> None:
    vol = pb.Mount(container_path="/mnt/img", readonly=True,
                   image=pb.ImageSpec(image="busybox:latest"))
    cfg = pb.ContainerConfig(command=["sh"], mounts=[vol])
    spec = build_spec(SpecInputs(
        container_id="c1", config=cfg, pod=PodInfo(id="p1"), image_config={},
        image_name="busybox", rootfs="/r/c1/rootfs", user=ResolvedUser(),
        image_volumes={0: "/r/c1/image-volumes/0"}))
    m = _mount(spec, "/mnt/img")
    assert (m["source"], m["options"]) == ("/r/c1/image-volumes/0", ["rbind", "rprivate", "ro"])
    with pytest.raises(InvalidArgument, match="not mounted"):
        _spec(pb.ContainerConfig(mounts=[vol]))  # never bound from a host path


def test_mount_options_are_set_on_the_bind() -> None:
    cfg = pb.ContainerConfig(command=["sh"], mounts=[
        pb.Mount(container_path="/data", host_path="/tmp", readonly=True,
                 mount_options=["noexec", "nosuid", "noexec"]),
        pb.Mount(container_path="/mnt/img", readonly=True, mount_options=["nodev"],
                 image=pb.ImageSpec(image="busybox:latest"))])
    spec = build_spec(SpecInputs(
        container_id="c1", config=cfg, pod=PodInfo(id="p1"), image_config={},
        image_name="busybox", rootfs="/r/c1/rootfs", user=ResolvedUser(),
        image_volumes={1: "/r/c1/image-volumes/1"}))
    assert _mount(spec, "/data")["options"] == ["rbind", "rprivate", "ro", "noexec", "nosuid"]
    assert _mount(spec, "/mnt/img")["options"] == ["rbind", "rprivate", "ro", "nodev"]


def test_namespace_modes() -> None:
    sc = pb.LinuxContainerSecurityContext(namespace_options=pb.NamespaceOption(
        network=pb.NODE, pid=pb.CONTAINER, ipc=pb.NODE))
    ns = _spec(pb.ContainerConfig(linux=pb.LinuxContainerConfig(security_context=sc)))[
        "linux"]["namespaces"]
    assert [n["type"] for n in ns] == ["mount", "pid"]
    sc.namespace_options.pid = pb.TARGET
    sc.namespace_options.target_id = "other"
    ns = _spec(pb.ContainerConfig(linux=pb.LinuxContainerConfig(security_context=sc)),
               host=SpecHost(target_pid=77))["linux"]["namespaces"]
    assert {"type": "pid", "path": "/proc/77/ns/pid"} in ns


def test_resources_and_readonly_rootfs() -> None:
    res = pb.LinuxContainerResources(cpu_shares=512, cpu_quota=50000, cpu_period=100000,
                                     cpuset_cpus="0", memory_limit_in_bytes=64 << 20,
                                     hugepage_limits=[pb.HugepageLimit(page_size="2MB",
                                                                       limit=0)])
    sc = pb.LinuxContainerSecurityContext(readonly_rootfs=True, masked_paths=["/proc/x"],
                                          readonly_paths=["/proc/y"])
    spec = _spec(pb.ContainerConfig(linux=pb.LinuxContainerConfig(resources=res,
                                                                  security_context=sc)))
    r = spec["linux"]["resources"]
    assert r["cpu"] == {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0"}
    assert r["memory"] == {"limit": 64 << 20, "swap": 64 << 20}
    assert r["hugepageLimits"] == [{"pageSize": "2MB", "limit": 0}]
    assert spec["root"]["readonly"] is True
    assert "ro" in _mount(spec, "/etc/resolv.conf")["options"]
    assert spec["linux"]["maskedPaths"] == ["/proc/x"]
    assert spec["linux"]["readonlyPaths"] == ["/proc/y"]
    res.unified["memory.high"] = "1"
    with pytest.raises(InvalidArgument, match="cgroup v2"):
        _spec(pb.ContainerConfig(linux=pb.LinuxContainerConfig(resources=res)))


def test_process_from_image_config() -> None:
    cfg = pb.ContainerConfig(args=["-x"], envs=[pb.KeyValue(key="A", value=b"1")], tty=True)
    spec = build_spec(SpecInputs("c", cfg, PodInfo(id="p"), {
        "Entrypoint": ["/ep"], "Cmd": ["c"], "Env": ["A=0", "B=2"], "WorkingDir": "/w"},
        "img", "/r", ResolvedUser()))
    proc = spec["process"]
    assert proc["args"] == ["/ep", "-x"]
    assert "A=1" in proc["env"] and "B=2" in proc["env"]
    assert proc["cwd"] == "/w" and proc["terminal"] is True


def test_rro_detection() -> None:
    assert kernel_supports_rro("6.1.0-18-amd64") and kernel_supports_rro("5.12.0")
    assert not kernel_supports_rro("5.10.0-28-amd64")


def test_sysctls_only_for_namespaces_the_container_owns() -> None:
    pod = PodInfo(id="p", pause_pid=1, sysctls={"net.ipv4.ip_forward": "1",
                                                "kernel.shm_rmid_forced": "1",
                                                "vm.swappiness": "1"})
    spec = _spec(pb.ContainerConfig(), pod=pod)
    assert spec["linux"]["sysctl"] == {"net.ipv4.ip_forward": "1", "kernel.shm_rmid_forced": "1"}
    sc = pb.LinuxContainerSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE))
    spec = _spec(pb.ContainerConfig(linux=pb.LinuxContainerConfig(security_context=sc)), pod=pod)
    assert spec["linux"]["sysctl"] == {"kernel.shm_rmid_forced": "1"}
