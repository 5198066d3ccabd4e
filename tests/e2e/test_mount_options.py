"""Bind-mount flags from the kubelet (CRI Mount.mount_options, KEP-5855's
volumeMounts[].bindMountOptions) on real runc: `noexec` stops a program on the mount from
running, `nodev` a device node on it from being opened, the same files run and open
through a mount without them, Status announces the feature, and any other option is
refused before anything is made."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import module_network
from tests.e2e.lifecycle import Env, container, daemon_env, exec_sync, pod
from tests.e2e.registry import Registry


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-mountopts",
                    *module_network("mountopts")) as e:
        yield e


@pytest.fixture
def volume(env: Env) -> str:
    """A host dir holding an executable script and a device node (/dev/null's numbers,
    which the container's device rules allow)."""
    vol = os.path.join(env.tmpdir, f"vol-{os.urandom(4).hex()}")
    os.makedirs(vol)
    script = os.path.join(vol, "run.sh")
    with open(script, "w") as fh:
        fh.write("#!/bin/sh\necho ran\n")
    os.chmod(script, 0o755)
    os.mknod(os.path.join(vol, "null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(os.path.join(vol, "null"), 0o666)
    return vol


def _mountinfo_options(env: Env, cid: str, path: str) -> set[str]:
    out = exec_sync(env, cid, ["cat", "/proc/self/mountinfo"]).stdout.decode()
    for line in out.splitlines():
        fields = line.split()
        if fields[4] == path:
            return set(fields[5].split(","))
    raise AssertionError(f"{path} is not a mount point in the container:\n{out}")


def test_status_announces_mount_options(env: Env) -> None:
    assert env.rt().Status(pb.StatusRequest(), timeout=30).features.mount_options


def test_noexec_and_nodev_hold_on_the_mount_only(env: Env, volume: str) -> None:
    with pod(env) as (sid, cfg):
        cid = container(env, sid, cfg, "flags", ["sleep", "3600"], mounts=[
            pb.Mount(container_path="/flagged", host_path=volume,
                     mount_options=["noexec", "nodev", "nosuid"]),
            pb.Mount(container_path="/plain", host_path=volume)])
        # The same files through a mount without the flags: the script runs, the device
        # opens (so what fails below fails because of the flags).
        plain = exec_sync(env, cid, ["/plain/run.sh"])
        assert (plain.exit_code, plain.stdout) == (0, b"ran\n"), plain.stderr
        opened = exec_sync(env, cid, ["sh", "-c", "echo x > /plain/null && echo opened"])
        assert (opened.exit_code, opened.stdout) == (0, b"opened\n"), opened.stderr
        ran = exec_sync(env, cid, ["/flagged/run.sh"])
        assert ran.exit_code != 0 and b"ran" not in ran.stdout
        assert b"ermission denied" in ran.stderr, ran.stderr
        dev = exec_sync(env, cid, ["sh", "-c", "echo x > /flagged/null && echo opened"])
        assert dev.exit_code != 0 and b"opened" not in dev.stdout
        assert b"ermission denied" in dev.stderr, dev.stderr
        assert {"noexec", "nodev", "nosuid"} <= _mountinfo_options(env, cid, "/flagged")
        assert not {"noexec", "nodev"} & _mountinfo_options(env, cid, "/plain")


@pytest.mark.parametrize("option", ["exec", "rw", "suid", "uid=0", "NOEXEC", ""])
def test_other_options_are_refused(env: Env, volume: str, option: str) -> None:
    with pod(env) as (sid, cfg):
        with pytest.raises(grpc.RpcError) as err:
            container(env, sid, cfg, "refused", ["true"], mounts=[
                pb.Mount(container_path="/v", host_path=volume,
                         mount_options=["noexec", option])])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = err.value.details() or ""
        assert f"mounts[0].mount_options [{option!r}]" in details, details
        assert "nodev, noexec, nosuid" in details, details
        listed = env.rt().ListContainers(pb.ListContainersRequest(
            filter=pb.ContainerFilter(pod_sandbox_id=sid)), timeout=10).containers
        assert not listed
