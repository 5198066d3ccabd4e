"""Pods in their own user namespace (the kubelet's `hostUsers: false`, CRI userns_options
mode POD) on real runc: the mapping, root inside, image files owned by root through the
idmapped layers, writes to the rootfs and to volumes (plain and idmapped) owned as the
mapping says, the pod's netns owned by its user namespace, bad mappings refused, and
nothing left after removal or after a crash."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import module_network
from tests.e2e.faults import mounts_under, wait_for
from tests.e2e.lifecycle import (
    Env,
    container,
    daemon_env,
    exec_sync,
    log_lines,
    remove_pod,
    status,
    wait_exited,
)
from tests.e2e.registry import Registry

_TAG = os.getpid() % 40
# A host range no other test uses; the kubelet hands out multiples of 65536 the same way.
HOST_ID = 65536 * (40 + _TAG)
SIZE = 65536


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-userns",
                    *module_network("userns")) as e:
        yield e


def _mapping(host: int = HOST_ID, size: int = SIZE, inside: int = 0) -> pb.IDMapping:
    return pb.IDMapping(container_id=inside, host_id=host, length=size)


def _userns(uids: list[pb.IDMapping] | None = None, gids: list[pb.IDMapping] | None = None,
            mode: int = pb.POD) -> pb.UserNamespace:
    return pb.UserNamespace(mode=mode,  # type: ignore[arg-type]
                            uids=[_mapping()] if uids is None else uids,
                            gids=[_mapping()] if gids is None else gids)


_pods = 0


def _pod_config(env: Env, userns: pb.UserNamespace, **ns: int) -> pb.PodSandboxConfig:
    global _pods
    _pods += 1
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"userns{_pods}", namespace="e2e",
                                       uid=f"uid-userns-{_pods}"),
        hostname=f"userns{_pods}", log_directory=os.path.join(env.tmpdir, "logs",
                                                              f"userns{_pods}"),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(userns_options=userns, **ns))))


def _run(env: Env, cfg: pb.PodSandboxConfig) -> str:
    return str(env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                      timeout=60).pod_sandbox_id)


def _refused(env: Env, cfg: pb.PodSandboxConfig, *words: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _run(env, cfg)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    for w in words:
        assert w in (err.value.details() or ""), err.value.details()


def _leftovers(env: Env) -> list[tuple[str, str]]:
    return mounts_under(env.d.root, env.d.state)


def _pins(env: Env) -> list[str]:
    base = os.path.join(env.d.state, "userns")
    return os.listdir(base) if os.path.isdir(base) else []


def test_handlers_announce_user_namespaces(env: Env) -> None:
    resp = env.rt().Status(pb.StatusRequest(), timeout=30)
    features = {h.name: h.features.user_namespaces for h in resp.runtime_handlers}
    # runc 1.1 joins a user namespace; crishim idmaps the layers (ext4 here).
    assert features[""] and features["runc"], features


def test_pod_runs_in_its_user_namespace(env: Env) -> None:
    plain = os.path.join(env.tmpdir, "plain-vol")
    os.makedirs(plain)
    os.chmod(plain, 0o777)  # like an emptyDir: writable by the pod's (host) uid
    mapped = os.path.join(env.tmpdir, "mapped-vol")
    os.makedirs(mapped)  # root's, 0755: writable only through the idmapped mount
    cfg = _pod_config(env, _userns())
    sid = _run(env, cfg)
    try:
        # The pod's netns is owned by the pod's user namespace (sysfs can be mounted).
        info = status_pod(env, sid)
        assert info.linux.namespaces.options.userns_options.mode == pb.POD
        script = ("cat /proc/self/uid_map /proc/self/gid_map; id -u; id -g; "
                  "stat -c 'owner %u:%g %n' / /bin/busybox /etc; "
                  "echo rootfs > /written && stat -c 'owner %u:%g %n' /written; "
                  "echo plain > /plain/f && stat -c 'owner %u:%g %n' /plain/f; "
                  "echo mapped > /mapped/f && stat -c 'owner %u:%g %n' /mapped/f; "
                  "echo '10.9.9.9 extra' >> /etc/hosts && echo hosts-ok; "
                  "ls /sys/class/net; echo done")
        mounts = [pb.Mount(container_path="/plain", host_path=plain),
                  pb.Mount(container_path="/mapped", host_path=mapped,
                           uidMappings=[_mapping()], gidMappings=[_mapping()])]
        cid = container(env, sid, cfg, "inside", ["sh", "-c", script], mounts=mounts,
                        linux=pb.LinuxContainerConfig(
                            security_context=pb.LinuxContainerSecurityContext(
                                namespace_options=cfg.linux.security_context
                                .namespace_options)))
        st = wait_exited(env, cid)
        out = [t for _, t in log_lines(os.path.join(cfg.log_directory, "inside.log"))]
        assert st.exit_code == 0, (out, env.d.logs()[-3000:])
        maps = [line.split() for line in out[:2]]
        assert maps == [["0", str(HOST_ID), str(SIZE)]] * 2, out
        assert out[2:4] == ["0", "0"], out
        # Image files (root's in the layers) are root's inside: the idmapped layers.
        assert "owner 0:0 /" in out and "owner 0:0 /bin/busybox" in out, out
        assert "owner 0:0 /etc" in out, out
        assert "owner 0:0 /written" in out and "owner 0:0 /plain/f" in out, out
        assert "owner 0:0 /mapped/f" in out and "hosts-ok" in out, out
        assert "lo" in out and "eth0" in out, out  # the pod's own sysfs
        # On the host: the rootfs write and the plain volume belong to the pod's root
        # (the host uid it maps to); the idmapped volume stores ids as seen inside.
        bundle = os.path.join(env.d.root, "containers", cid)
        upper = os.stat(os.path.join(bundle, "upper", "written"))
        assert (upper.st_uid, upper.st_gid) == (HOST_ID, HOST_ID)
        plain_f = os.stat(os.path.join(plain, "f"))
        assert (plain_f.st_uid, plain_f.st_gid) == (HOST_ID, HOST_ID)
        mapped_f = os.stat(os.path.join(mapped, "f"))
        assert (mapped_f.st_uid, mapped_f.st_gid) == (0, 0)
        # The layers themselves are untouched.
        assert not any("written" in m for m, _ in _leftovers(env))
        # A second, long-running container shares the pod's user namespace; exec joins it.
        cid2 = container(env, sid, cfg, "sleeper", ["sleep", "600"])
        res = exec_sync(env, cid2, ["sh", "-c", "id -u; cat /proc/self/uid_map"])
        assert res.exit_code == 0, res.stderr
        assert res.stdout.decode().split() == ["0", "0", str(HOST_ID), str(SIZE)]
        pause_ns = os.stat(f"/proc/{_pause_pid(env, sid)}/ns/user").st_ino
        assert os.stat(f"/proc/{_pid(env, cid2)}/ns/user").st_ino == pause_ns
        assert pause_ns != os.stat("/proc/self/ns/user").st_ino
    finally:
        remove_pod(env, sid)
    assert _pins(env) == []
    assert _leftovers(env) == [], _leftovers(env)


def test_host_network_pod_in_its_user_namespace(env: Env) -> None:
    """KEP-5607 (hostNetwork with hostUsers: false): announced, and such a pod runs in its
    own user namespace with the node's network interfaces (the host's /sys, bound)."""
    assert env.rt().Status(pb.StatusRequest(), timeout=30).features \
        .user_namespaces_host_network
    ns = {"network": pb.NODE}
    cfg = _pod_config(env, _userns(), **ns)
    sid = _run(env, cfg)
    try:
        assert status_pod(env, sid).linux.namespaces.options.network == pb.NODE
        cid = container(env, sid, cfg, "hostnet", ["sleep", "600"],
                        linux=pb.LinuxContainerConfig(
                            security_context=pb.LinuxContainerSecurityContext(
                                namespace_options=cfg.linux.security_context
                                .namespace_options)))
        res = exec_sync(env, cid, ["sh", "-c", "id -u; cat /proc/self/uid_map; echo --; "
                                   "ls /sys/class/net; echo --; cat /proc/net/dev"])
        assert res.exit_code == 0, (res.stderr, env.d.logs()[-3000:])
        out = res.stdout.decode().split("--\n")
        assert out[0].split() == ["0", "0", str(HOST_ID), str(SIZE)]  # not the identity
        # The node's interfaces, through /sys and through /proc/net (the host's netns).
        assert sorted(out[1].split()) == sorted(os.listdir("/sys/class/net")), out[1]
        host_dev = {line.split(":")[0].strip() for line in open("/proc/net/dev")
                    if ":" in line}
        assert {line.split(":")[0].strip() for line in out[2].splitlines()
                if ":" in line} == host_dev
        pid = _pid(env, cid)
        # The test's own (the node's) network namespace, in a user namespace of its own.
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
        assert os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino
        # /sys is the host's, read-only; writing it is refused.
        ro = exec_sync(env, cid, ["sh", "-c", "echo 1 > /sys/kernel/uevent_helper"])
        assert ro.exit_code != 0
    finally:
        remove_pod(env, sid)
    assert _pins(env) == []
    assert _leftovers(env) == [], _leftovers(env)


def status_pod(env: Env, sid: str) -> pb.PodSandboxStatus:
    return env.rt().PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid),
                                     timeout=10).status


def _pause_pid(env: Env, sid: str) -> int:
    resp = env.rt().PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid,
                                                                verbose=True), timeout=10)
    return int(json.loads(resp.info["info"])["pid"])


def _pid(env: Env, cid: str) -> int:
    return int(json.loads(status(env, cid, True).info["info"])["pid"])


def test_bad_user_namespaces_are_refused(env: Env) -> None:
    _refused(env, _pod_config(env, _userns(uids=[])), "at least one uid mapping")
    _refused(env, _pod_config(env, _userns(uids=[_mapping(inside=1)])),
             "do not map container id 0")
    _refused(env, _pod_config(env, _userns(uids=[_mapping(), _mapping(host=HOST_ID * 2)])),
             "overlap")
    _refused(env, _pod_config(env, _userns(gids=[_mapping(size=0)])), "length 0")
    _refused(env, _pod_config(env, _userns(uids=[_mapping(host=2**32 - 10)])),
             "past the largest id")
    _refused(env, _pod_config(env, _userns(mode=pb.CONTAINER)), "CONTAINER")
    _refused(env, _pod_config(env, _userns(mode=pb.TARGET)), "TARGET")
    _refused(env, _pod_config(env, _userns(mode=pb.NODE)), "NODE takes no")
    _refused(env, _pod_config(env, _userns(), pid=pb.NODE), "host's pid")
    _refused(env, _pod_config(env, _userns(), network=pb.NODE, ipc=pb.NODE), "host's ipc")
    assert _pins(env) == [] and _leftovers(env) == []
    # A container must be in its pod's user namespace.
    cfg = _pod_config(env, _userns())
    sid = _run(env, cfg)
    try:
        other = pb.NamespaceOption(userns_options=_userns(uids=[_mapping(host=HOST_ID + SIZE)]))
        with pytest.raises(grpc.RpcError) as err:
            container(env, sid, cfg, "other", ["true"], start=False,
                      linux=pb.LinuxContainerConfig(
                          security_context=pb.LinuxContainerSecurityContext(
                              namespace_options=other)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "its pod's" in (err.value.details() or "")
    finally:
        remove_pod(env, sid)
    assert _pins(env) == [] and _leftovers(env) == []


def test_crash_leaves_nothing_behind(env: Env) -> None:
    """SIGKILL under a running userns pod: after the restart the pod still runs; after
    its removal, and after a pin nobody owns is swept at start, nothing is left."""
    cfg = _pod_config(env, _userns())
    sid = _run(env, cfg)
    try:
        cid = container(env, sid, cfg, "sleeper", ["sleep", "600"])
        assert env.d.proc is not None
        env.d.proc.send_signal(signal.SIGKILL)
        env.d.proc.wait()
        # A pin of a pod the database never recorded (a lost record).
        stray = os.path.join(env.d.state, "userns", "f" * 64)
        with open(stray, "w"):
            pass
        os.system(f"mount --bind /proc/{_pause_pid_from_pin(env, sid)}/ns/user {stray}")
        env.d.start()
        wait_for(lambda: status_pod(env, sid).state == pb.SANDBOX_READY, 10, "pod ready")
        res = exec_sync(env, cid, ["cat", "/proc/self/uid_map"])
        assert res.stdout.decode().split() == ["0", str(HOST_ID), str(SIZE)]
        assert _pins(env) == [sid]
    finally:
        remove_pod(env, sid)
    assert _pins(env) == []
    assert _leftovers(env) == [], _leftovers(env)


def _pause_pid_from_pin(env: Env, sid: str) -> int:
    # The pod's pause runs in the pinned user namespace; find it among /proc.
    want = os.stat(os.path.join(env.d.state, "userns", sid)).st_ino
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}/ns/user").st_ino == want:
                    return int(pid)
            except OSError:
                continue
    raise AssertionError("no process in the pod's user namespace")
