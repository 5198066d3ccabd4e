"""Images on a filesystem of their own (`image_root` on a loop-mounted ext4), containers'
writable layers, bundles and pods under root on another: ImageFsInfo reports the two, the
container's writes land on root's disk and not on the image disk, a pod in a user
namespace and an image volume work from there, image GC frees the image disk, a crash
and a restart find everything again, a store moved from one layout to the other keeps
its images, and a writable-layer cap asked for is refused naming the filesystem."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host.fsusage import mountpoint
from crishim.host.quota import probe
from tests.e2e.cni import module_network
from tests.e2e.faults import mounts_under, networked_daemon, wait_for
from tests.e2e.lifecycle import Env, container, exec_sync, pod, remove_pod, run_pod, status
from tests.e2e.loopfs import loop_filesystem
from tests.e2e.registry import Registry

MiB = 1024 * 1024
# A host id range no other test uses (test_userns: 65536 * 40..79).
HOST_ID = 65536 * (100 + os.getpid() % 40)


@dataclass
class SplitEnv(Env):
    disk: str = ""  # the image filesystem's mount point
    config_file: str = ""

    @property
    def image_dir(self) -> str:
        return os.path.join(self.disk, "crishim-images")


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[SplitEnv]:
    with loop_filesystem() as disk:
        config = (f'image_root = "{disk}/crishim-images"\n'
                  '[storage]\ncontainer_rootfs_size_max = "1Gi"\n')
        with networked_daemon("crishim-splitfs", *module_network("splitfs"), config,
                              busybox_ref) as nd:
            yield SplitEnv(nd.d, nd.tmpdir, nd.bridge, registry, busybox_ref, disk,
                           nd.d.config_file)


def _fs_info(env: Env) -> tuple[pb.FilesystemUsage, pb.FilesystemUsage]:
    resp = env.d.images().ImageFsInfo(pb.ImageFsInfoRequest(), timeout=30)
    (img,), (ctr,) = resp.image_filesystems, resp.container_filesystems
    return img, ctr


def _disk_used(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _pulled(env: Env) -> str:
    return str(env.d.images().PullImage(pb.PullImageRequest(
        image=pb.ImageSpec(image=env.busybox)), timeout=120).image_ref)


def test_images_and_writable_layers_are_two_filesystems(env: SplitEnv) -> None:
    _pulled(env)
    assert not os.path.exists(os.path.join(env.d.root, "images"))
    assert os.listdir(os.path.join(env.image_dir, "layers"))  # busybox, unpacked there
    img, ctr = _fs_info(env)
    # The kubelet tells the two apart by mount point (KubeletSeparateDiskGC).
    assert img.fs_id.mountpoint == env.disk
    assert ctr.fs_id.mountpoint == mountpoint(env.d.root) != img.fs_id.mountpoint
    assert MiB // 2 < img.used_bytes.value <= _disk_used(env.disk), img
    assert img.inodes_used.value > 2
    image_disk_before = _disk_used(env.disk)
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "writer", [
            "sh", "-c", "dd if=/dev/urandom of=/data bs=1M count=24 && sync && sleep 3600"])
        wait_for(lambda: exec_sync(env, cid, ["sh", "-c", "[ $(stat -c %s /data) -ge 25165824 ]"]
                                   ).exit_code == 0, 60, "the container's 24 MiB")
        # Its writable layer counts on root's filesystem...
        layer = wait_for(lambda: (s := env.rt().ContainerStats(pb.ContainerStatsRequest(
            container_id=cid), timeout=30).stats.writable_layer).used_bytes.value >= 24 * MiB
            and s, 60, "the writable layer's usage")
        assert layer.fs_id.mountpoint == ctr.fs_id.mountpoint
        # (ImageFsInfo's walk is cached for a few seconds.)
        after = wait_for(lambda: (u := _fs_info(env))[1].used_bytes.value
                         >= ctr.used_bytes.value + 24 * MiB and u, 60,
                         "the container filesystem's usage to grow")
        # ...and not on the image disk, whose usage the kubelet sees unchanged.
        assert after[0].used_bytes.value < img.used_bytes.value + MiB
        assert _disk_used(env.disk) < image_disk_before + 4 * MiB
        upper = os.path.join(env.d.root, "containers", cid, "upper", "data")
        assert os.stat(upper).st_size == 24 * MiB


def test_user_namespace_pod_and_image_volume_read_the_image_disk(env: SplitEnv) -> None:
    _pulled(env)
    m = pb.IDMapping(container_id=0, host_id=HOST_ID, length=65536)
    userns = pb.UserNamespace(mode=pb.POD, uids=[m], gids=[m])
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="split-userns", namespace="e2e", uid="uid-split"),
        hostname="split-userns", log_directory=os.path.join(env.tmpdir, "logs", "userns"),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(userns_options=userns))))
    sid = env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=60).pod_sandbox_id
    try:
        vol = pb.Mount(container_path="/mnt/image", readonly=True,
                       image=pb.ImageSpec(image=env.busybox))
        cid = container(env, sid, cfg, "inside", ["sleep", "3600"], mounts=[vol],
                        linux=pb.LinuxContainerConfig(
                            security_context=pb.LinuxContainerSecurityContext(
                                namespace_options=cfg.linux.security_context
                                .namespace_options)))
        r = exec_sync(env, cid, ["sh", "-c", "stat -c '%u %n' /bin/busybox; echo hi > /w; "
                                 "stat -c '%u %n' /w; ls /mnt/image/bin/busybox"])
        assert r.exit_code == 0, r.stderr
        # Image files are root's inside through the idmapped layers on the image disk; the
        # write is the pod's root's on root's disk.
        assert r.stdout.decode().split() == ["0", "/bin/busybox", "0", "/w",
                                             "/mnt/image/bin/busybox"]
        upper = os.stat(os.path.join(env.d.root, "containers", cid, "upper", "w"))
        assert upper.st_uid == HOST_ID
    finally:
        remove_pod(env, sid)
    assert mounts_under(env.d.root, env.d.state) == []


def test_image_gc_frees_the_image_disk(env: SplitEnv) -> None:
    image_id = _pulled(env)
    layers = os.path.join(env.image_dir, "layers")
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "user", ["sleep", "3600"])
        # In use: removed from the list, its layers kept for the running container.
        env.d.images().RemoveImage(pb.RemoveImageRequest(
            image=pb.ImageSpec(image=image_id)), timeout=30)
        assert not env.d.images().ListImages(pb.ListImagesRequest(), timeout=10).images
        assert os.listdir(layers)
        assert exec_sync(env, cid, ["ls", "/bin/busybox"]).exit_code == 0
    # The last user gone: the layers leave the image disk.
    wait_for(lambda: os.listdir(layers) == [], 30, "the layers to be deleted")
    assert os.listdir(os.path.join(env.image_dir, "verified")) == []
    img = wait_for(lambda: (i := _fs_info(env)[0]).used_bytes.value < MiB // 2 and i, 30,
                   "ImageFsInfo to show the image gone")
    assert img.fs_id.mountpoint == env.disk
    _pulled(env)


def test_a_crash_and_a_restart_find_both_filesystems_again(env: SplitEnv) -> None:
    _pulled(env)
    pod_id, pod_cfg = run_pod(env)
    try:
        cid = container(env, pod_id, pod_cfg, "survivor", [
            "sh", "-c", "echo kept > /state && sleep 3600"])
        wait_for(lambda: exec_sync(env, cid, ["cat", "/state"]).stdout == b"kept\n", 30,
                 "the container's write")
        layers = sorted(os.listdir(os.path.join(env.image_dir, "layers")))
        env.d.kill9()
        env.d.start()
        assert status(env, cid).status.state == pb.CONTAINER_RUNNING
        r = exec_sync(env, cid, ["sh", "-c", "cat /state; /bin/busybox true && echo image"])
        assert r.stdout.decode().split() == ["kept", "image"], r.stderr
        assert env.d.images().ImageStatus(pb.ImageStatusRequest(
            image=pb.ImageSpec(image=env.busybox)), timeout=10).image.id
        env.d.stop()
        env.d.start()
        img, ctr = _fs_info(env)
        assert (img.fs_id.mountpoint, ctr.fs_id.mountpoint) == (env.disk,
                                                                mountpoint(env.d.root))
        assert exec_sync(env, cid, ["cat", "/state"]).stdout == b"kept\n"
        # Nothing of the image store was swept as unverified or unreferenced.
        assert sorted(os.listdir(os.path.join(env.image_dir, "layers"))) == layers
    finally:
        remove_pod(env, pod_id)
    assert mounts_under(env.d.root, env.d.state) == []


def _set_image_root(env: SplitEnv, line: str) -> None:
    with open(env.config_file) as fh:
        text = fh.read()
    head, _, rest = text.partition("\n")
    assert head.startswith("image_root =")
    with open(env.config_file, "w") as fh:
        fh.write(f"{line}\n{rest}")


def test_the_store_moves_between_layouts_with_its_images(env: SplitEnv) -> None:
    image_id = _pulled(env)
    env.d.stop()
    under_root = os.path.join(env.d.root, "images")
    # From the image disk to <root>/images (the default layout), as docs/storage.md says.
    subprocess.run(["cp", "-a", env.image_dir, under_root], check=True)
    subprocess.run(["rm", "-rf", env.image_dir], check=True)
    _set_image_root(env, 'image_root = ""')
    try:
        env.d.start()
        img, ctr = _fs_info(env)
        assert img.fs_id.mountpoint == ctr.fs_id.mountpoint == mountpoint(env.d.root)
        assert _pulled(env) == image_id  # already there: nothing downloaded
        with pod(env) as (pod_id, pod_cfg):
            cid = container(env, pod_id, pod_cfg, "moved", ["sleep", "3600"])
            assert exec_sync(env, cid, ["/bin/busybox", "true"]).exit_code == 0
        env.d.stop()
    finally:
        # And back onto the image disk.
        if env.d.proc is not None and env.d.proc.poll() is None:
            env.d.stop()
        subprocess.run(["cp", "-a", under_root, env.image_dir], check=True)
        subprocess.run(["rm", "-rf", under_root], check=True)
        _set_image_root(env, f'image_root = "{env.image_dir}"')
        env.d.start()
    assert env.d.images().ImageStatus(pb.ImageStatusRequest(
        image=pb.ImageSpec(image=image_id)), timeout=10).image.id == image_id
    assert _fs_info(env)[0].fs_id.mountpoint == env.disk


def test_a_writable_layer_cap_is_refused_naming_the_filesystem(env: SplitEnv) -> None:
    _pulled(env)
    key = "io.crishim.container-rootfs-size"
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="capped", namespace="e2e", uid="uid-capped"),
        hostname="capped", log_directory=os.path.join(env.tmpdir, "logs", "capped"),
        annotations={key: "64Mi", f"{key}/greedy": "2Gi"},
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption())))
    sid = env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=60).pod_sandbox_id
    try:
        bundles = set(os.listdir(os.path.join(env.d.root, "containers")))
        with pytest.raises(grpc.RpcError) as err:
            container(env, sid, cfg, "capped", ["sleep", "3600"])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = err.value.details() or ""
        # Not run without its cap: refused, saying why this node cannot enforce one.
        assert f"pod annotation {key} asks for a writable-layer cap of 67108864 bytes" \
            in details, details
        # Why, for the filesystem root's containers/ is on here ("... is on ext4 (mounted
        # at /); a writable-layer cap needs XFS mounted with prjquota").
        assert probe(os.path.join(env.d.root, "containers")).refusal() in details, details
        with pytest.raises(grpc.RpcError) as err:
            container(env, sid, cfg, "greedy", ["true"])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "above this node's maximum" in (err.value.details() or "")
        assert set(os.listdir(os.path.join(env.d.root, "containers"))) <= bundles
        assert not env.rt().ListContainers(pb.ListContainersRequest(
            filter=pb.ContainerFilter(pod_sandbox_id=sid)), timeout=10).containers
    finally:
        remove_pod(env, sid)
