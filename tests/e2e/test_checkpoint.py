"""CheckpointContainer where CRIU runs (the v2 guest: Debian's kernel and criu): a counter
container checkpointed while it counts keeps counting, and the archive holds what the
kubelet and checkpointctl read: CRIU's images, the spec, the container's identity, its
writable layer (with the count it had written) and the files it deleted. The archive is
made only at the requested location, never over a file or through a symlink, readable by
root alone. CreateContainer from the archive makes a container that StartContainer
restores: it counts on from the saved count, with the files it wrote and without the one
it deleted, and it stops and is removed like any other, leaving nothing. A two-container
pod checkpointed in one cut (CheckpointPod) and restored into a new pod (RestorePod)
counts on in both; its error paths leave nothing. Where CRIU cannot run (the CI host),
test_checkpoint_unavailable.py covers the RPCs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import module_network
from tests.e2e.lifecycle import (
    Env,
    container,
    daemon_env,
    exec_sync,
    log_lines,
    pod,
    remove_pod,
    status,
    wait_exited,
)
from tests.e2e.registry import Registry

COUNTER = ("rm /etc/group; i=0; while true; do i=$((i+1)); echo $i > /count; echo $i; "
           "sleep 0.2; done")

# As the kubelet asks (no shareProcessNamespace): the container's own pid namespace.
OWN_PIDS = pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
    namespace_options=pb.NamespaceOption(pid=pb.CONTAINER)))


def _criu_unusable() -> str:
    exe = shutil.which("criu")
    if exe is None:
        return "no criu on PATH"
    res = subprocess.run([exe, "check"], capture_output=True, text=True, timeout=120,
                         check=False)
    return "" if res.returncode == 0 else f"`criu check` fails: {res.stderr.strip()[-200:]}"


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    reason = _criu_unusable()
    if reason:
        pytest.skip(f"CRIU cannot run on this host ({reason}); the v2 guest runs these")
    with daemon_env(registry, busybox_ref, "crishim-ckpt",
                    *module_network("checkpoint-criu"),
                    '[runtimes.runc]\npath = "runc"\n[runtimes.crun]\npath = "crun"\n') as e:
        yield e


def _count(env: Env, cid: str) -> int:
    """The counter's last value (the loop truncates /count before each write: an empty
    read is read again)."""
    for _ in range(20):
        text = exec_sync(env, cid, ["cat", "/count"], timeout=30).stdout.decode().strip()
        if text:
            return int(text)
    return 0


def _wait_count(env: Env, cid: str, above: int, seconds: float = 60) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        n = _count(env, cid)
        if n > above:
            return n
        time.sleep(0.2)
    raise AssertionError(f"the counter in {cid} did not pass {above} within {seconds}s")


def _cannot_checkpoint(runtime: str) -> str:
    """Why the OCI runtime has no checkpoint command ("" when it has one): Debian 12's
    crun is built without CRIU."""
    res = subprocess.run([runtime, "checkpoint", "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    return "" if res.returncode == 0 else (res.stderr or res.stdout).strip()


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    assert f is not None, name
    return f.read()


@pytest.mark.parametrize("handler", ["runc", "crun"])
def test_checkpoint_of_a_counter(env: Env, handler: str) -> None:
    out = os.path.join(env.tmpdir, f"checkpoints-{handler}")
    os.makedirs(out)
    location = os.path.join(out, "counter.tar")
    rt = env.rt()
    with pod(env, handler=handler) as (sid, cfg):
        cid = container(env, sid, cfg, "counter", ["sh", "-c", COUNTER], linux=OWN_PIDS)
        before = _wait_count(env, cid, 2)
        if why := _cannot_checkpoint(handler):
            # The runtime's refusal, as FAILED_PRECONDITION naming it; the container runs
            # on and nothing is left at the location or in crishim's root.
            with pytest.raises(grpc.RpcError) as err:
                rt.CheckpointContainer(pb.CheckpointContainerRequest(
                    container_id=cid, location=location, timeout=240), timeout=300)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"{handler} checkpoint failed" in (err.value.details() or ""), why
            assert status(env, cid).status.state == pb.CONTAINER_RUNNING
            _wait_count(env, cid, _count(env, cid))
            assert os.listdir(out) == []
            assert os.listdir(os.path.join(env.d.root, "checkpoints")) == []
            return
        t0 = time.monotonic()
        rt.CheckpointContainer(pb.CheckpointContainerRequest(
            container_id=cid, location=location, timeout=240), timeout=300)
        took = time.monotonic() - t0
        print(f"{handler}: checkpoint took {took:.1f}s, archive {os.path.getsize(location)} "
              "bytes")
        # It runs on and counts on.
        assert status(env, cid).status.state == pb.CONTAINER_RUNNING
        after = _wait_count(env, cid, _count(env, cid))
        assert os.lstat(location).st_mode & 0o777 == 0o600
        with tarfile.open(location) as tar:
            names = tar.getnames()
            print("archive:", " ".join(sorted(n for n in names
                                              if not n.startswith("checkpoint/"))),
                  f"+ {sum(n.startswith('checkpoint/') for n in names)} CRIU images")
            for name in ("config.dump", "spec.dump", "rootfs-diff.tar", "dump.log",
                         "deleted.files", "checkpoint/inventory.img"):
                assert name in names, (name, names)
            config = json.loads(_member(tar, "config.dump"))
            spec = json.loads(_member(tar, "spec.dump"))
            deleted = json.loads(_member(tar, "deleted.files"))
            with tarfile.open(fileobj=tar.extractfile("rootfs-diff.tar")) as diff:
                saved = int(_member(diff, "count").decode().strip())
                assert not any(n.startswith(("proc/", "sys/", "dev/")) for n in diff.getnames())
        assert config["id"] == cid and config["name"].startswith("counter_")
        assert config["rootfsImageName"] == env.busybox and config["runtime"] == handler
        assert spec["process"]["args"] == ["sh", "-c", COUNTER]
        assert deleted == ["/etc/group"]
        # The count in the archive is the one the container had when it was dumped.
        assert before <= saved < after

        if handler != "runc":
            return  # what follows is crishim's, not the runtime's

        # Never over a file, never through a symlink; what was there is untouched.
        size = os.path.getsize(location)
        link = os.path.join(out, "link.tar")
        target = os.path.join(env.tmpdir, "elsewhere.tar")
        os.symlink(target, link)
        for path in (location, link):
            with pytest.raises(grpc.RpcError) as err:
                rt.CheckpointContainer(pb.CheckpointContainerRequest(
                    container_id=cid, location=path), timeout=60)
            assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS, err.value.details()
        assert os.path.getsize(location) == size and not os.path.lexists(target)
        # A missing directory: nothing made.
        with pytest.raises(grpc.RpcError) as err:
            rt.CheckpointContainer(pb.CheckpointContainerRequest(
                container_id=cid, location=os.path.join(out, "no", "c.tar")), timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert sorted(os.listdir(out)) == ["counter.tar", "link.tar"]

        _restore(env, sid, cfg, location, saved)
        listed = rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers
        assert [c.id for c in listed] == [cid]
    # The parts were gathered in crishim's root and are gone.
    assert os.listdir(os.path.join(env.d.root, "checkpoints")) == []


def _runc_containers(env: Env) -> set[str]:
    res = subprocess.run(["runc", "--root", os.path.join(env.d.state, "runc"), "list", "-q"],
                         capture_output=True, text=True, timeout=60, check=False)
    return set(res.stdout.split())


def _restore(env: Env, sid: str, cfg: pb.PodSandboxConfig, location: str,
             saved: int) -> None:
    """A container restored from `location` counts on from `saved`; its stop and removal
    leave no runc container, conmon, bundle or CRIU images behind."""
    rt = env.rt()
    rcid = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=sid, sandbox_config=cfg, config=pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="restored"), log_path="restored.log",
            image=pb.ImageSpec(image=location), linux=OWN_PIDS)),
        timeout=120).container_id
    assert status(env, rcid).status.state == pb.CONTAINER_CREATED
    t0 = time.monotonic()
    rt.StartContainer(pb.StartContainerRequest(container_id=rcid), timeout=240)
    print(f"restore took {time.monotonic() - t0:.1f}s")
    assert status(env, rcid).status.state == pb.CONTAINER_RUNNING
    # Its memory: the loop goes on from the count it had, not from 1.
    first = _count(env, rcid)
    assert first >= saved
    _wait_count(env, rcid, first)
    # Its files: /etc/group it had deleted stays deleted.
    res = exec_sync(env, rcid, ["ls", "/etc/group"], timeout=30)
    assert res.exit_code != 0
    # The log is the new container's, and the loop writes on into it.
    logdir = cfg.log_directory
    deadline = time.monotonic() + 60
    while not any(int(text) > saved for _, text in log_lines(
            os.path.join(logdir, "restored.log")) if text.isdigit()):
        assert time.monotonic() < deadline, "the restored loop wrote nothing to its log"
        time.sleep(0.2)
    # It stops as any container does: its exit is seen.
    t0 = time.monotonic()
    rt.StopContainer(pb.StopContainerRequest(container_id=rcid, timeout=2), timeout=120)
    print(f"stop of the restored container took {time.monotonic() - t0:.1f}s")
    st = status(env, rcid).status
    assert st.state == pb.CONTAINER_EXITED and st.exit_code == 137, st
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=rcid), timeout=60)
    assert rcid not in _runc_containers(env)
    leftovers = [os.path.join(d, n) for top in (env.d.root, env.d.state)
                 for d, dirs, files in os.walk(top) if not d.startswith(
                     os.path.join(env.d.root, "images"))
                 for n in dirs + files if rcid in n]
    assert leftovers == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True,
                        check=True).stdout
    assert rcid not in ps  # no conmon of it


def test_a_stopped_container_is_not_checkpointed(env: Env) -> None:
    location = os.path.join(env.tmpdir, "exited.tar")
    rt = env.rt()
    with pod(env) as (sid, cfg):
        cid = container(env, sid, cfg, "done", ["true"])
        wait_exited(env, cid, 60)
        with pytest.raises(grpc.RpcError) as err:
            rt.CheckpointContainer(pb.CheckpointContainerRequest(
                container_id=cid, location=location), timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not running" in (err.value.details() or "")
        assert not os.path.lexists(location)


def _pods(env: Env) -> list[str]:
    return [p.id for p in env.rt().ListPodSandbox(pb.ListPodSandboxRequest(),
                                                  timeout=10).items]


def test_a_pod_checkpointed_and_restored(env: Env) -> None:
    """Two counters checkpointed in one cut, restored into a new pod (CREATED, started by
    the caller), counting on from their saved counts; error paths leave nothing."""
    rt = env.rt()
    out = os.path.join(env.tmpdir, "pod-checkpoint")
    with pod(env) as (sid, cfg):
        cids = {name: container(env, sid, cfg, name, ["sh", "-c", COUNTER], linux=OWN_PIDS)
                for name in ("one", "two")}
        for cid in cids.values():
            _wait_count(env, cid, 2)
        # A container that is not running is refused before anything is paused or made.
        done = container(env, sid, cfg, "done", ["true"])
        wait_exited(env, done, 60)
        with pytest.raises(grpc.RpcError) as err:
            rt.CheckpointPod(pb.CheckpointPodRequest(
                pod_sandbox_id=sid, output_path=out,
                container_ids=[*cids.values(), done]), timeout=300)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
        assert not os.path.lexists(out)
        rt.RemoveContainer(pb.RemoveContainerRequest(container_id=done), timeout=60)

        t0 = time.monotonic()
        rt.CheckpointPod(pb.CheckpointPodRequest(pod_sandbox_id=sid, output_path=out),
                         timeout=600)
        print(f"pod checkpoint took {time.monotonic() - t0:.1f}s: {sorted(os.listdir(out))}")
        saved = {}
        for name, cid in cids.items():
            assert status(env, cid).status.state == pb.CONTAINER_RUNNING
            _wait_count(env, cid, _count(env, cid))  # resumed: counting on
            with tarfile.open(os.path.join(out, f"{cid}.tar")) as tar, tarfile.open(
                    fileobj=tar.extractfile("rootfs-diff.tar")) as diff:
                saved[name] = int(_member(diff, "count").decode().strip())
        # Never into an existing path.
        with pytest.raises(grpc.RpcError) as err:
            rt.CheckpointPod(pb.CheckpointPodRequest(pod_sandbox_id=sid, output_path=out),
                             timeout=60)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert os.listdir(os.path.join(env.d.root, "checkpoints")) == []

    meta = pb.PodSandboxMetadata(name="restored", namespace="e2e", uid="uid-restored")
    rcfg = pb.PodSandboxConfig(metadata=meta, hostname="restored",
                               log_directory=os.path.join(env.tmpdir, "logs", "restored"),
                               linux=cfg.linux)
    configs = [pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                                  image=pb.ImageSpec(image=env.busybox),
                                  log_path=f"{name}.log", linux=OWN_PIDS)
               for name in ("one", "two")]
    # A request whose containers are not the checkpoint's: refused, nothing made.
    before = _pods(env)
    with pytest.raises(grpc.RpcError) as err:
        rt.RestorePod(pb.RestorePodRequest(checkpoint_path=out, config=rcfg,
                                           container_configs=configs[:1]), timeout=120)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not in the request: two" in (err.value.details() or "")
    assert _pods(env) == before

    t0 = time.monotonic()
    resp = rt.RestorePod(pb.RestorePodRequest(checkpoint_path=out, config=rcfg,
                                              container_configs=configs), timeout=300)
    rsid = resp.pod_sandbox_id
    try:
        restored = {c.name: c.container_id for c in resp.restored_containers}
        assert sorted(restored) == ["one", "two"]
        for rcid in restored.values():
            assert status(env, rcid).status.state == pb.CONTAINER_CREATED
            rt.StartContainer(pb.StartContainerRequest(container_id=rcid), timeout=240)
        print(f"pod restore and starts took {time.monotonic() - t0:.1f}s")
        for name, rcid in restored.items():
            first = _count(env, rcid)
            assert first >= saved[name]
            _wait_count(env, rcid, first)
    finally:
        remove_pod(env, rsid)
    assert _pods(env) == before
