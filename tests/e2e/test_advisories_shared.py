"""Shared state no pod can change (issue 50's finding, the class of containerd's and CRI-O's
"one tenant writes what another runs"), through the real socket on real runc.

Every pod without a pause image runs the embedded pause from one shared rootfs,
{root}/pause/rootfs; a user-namespaced pod gets an idmapped view of it, in which its root
owns the files. The attack: a container of such a pod, as its uid 0 with CAP_SYS_ADMIN
(its user namespace's) and the pod's PID namespace, enters the pause's mount namespace
through /proc/1/ns/mnt, remounts "/" read-write, writes a file and replaces /catatonit.
Each step must be refused, the shared rootfs stay byte-identical, and later pods run the
real catatonit. A tampered rootfs (planted symlink, changed binary) is rebuilt at the next
daemon start without touching what a link points to. Read-only volumes (host
directories other pods and the host may share: idmapped, plain hostPath) cannot be
remounted writable either.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from collections.abc import Iterator

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
    wait_exited,
)
from tests.e2e.registry import Registry

_TAG = os.getpid() % 40
HOST_ID = 65536 * (100 + _TAG)  # a host range no other test module uses
SIZE = 65536
CATATONIT = "/usr/bin/catatonit"  # the daemon's default catatonit_path


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-shared", *module_network("shared")) as e:
        yield e


def _sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def tree(path: str) -> dict[str, str]:
    """Every entry under `path`, nothing followed: type, mode, owner, content digest."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [".", *dirnames, *filenames]:
            full = dirpath if name == "." else os.path.join(dirpath, name)
            st = os.lstat(full)
            what = f"{stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid}"
            if stat.S_ISREG(st.st_mode):
                what += " " + _sha256(full)
            elif stat.S_ISLNK(st.st_mode):
                what += " -> " + os.readlink(full)
            out[os.path.relpath(full, path)] = what
    return out


def _pause_rootfs(env: Env) -> str:
    return os.path.join(env.d.root, "pause", "rootfs")


_pods = 0


def _pod_config(env: Env, namespace: str = "e2e", *, userns: bool = False,
                host_network: bool = False) -> pb.PodSandboxConfig:
    global _pods
    _pods += 1
    ns = pb.NamespaceOption(pid=pb.POD, network=pb.NODE if host_network else pb.POD)
    if userns:
        m = pb.IDMapping(container_id=0, host_id=HOST_ID, length=SIZE)
        ns.userns_options.CopyFrom(pb.UserNamespace(mode=pb.POD, uids=[m], gids=[m]))
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"shared{_pods}", namespace=namespace,
                                       uid=f"uid-shared-{_pods}"),
        hostname=f"shared{_pods}",
        log_directory=os.path.join(env.tmpdir, "logs", f"shared{_pods}"),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=ns)))


def _run(env: Env, cfg: pb.PodSandboxConfig) -> str:
    return str(env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                      timeout=60).pod_sandbox_id)


def _pause_pid(env: Env, sid: str) -> int:
    resp = env.rt().PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid,
                                                                verbose=True), timeout=10)
    return int(json.loads(resp.info["info"])["pid"])


def _assert_real_pause(env: Env, sid: str) -> None:
    """The pod's pause runs the host's catatonit, byte for byte (once runc's init, which
    `runc start` lets go, has exec'd it)."""
    exe = f"/proc/{_pause_pid(env, sid)}/exe"
    want = _sha256(CATATONIT)
    wait_for(lambda: _sha256(exe) == want, 10, "the pause to run the host's catatonit",
             every=0.05)


def _runs_real_pause(env: Env, cfg: pb.PodSandboxConfig) -> None:
    """A new pod from `cfg` runs the host's catatonit as its pause."""
    sid = _run(env, cfg)
    try:
        _assert_real_pause(env, sid)
    finally:
        remove_pod(env, sid)


def _sys_admin(cfg: pb.PodSandboxConfig, **kw: object) -> pb.LinuxContainerConfig:
    """Root in the pod's namespaces (its user namespace, its PID namespace) with
    CAP_SYS_ADMIN added."""
    return pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        namespace_options=cfg.linux.security_context.namespace_options,
        run_as_user=pb.Int64Value(value=0),
        capabilities=pb.Capability(add_capabilities=["CAP_SYS_ADMIN"]), **kw))


def _output(env: Env, sid: str, cfg: pb.PodSandboxConfig, name: str, script: str,
            **kw: object) -> list[str]:
    cid = container(env, sid, cfg, name, ["sh", "-c", script], **kw)
    st = wait_exited(env, cid, 60)
    out = [t for _, t in log_lines(os.path.join(cfg.log_directory, f"{name}.log"))]
    assert st.exit_code == 0, (out, env.d.logs()[-3000:])
    return out


# In the pause's mount namespace there is no shell: a busybox is put in its /dev (the
# pause's own tmpfs) through /proc/1/root and run from there.
_ATTACK = """
cp /bin/busybox /proc/1/root/dev/busybox && echo staged
nsenter -m/proc/1/ns/mnt /dev/busybox sh -c '
  test -x /catatonit && echo entered
  mount -o remount,bind,rw / 2>&1; echo remount=$?
  echo owned > /planted 2>&1; echo write=$?
  cat /dev/busybox > /.new-pause 2>&1; echo stage=$?
  mv -f /dev/busybox /catatonit 2>&1; echo replace=$?
  touch /catatonit 2>&1; echo touch=$?
'
echo done
"""


def test_shared_pause_rootfs_cannot_be_made_writable_by_a_userns_pod(env: Env) -> None:
    cfg = _pod_config(env, userns=True)
    sid = _run(env, cfg)
    try:
        before = tree(_pause_rootfs(env))
        assert before["catatonit"].endswith(_sha256(CATATONIT)), before
        out = _output(env, sid, cfg, "attacker", _ATTACK, linux=_sys_admin(cfg))
        # The attack really ran in the pause's mount namespace, as the pod's root with
        # CAP_SYS_ADMIN, and every step was refused.
        assert "staged" in out and "entered" in out and "done" in out, out
        for step in ("remount", "write", "stage", "replace", "touch"):
            assert f"{step}=0" not in out, out
        assert tree(_pause_rootfs(env)) == before
        # The pod's own pause still runs the real catatonit.
        _assert_real_pause(env, sid)
    finally:
        remove_pod(env, sid)
    assert tree(_pause_rootfs(env)) == before
    # Later pods, of another namespace and on the host's network, run the real pause.
    _runs_real_pause(env, _pod_config(env, "other"))
    _runs_real_pause(env, _pod_config(env, "other", host_network=True))
    _runs_real_pause(env, _pod_config(env, "other", userns=True))
    assert tree(_pause_rootfs(env)) == before


def test_tampered_pause_rootfs_is_rebuilt_at_start_without_following_its_links(
        env: Env) -> None:
    _runs_real_pause(env, _pod_config(env))  # the rootfs exists
    rootfs = _pause_rootfs(env)
    good = tree(rootfs)
    precious = os.path.join(env.tmpdir, "precious")
    with open(precious, "w") as fh:
        fh.write("host file\n")
    env.d.stop()
    # A planted link where the rootfs has a file, and a catatonit of the same size and a
    # newer mtime but other bytes: neither size nor mtime gives it away.
    os.unlink(os.path.join(rootfs, "etc", "hosts"))
    os.symlink(precious, os.path.join(rootfs, "etc", "hosts"))
    os.symlink(precious, os.path.join(rootfs, "etc", "extra"))
    cat = os.path.join(rootfs, "catatonit")
    data = bytearray(open(cat, "rb").read())
    data[-1] ^= 0xFF
    os.unlink(cat)
    with open(cat, "wb") as fh:
        fh.write(data)
    os.chmod(cat, 0o755)
    assert tree(rootfs) != good
    env.d.start()
    _runs_real_pause(env, _pod_config(env))
    _runs_real_pause(env, _pod_config(env, userns=True))
    assert tree(rootfs) == good
    with open(precious) as fh:
        assert fh.read() == "host file\n"
    # Nothing of the rebuild is left next to the rootfs.
    assert sorted(n for n in os.listdir(os.path.dirname(rootfs))
                  if not n.startswith(".lock")) == ["rootfs"]


def test_readonly_idmapped_volume_cannot_be_made_writable_by_a_userns_pod(env: Env) -> None:
    shared = os.path.join(env.tmpdir, "shared-vol")
    os.makedirs(shared)  # root's, 0755: through the idmapped mount the pod's root owns it
    with open(os.path.join(shared, "data"), "w") as fh:
        fh.write("shared\n")
    before = tree(shared)
    cfg = _pod_config(env, userns=True)
    sid = _run(env, cfg)
    try:
        m = pb.IDMapping(container_id=0, host_id=HOST_ID, length=SIZE)
        mounts = [pb.Mount(container_path="/vol", host_path=shared, readonly=True,
                           uidMappings=[m], gidMappings=[m])]
        script = ("stat -c 'owner %u %n' /vol/data; "
                  "mount -o remount,bind,rw /vol 2>&1; echo remount=$?; "
                  "echo owned > /vol/data 2>&1; echo write=$?; "
                  "echo new > /vol/new 2>&1; echo create=$?; echo done")
        out = _output(env, sid, cfg, "volume", script, mounts=mounts, linux=_sys_admin(cfg))
        assert "owner 0 /vol/data" in out and "done" in out, out
        for step in ("remount", "write", "create"):
            assert f"{step}=0" not in out, out
    finally:
        remove_pod(env, sid)
    assert tree(shared) == before



def test_readonly_host_path_cannot_be_made_writable_by_a_userns_pod(env: Env) -> None:
    # A shared tmpfs, so that HostToContainer propagation has something to carry.
    shared = os.path.join(env.tmpdir, "host-path")
    plain = os.path.join(env.tmpdir, "host-path-plain")
    for d in (shared, plain):
        os.makedirs(d)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0777", "tmpfs", shared], check=True)
    late = os.path.join(shared, "late")
    try:
        subprocess.run(["mount", "--make-shared", shared], check=True)
        os.makedirs(late)
        for d in (shared, plain):
            with open(os.path.join(d, "ww"), "w") as fh:
                fh.write("shared\n")
            os.chmod(os.path.join(d, "ww"), 0o666)  # anyone may write it, through a rw mount
        before = {d: tree(d) for d in (shared, plain)}
        cfg = _pod_config(env, userns=True)
        sid = _run(env, cfg)
        try:
            mounts = [pb.Mount(container_path="/hp", host_path=shared, readonly=True,
                               propagation=pb.PROPAGATION_HOST_TO_CONTAINER),
                      pb.Mount(container_path="/plain", host_path=plain, readonly=True)]
            cid = container(env, sid, cfg, "hostpath", ["sleep", "600"], mounts=mounts,
                            linux=_sys_admin(cfg))
            for path in ("/hp", "/plain"):
                res = exec_sync(env, cid, ["sh", "-c", (
                    f"echo a > {path}/ww 2>&1; echo before=$?; "
                    f"mount -o remount,bind,rw {path} 2>&1; echo remount=$?; "
                    f"echo owned > {path}/ww 2>&1; echo write=$?; "
                    f"echo new > {path}/new 2>&1; echo create=$?; echo done")])
                out = res.stdout.decode().split("\n")
                assert "done" in out, (res.stdout, res.stderr)
                for step in ("before", "remount", "write", "create"):
                    assert f"{step}=0" not in out, (path, out)
            # What the host mounts below a HostToContainer volume still shows inside.
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", late], check=True)
            with open(os.path.join(late, "marker"), "w") as fh:
                fh.write("from the host\n")
            wait_for(lambda: exec_sync(env, cid, ["cat", "/hp/late/marker"]).stdout
                     == b"from the host\n", 10, "the host's mount to propagate")
            # A stopped container holds no mount, its read-only copies neither.
            env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1),
                                   timeout=30)
            bundle = os.path.join(env.d.root, "containers", cid)
            assert mounts_under(bundle) == []
        finally:
            remove_pod(env, sid)
        subprocess.run(["umount", late], check=True)
        assert {d: tree(d) for d in (shared, plain)} == before
    finally:
        subprocess.run(["umount", "-l", late], check=False, capture_output=True)
        subprocess.run(["umount", "-l", shared], check=False, capture_output=True)


def test_stopping_a_userns_container_leaves_the_host_mounts_below_its_volumes(
        env: Env) -> None:
    """The copies crishim makes of a volume (idmapped, read-only) include the host's
    mounts below it; taking them off with the container must not take off the host's."""
    base = os.path.join(env.tmpdir, "host-mounts")
    os.makedirs(base)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", base], check=True)
    subs = [os.path.join(base, name, "sub") for name in ("idmapped", "readonly")]
    try:
        subprocess.run(["mount", "--make-shared", base], check=True)
        for sub in subs:
            os.makedirs(sub)
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", sub], check=True)
        cfg = _pod_config(env, userns=True)
        sid = _run(env, cfg)
        try:
            m = pb.IDMapping(container_id=0, host_id=HOST_ID, length=SIZE)
            mounts = [pb.Mount(container_path="/idmapped", host_path=os.path.dirname(subs[0]),
                               uidMappings=[m], gidMappings=[m]),
                      pb.Mount(container_path="/readonly", host_path=os.path.dirname(subs[1]),
                               readonly=True)]
            cid = container(env, sid, cfg, "volumes", ["sleep", "600"], mounts=mounts,
                            linux=_sys_admin(cfg))
            res = exec_sync(env, cid, ["sh", "-c", "grep -c ' /idmapped/sub \\| /readonly/sub ' "
                                       "/proc/self/mountinfo"])
            assert res.stdout.decode().strip() == "2", (res.stdout, res.stderr)
            env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1),
                                   timeout=30)
            assert mounts_under(os.path.join(env.d.root, "containers", cid)) == []
            for sub in subs:
                assert os.path.ismount(sub), sub
        finally:
            remove_pod(env, sid)
        for sub in subs:
            assert os.path.ismount(sub), sub
    finally:
        for sub in subs:
            subprocess.run(["umount", "-l", sub], check=False, capture_output=True)
        subprocess.run(["umount", "-l", base], check=False, capture_output=True)
