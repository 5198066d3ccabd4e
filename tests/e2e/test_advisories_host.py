"""The advisory record, host side: each published containerd / CRI-O advisory whose class
reaches the node (host paths, sysctls, annotations, sockets) performed against crishim
through the real socket, with real runc, conmon and CNI.

Every test asserts that nothing outside the attacker's own pod changed: a canary
directory outside the daemon's roots is byte-for-byte as before and has nothing mounted
on it, the host's sysctls hold their values, another pod is untouched; or, where the
class cannot apply to crishim, that the input is refused with its gRPC code and a
message naming the field. One daemon for the module, on its own CNI network.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import socket
import tarfile
import tempfile
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e import imagebuild as ib
from tests.e2e.canary import Canary
from tests.e2e.cni import module_network
from tests.e2e.faults import mounts_under
from tests.e2e.lifecycle import Env, container, daemon_env, exec_sync, log_lines
from tests.e2e.lifecycle import remove_pod as remove
from tests.e2e.lifecycle import status as ctr_status
from tests.e2e.registry import Registry
from tests.e2e.sandboxes import running_pod

_pods = 0


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-advh",
                    *module_network("advisories-host")) as e:
        yield e


@pytest.fixture()
def canary() -> Iterator[Canary]:
    """A host directory outside every root, checked unchanged (and unmounted) after the
    test; its path is what the hostile images point at."""
    d = tempfile.mkdtemp(prefix="crishim-adv-canary-")
    os.chmod(d, 0o755)
    os.makedirs(os.path.join(d, "sub"))
    with open(os.path.join(d, "secret"), "w") as fh:
        fh.write("host secret\n")
    with open(os.path.join(d, "sub", "nested"), "w") as fh:
        fh.write("nested\n")
    c = Canary(d)
    before = c.snapshot()
    try:
        yield c
        assert mounts_under(d) == [], "a mount landed on the host's canary"
        assert c.snapshot() == before, "something outside the pod changed"
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- pods and images ------------------------------------------------------------------------

def pod_config(env: Env, *, host_network: bool = False, host_ipc: bool = False,
               annotations: dict[str, str] | None = None,
               sysctls: dict[str, str] | None = None, log_directory: str = "",
               dns: pb.DNSConfig | None = None) -> pb.PodSandboxConfig:
    global _pods
    _pods += 1
    name = f"advh{_pods}"
    ns = pb.NamespaceOption(network=pb.NODE if host_network else pb.POD,
                            ipc=pb.NODE if host_ipc else pb.POD)
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="e2e", uid=f"uid-{name}"),
        hostname="" if host_network else name,
        log_directory=log_directory or os.path.join(env.tmpdir, "logs", name),
        annotations=annotations or {}, dns_config=dns,
        linux=pb.LinuxPodSandboxConfig(
            sysctls=sysctls or {},
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))


def refused_pod(env: Env, cfg: pb.PodSandboxConfig, code: grpc.StatusCode, *words: str) -> str:
    """RunPodSandbox fails with `code`, naming each of `words`; no pod is left."""
    with pytest.raises(grpc.RpcError) as info:
        sid = env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                     timeout=60).pod_sandbox_id
        remove(env, sid)
    details = str(info.value.details())
    assert info.value.code() == code, details
    for w in words:
        assert w in details, details
    assert not any(p.metadata.name == cfg.metadata.name for p in env.rt().ListPodSandbox(
        pb.ListPodSandboxRequest(), timeout=10).items)
    return details


def refused_container(env: Env, sid: str, pod_cfg: pb.PodSandboxConfig,
                      cfg: pb.ContainerConfig, code: grpc.StatusCode, *words: str) -> str:
    with pytest.raises(grpc.RpcError) as info:
        env.rt().CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=cfg, sandbox_config=pod_cfg), timeout=60)
    details = str(info.value.details())
    assert info.value.code() == code, details
    for w in words:
        assert w in details, details
    assert not env.rt().ListContainers(pb.ListContainersRequest(filter=pb.ContainerFilter(
        pod_sandbox_id=sid)), timeout=10).containers
    return details


def push_pull(env: Env, repo: str, img: ib.BuiltImage) -> str:
    ib.push_image(env.registry.push_host, repo, "v1", img)
    image = ib.ref(env.registry.host, repo, "v1")
    env.d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=image)), timeout=120)
    return image


def busybox_without(*tops: str) -> bytes:
    """The base busybox layer minus the entries under `tops` (so a later entry of the same
    name can be a symlink instead of a directory)."""
    src = tarfile.open(fileobj=io.BytesIO(ib.busybox_layer_tar()))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for m in src.getmembers():
            if m.name.split("/")[0] in tops:
                continue
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out.getvalue()


def logs_of(cfg: pb.PodSandboxConfig, name: str) -> list[str]:
    return [t for _, t in log_lines(os.path.join(cfg.log_directory, f"{name}.log"))]


def wait_output(env: Env, cid: str, cfg: pb.PodSandboxConfig, name: str,
                last: str) -> list[str]:
    """The container's log lines once it printed `last` (checked between exec calls, which
    take a real round trip each, so no sleep is needed)."""
    out: list[str] = []
    for _ in range(200):
        with contextlib.suppress(FileNotFoundError):
            out = logs_of(cfg, name)
        if last in out:
            return out
        if ctr_status(env, cid).status.state == pb.CONTAINER_EXITED:
            out = logs_of(cfg, name)
            break
        exec_sync(env, cid, ["true"])
    assert last in out, (out, env.d.logs()[-3000:])
    return out


def spec_of(env: Env, cid: str) -> dict[str, Any]:
    with open(os.path.join(env.d.root, "containers", cid, "config.json")) as fh:
        spec: dict[str, Any] = json.load(fh)
    return spec


# --- CRI-O CVE-2024-5154: symlinks in the image followed by the runtime on the host --------

def test_cve_2024_5154_image_symlinks_at_runtime_written_paths_stay_in_the_rootfs(
        env: Env, canary: Canary, tmp_path: Any) -> None:
    """Every path the runtime writes into or mounts onto a container's rootfs is a symlink
    in the image pointing at the host's canary (absolute, and through `..`): the pod's
    /etc files, the termination log, /run/secrets, a bind mount's target, the working
    directory, an image volume's target. Each lands inside the rootfs."""
    c = canary.path
    up = "../../../../../../../.." + c
    layer = [
        ib.symlink("etc/hosts", c + "/secret"),
        ib.symlink("etc/hostname", up + "/hostname-new"),
        ib.symlink("etc/resolv.conf", c + "/sub2/nested"),
        ib.directory("run"), ib.symlink("run/secrets", up + "/secrets"),
        ib.symlink("data", c + "/sub"),
        ib.symlink("work", up + "/wd"),
        ib.symlink("imgvol", c + "/iv"),
        ib.symlink("termlog", up + "/term"),
    ]
    image = push_pull(env, "adv/symlinks", ib.build_busybox(extra_layers=[layer]))
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "from-volume").write_text("volume\n")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "token").write_text("token\n")
    script = ("cat /etc/hostname; grep -q localhost /etc/hosts && echo hosts; "
              "cat /data/from-volume; cat /run/secrets/token; ls /imgvol | head -1; "
              "cat /etc/hosts /etc/resolv.conf | grep -c 'host secret\\|nested'; "
              "echo done; sleep 300")
    cfg = pod_config(env, dns=pb.DNSConfig(servers=["10.0.0.10"]))
    with running_pod(env.rt(), cfg) as sid:
        cid = container(
            env, sid, cfg, "links", ["sh", "-c", script], image=image,
            annotations={"io.kubernetes.container.terminationMessagePath": "/termlog"},
            mounts=[pb.Mount(container_path="/data", host_path=str(vol)),
                    pb.Mount(container_path="/run/secrets", host_path=str(secrets),
                             readonly=True),
                    pb.Mount(container_path="/imgvol", readonly=True,
                             image=pb.ImageSpec(image=env.busybox))])
        out = wait_output(env, cid, cfg, "links", "done")
        assert out[:7] == [cfg.hostname, "hosts", "volume", "token", "bin", "0", "done"], out
        # Into the pod's volume, not the host path the image named.
        assert exec_sync(env, cid, ["sh", "-c", "echo x > /data/new"]).exit_code == 0
        assert (vol / "new").read_text() == "x\n"
        # The termination log mounted where the link led inside the rootfs: the pod's file.
        assert exec_sync(env, cid, ["sh", "-c", "echo bye > /termlog"]).exit_code == 0
        with open(os.path.join(env.d.root, "containers", cid, "termination-log")) as fh:
            assert fh.read() == "bye\n"
        # A working directory that is a dangling link to a host path: runc makes it (or
        # gives up) inside the container's root, never on the host.
        try:
            wid = container(env, sid, cfg, "workdir", ["sh", "-c", "pwd; touch here; sleep 300"],
                            image=image, working_dir="/work")
        except grpc.RpcError as exc:
            assert "/work" in str(exc.details()), exc.details()
        else:
            assert exec_sync(env, wid, ["ls", "/work/here"]).exit_code == 0


def test_cve_2024_5154_an_image_whose_etc_is_a_host_symlink_writes_nothing_there(
        env: Env, canary: Canary) -> None:
    """CRI-O's case: the image's /etc itself is a link to a host directory, and the
    runtime makes /etc and the files in it before the container starts."""
    layer = busybox_without("etc")
    for n, target in enumerate((canary.path, "../../../../../.." + canary.path)):
        image = push_pull(env, f"adv/etc-link{n}", ib.build_image(
            [layer, [ib.symlink("etc", target)]]))
        cfg = pod_config(env, dns=pb.DNSConfig(servers=["10.0.0.10"]))
        with running_pod(env.rt(), cfg) as sid:
            cid = container(env, sid, cfg, "etclink", [
                "sh", "-c", "cat /etc/hostname; ls /etc | sort | tr '\\n' ' '; echo; "
                            "echo done; sleep 300"], image=image)
            out = wait_output(env, cid, cfg, "etclink", "done")
            assert out[0] == cfg.hostname, out
            assert out[1].split() == ["hostname", "hosts", "resolv.conf"], (target, out)


# --- CRI-O CVE-2025-0750: log paths reaching other mounts ---------------------------------

def test_cve_2025_0750_log_paths_cannot_leave_the_pods_log_directory(
        env: Env, canary: Canary) -> None:
    bad_dirs = [canary.path + "/../" + os.path.basename(canary.path), "relative/logs",
                "/var/log/pods/../../.." + canary.path, "/var/log/pods/x\n/y"]
    for logdir in bad_dirs:
        refused_pod(env, pod_config(env, log_directory=logdir),
                    grpc.StatusCode.INVALID_ARGUMENT, "log_directory")
    cfg = pod_config(env)
    with running_pod(env.rt(), cfg) as sid:
        for path in ("../../../../../.." + canary.path + "/x.log", canary.path + "/x.log",
                     "c/../../x.log", "c/./0.log", "c\n0.log"):
            ccfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="logs"),
                                      image=pb.ImageSpec(image=env.busybox),
                                      command=["true"], log_path=path)
            refused_container(env, sid, cfg, ccfg, grpc.StatusCode.INVALID_ARGUMENT,
                              "log_path")


def test_cve_2025_0750_a_log_linking_annotation_mounts_and_unmounts_nothing(
        env: Env, canary: Canary) -> None:
    """CRI-O's log linking (an annotation naming an emptyDir to mount the pod's logs
    into) reached other mounts through `..` in the name: crishim has no such switch, so
    the annotation mounts nothing, and stopping the pod unmounts nothing."""
    before = node_mounts()
    up = "../../../../../../.." + canary.path
    cfg = pod_config(env, annotations={"io.kubernetes.cri-o.LinkLogs": up,
                                       "io.kubernetes.cri-o.LinkLogs/logs": up})
    with running_pod(env.rt(), cfg) as sid:
        container(env, sid, cfg, "logs", ["sh", "-c", "echo hello; sleep 300"])
    assert before <= node_mounts(), before - node_mounts()


def node_mounts() -> set[tuple[str, str]]:
    """The node's own mounts: all but those tests (this one's or others running beside
    it) make and remove, below temp dirs, netns pins and runtime state."""
    scratch = ("/tmp/", "/run/netns/", "/var/run/netns/", "/run/crishim", "/run/user/",
               "/var/lib/crishim", "/var/lib/kubelet", "/run/containerd")
    return {(mp, fs) for mp, fs in mounts_under("/") if not mp.startswith(scratch)}


# --- containerd CVE-2022-23648: image VOLUMEs copying host files -------------------------

def test_cve_2022_23648_image_volumes_copy_nothing_from_the_host(
        env: Env, canary: Canary) -> None:
    """The image config's Volumes name host paths (through `..`, absolutely, and through a
    symlink in the image): nothing of the host appears in the container."""
    c = canary.path
    volumes = {"/../../../../../../.." + c: {}, c + "/sub": {}, "/vol-link": {},
               "/vol-link/sub": {}}
    img = ib.build_busybox(extra_layers=[[ib.symlink("vol-link", c)]],
                           config_overrides={"Volumes": volumes})
    image = push_pull(env, "adv/volumes", img)
    probe = (f"cat {c}/secret {c}/sub/nested /vol-link/secret /vol-link/sub/nested "
             f"2>/dev/null; ls -A {c} /vol-link/ 2>/dev/null; echo done; sleep 300")
    cfg = pod_config(env)
    with running_pod(env.rt(), cfg) as sid:
        cid = container(env, sid, cfg, "vols", ["sh", "-c", probe], image=image)
        out = wait_output(env, cid, cfg, "vols", "done")
        assert out == ["done"], out
        # And writing there stays in the container's own rootfs.
        res = exec_sync(env, cid, ["sh", "-c", f"mkdir -p {c} && echo pod > {c}/secret"])
        assert res.exit_code == 0, res


def test_cve_2022_23648_image_volume_sub_paths_resolve_inside_the_image(
        env: Env, canary: Canary) -> None:
    c = canary.path
    img = ib.build_busybox(extra_layers=[[ib.symlink("abs", c),
                                          ib.symlink("rel", "../../../../../../.." + c)]])
    image = push_pull(env, "adv/subpaths", img)
    cfg = pod_config(env)
    with running_pod(env.rt(), cfg) as sid:
        for sub, code, word in (("../../../../.." + c, grpc.StatusCode.INVALID_ARGUMENT,
                                 "image_sub_path"),
                                (c, grpc.StatusCode.INVALID_ARGUMENT, "image_sub_path"),
                                ("abs", grpc.StatusCode.NOT_FOUND, "does not exist"),
                                ("rel/sub", grpc.StatusCode.NOT_FOUND, "does not exist")):
            ccfg = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="sub"), image=pb.ImageSpec(image=image),
                command=["true"], log_path="sub.log",
                mounts=[pb.Mount(container_path="/mnt", readonly=True, image_sub_path=sub,
                                 image=pb.ImageSpec(image=image))])
            refused_container(env, sid, cfg, ccfg, code, word)


# --- CRI-O CVE-2022-0811: sysctls --------------------------------------------------------

def host_sysctl(name: str) -> str:
    with open("/proc/sys/" + name.replace(".", "/")) as fh:
        return fh.read()


HOST_SYSCTLS = ("kernel.core_pattern", "kernel.shm_rmid_forced", "kernel.msgmax",
                "kernel.sem", "fs.mqueue.msg_max", "net.ipv4.ip_unprivileged_port_start",
                "net.core.somaxconn", "kernel.hostname")


def test_cve_2022_0811_sysctl_value_cannot_smuggle_a_second_key(
        env: Env, canary: Canary) -> None:
    before = {n: host_sysctl(n) for n in HOST_SYSCTLS}
    hook = f"|{canary.path}/pwned %p"
    for value in (f"1+kernel.core_pattern={hook}", f"1\nkernel.core_pattern={hook}",
                  f"1 kernel.core_pattern={hook}", f"1=kernel.core_pattern={hook}",
                  f"1,kernel.core_pattern={hook}"):
        cfg = pod_config(env, sysctls={"kernel.shm_rmid_forced": value})
        with pytest.raises(grpc.RpcError) as info:
            with running_pod(env.rt(), cfg):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert "kernel.shm_rmid_forced" in str(info.value.details())
        assert {n: host_sysctl(n) for n in HOST_SYSCTLS} == before, value
    # A key smuggled in the name is not a sysctl name.
    for name in ("kernel.shm_rmid_forced=1+kernel.core_pattern", "kernel/../core_pattern",
                 "net.core.somaxconn\nkernel.core_pattern"):
        refused_pod(env, pod_config(env, sysctls={name: "1"}),
                    grpc.StatusCode.INVALID_ARGUMENT, "sysctl")
    assert {n: host_sysctl(n) for n in HOST_SYSCTLS} == before


def test_cve_2022_0811_namespaced_sysctls_are_refused_for_host_namespaces(
        env: Env, canary: Canary) -> None:
    before = {n: host_sysctl(n) for n in HOST_SYSCTLS}
    for name, value in (("net.core.somaxconn", "17"),
                        ("net.ipv4.ip_unprivileged_port_start", "7")):
        refused_pod(env, pod_config(env, host_network=True, sysctls={name: value}),
                    grpc.StatusCode.INVALID_ARGUMENT, name, "host-network")
    refused_pod(env, pod_config(env, host_network=True, sysctls={"kernel.hostname": "x"}),
                grpc.StatusCode.INVALID_ARGUMENT, "kernel.hostname")
    for name, value in (("kernel.shm_rmid_forced", "1"), ("kernel.msgmax", "777"),
                        ("kernel.sem", "1 2 3 4"), ("fs.mqueue.msg_max", "17")):
        refused_pod(env, pod_config(env, host_ipc=True, sysctls={name: value}),
                    grpc.StatusCode.INVALID_ARGUMENT, name, "host IPC")
    # Node-wide ones are refused whatever the pod shares.
    refused_pod(env, pod_config(env, sysctls={"kernel.core_pattern": "|/bin/true"}),
                grpc.StatusCode.INVALID_ARGUMENT, "kernel.core_pattern", "not namespaced")
    assert {n: host_sysctl(n) for n in HOST_SYSCTLS} == before
    # The same sysctls in the pod's own namespaces: set there, and only there.
    mine = {"net.core.somaxconn": "17", "net.ipv4.ip_unprivileged_port_start": "7",
            "kernel.shm_rmid_forced": "1", "kernel.msgmax": "777", "fs.mqueue.msg_max": "17"}
    mine = {k: v for k, v in mine.items() if host_sysctl(k).strip() != v}
    cfg = pod_config(env, sysctls=mine)
    with running_pod(env.rt(), cfg) as sid:
        cid = container(env, sid, cfg, "ns", ["sleep", "300"])
        for name, value in mine.items():
            res = exec_sync(env, cid, ["cat", "/proc/sys/" + name.replace(".", "/")])
            assert res.stdout.decode().strip() == value, (name, res)
        assert {n: host_sysctl(n) for n in HOST_SYSCTLS} == before


# --- CRI-O CVE-2024-3154: annotations reaching host controls -----------------------------

# Keys the OCI runtimes (runc, crun) or another CRI runtime read as instructions: systemd
# unit properties, crun's switches (groups, hooks' output files, seccomp plugins, cgroup
# mounts), CRI-O's unified cgroup and device annotations, containerd's runtime options.
def hostile_annotations(c: str, other_pod: str) -> dict[str, str]:
    return {
        "org.systemd.property.ExecStartPost": f"['/bin/sh', '-c', 'touch {c}/systemd']",
        "org.systemd.property.Delegate": "true",
        "org.systemd.property.CPUQuota": "1%",
        "run.oci.keep_original_groups": "1",
        "run.oci.hooks.stdout": f"{c}/hooks-out",
        "run.oci.hooks.stderr": f"{c}/hooks-err",
        "run.oci.seccomp.plugins": f"{c}/plugin.so",
        "run.oci.seccomp.receiver": f"{c}/receiver.sock",
        "run.oci.systemd.force_cgroup_v1": "/sys/fs/cgroup",
        "run.oci.handler": "krun",
        "module.wasm.image/variant": "compat",
        "org.criu.config": f"{c}/criu.conf",
        "io.kubernetes.cri-o.UnifiedCgroup.ctr": "memory.max=4096",
        "io.kubernetes.cri-o.Devices": "/dev/sda:/dev/xvda:rwm",
        "io.kubernetes.cri-o.userns-mode": "auto",
        "io.containerd.runc.v2.group": other_pod,
        "io.kubernetes.cri.sandbox-id": other_pod,
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-log-directory": c,
        "unified": "memory.max=4096",
    }


RUNTIME_PREFIXES = ("org.systemd.property.", "run.oci.", "module.wasm.image/", "org.criu.")


def test_cve_2024_3154_pod_and_container_annotations_switch_no_host_control(
        env: Env, canary: Canary) -> None:
    victim_cfg = pod_config(env, annotations={"owner": "victim"})
    with running_pod(env.rt(), victim_cfg) as victim:
        v_cid = container(env, victim, victim_cfg, "victim", ["sleep", "300"])
        victim_before = spec_of(env, v_cid)
        hostile = hostile_annotations(canary.path, victim)
        # As labels too: a label is never anything but metadata.
        cfg = pod_config(env, annotations=hostile)
        cfg.labels.update(hostile)
        with running_pod(env.rt(), cfg) as sid:
            cid = container(env, sid, cfg, "ctr", ["sleep", "300"], annotations=hostile,
                            labels=hostile)
            assert ctr_status(env, cid).status.state == pb.CONTAINER_RUNNING
            spec = spec_of(env, cid)
            with open(os.path.join(env.d.root, "sandboxes", sid, "bundle",
                                   "config.json")) as fh:
                pause = json.load(fh)
            assert not set(pause["annotations"]) & set(hostile) - {
                "io.kubernetes.cri.sandbox-id", "io.kubernetes.cri.container-type",
                "io.kubernetes.cri.sandbox-log-directory"}, pause["annotations"]
            assert pause["annotations"]["io.kubernetes.cri.container-type"] == "sandbox"
            specs = [spec, pause]
            for s in specs:
                ann = s.get("annotations", {})
                # Only crishim's own: no sub-cgroup below the unit, for crun.
                assert {k: v for k, v in ann.items() if k.startswith(RUNTIME_PREFIXES)} == \
                    {"run.oci.systemd.subgroup": ""}, ann
                assert ann.get("io.kubernetes.cri.sandbox-id") == sid
                assert ann.get("io.kubernetes.cri.sandbox-log-directory",
                               cfg.log_directory) == cfg.log_directory
            assert spec["annotations"]["io.kubernetes.cri.container-type"] == "container"
            # No cgroup limit or device from an annotation: the container allocates and
            # its device list is the default one.
            res = exec_sync(env, cid, ["sh", "-c", "head -c 1048576 /dev/zero | wc -c; "
                                                   "ls /dev/sda /dev/xvda 2>&1 | wc -l"])
            assert res.stdout.decode().split() == ["1048576", "2"], res
            assert "memory" not in spec["linux"].get("resources", {}) or \
                spec["linux"]["resources"]["memory"].get("limit", 0) in (0, None)
            # Its own groups, not the daemon's.
            res = exec_sync(env, cid, ["id", "-G"])
            assert res.stdout.decode().split() == ["0"], res
            # Nothing of it shows in the victim pod.
            listed = env.rt().ListContainers(pb.ListContainersRequest(
                filter=pb.ContainerFilter(pod_sandbox_id=victim)), timeout=10).containers
            assert [x.id for x in listed] == [v_cid]
            assert spec_of(env, v_cid) == victim_before
            vst = env.rt().PodSandboxStatus(pb.PodSandboxStatusRequest(
                pod_sandbox_id=victim), timeout=10).status
            assert dict(vst.annotations) == {"owner": "victim"}
            assert vst.state == pb.SANDBOX_READY


# --- containerd CVE-2020-15257: abstract sockets reachable from hostNetwork pods ---------

def socket_inodes(pid: int) -> set[str]:
    out: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                m = re.fullmatch(r"socket:\[(\d+)\]", link)
                if m:
                    out.add(m.group(1))
    return out


def monitor_pids(env: Env) -> list[int]:
    """The daemon, and every process whose command line names its state or root dir
    (conmon, runc and their helpers) that is not a container's own process."""
    assert env.d.proc is not None
    pids = [env.d.proc.pid]
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            with open(f"/proc/{p}/comm") as fh:
                comm = fh.read().strip()
            if comm in ("conmon", "runc", "crun") and any(
                    env.d.state.encode() in a or env.d.root.encode() in a for a in argv):
                pids.append(int(p))
    return pids


def test_cve_2020_15257_no_abstract_socket_of_crishim_or_its_monitors_reaches_host_network_pods(
        env: Env) -> None:
    cfg = pod_config(env, host_network=True)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"crishim-adv-probe-{os.getpid()}"
    probe.bind("\0" + name)
    probe.listen(1)
    try:
        with running_pod(env.rt(), cfg) as sid:
            ns = pb.NamespaceOption(network=pb.NODE)
            cid = container(env, sid, cfg, "hostnet", ["sleep", "300"],
                            linux=pb.LinuxContainerConfig(
                                security_context=pb.LinuxContainerSecurityContext(
                                    namespace_options=ns)))
            res = exec_sync(env, cid, ["cat", "/proc/net/unix"])
            assert res.exit_code == 0, res
            abstract: dict[str, str] = {}
            for line in res.stdout.decode().splitlines()[1:]:
                parts = line.split()
                if len(parts) >= 8 and parts[7].startswith("@"):
                    abstract[parts[6]] = parts[7]
            # The container sees the host's abstract namespace (the test's own socket):
            # what crishim would bind there, it could reach.
            assert "@" + name in abstract.values(), sorted(abstract.values())
            pids = monitor_pids(env)
            assert len(pids) >= 2, pids  # the daemon and the container's conmon
            owned = set().union(*(socket_inodes(p) for p in pids))
            assert owned, "no socket of the daemon was found"
            reachable = {abstract[i] for i in owned & abstract.keys()}
            assert reachable == set(), reachable
    finally:
        probe.close()
