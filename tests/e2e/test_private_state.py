"""Nothing crishim stores can be read or executed by another host user (issue 45, private
state): real daemon, runc, conmon and CNI through the socket, and the attacks performed
as `nobody` with setpriv. A setuid-root binary that a container wrote into its rootfs, or
that an image shipped in a layer, cannot be run from the host (containerd's
CVE-2021-41103); no directory or file below the roots can be listed or read; config.json
(the container's env) and the termination log are private; a container user that is not
root still reads the pod's files and writes its termination log; an older install's modes
are tightened when the daemon starts."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import module_network
from tests.e2e.imagebuild import BUSYBOX, build_busybox, directory, file, push_image, ref
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

_TAG = os.getpid() % 40
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# A host id range no other e2e module uses (the kubelet hands out multiples of 65536).
USERNS_HOST_ID = 65536 * (90 + _TAG)
TERMINATION = {"io.kubernetes.container.terminationMessagePath": "/dev/termination-log"}

# Run as nobody by the system's python: tries to list each dir and read each file given
# (JSON [[path, "dir"|"file"], ...] in argv[1]) and prints what it could reach.
_PROBE = """
import json, os, sys
out = {}
for path, kind in json.loads(sys.argv[1]):
    try:
        if kind == "dir":
            os.listdir(path)
        else:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        out[path] = "OK"
    except OSError as exc:
        out[path] = os.strerror(exc.errno)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-priv", *module_network("private")) as e:
        yield e


@pytest.fixture(scope="module")
def suid_image(env: Env) -> str:
    """busybox plus a layer with a setuid-root busybox at /opt/suid/id."""
    with open(BUSYBOX, "rb") as fh:
        data = fh.read()
    img = build_busybox(extra_layers=[[directory("opt"), directory("opt/suid"),
                                       file("opt/suid/id", data, mode=0o4755)]])
    push_image(env.registry.push_host, "test/suid", "v1", img)
    image = ref(env.registry.host, "test/suid", "v1")
    env.d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=image)), timeout=120)
    return image


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=30,
                          check=False, cwd="/")


def _probe(entries: list[tuple[str, str]]) -> dict[str, str]:
    res = _as_nobody("/usr/bin/python3", "-c", _PROBE, json.dumps(entries))
    assert res.returncode == 0, res.stderr
    out: dict[str, str] = json.loads(res.stdout)
    return out


def _entries(*tops: str, depth: int = 2) -> list[tuple[str, str]]:
    """Every dir and file down to `depth` levels below `tops` (as root sees them),
    symlinks and mount points' insides left out."""
    found: list[tuple[str, str]] = []

    def walk(path: str, level: int) -> None:
        for e in os.scandir(path):
            if e.is_symlink():
                continue
            kind = "dir" if e.is_dir() else "file"
            found.append((e.path, kind))
            if kind == "dir" and level < depth and not os.path.ismount(e.path):
                walk(e.path, level + 1)

    for top in tops:
        found.append((top, "dir"))
        walk(top, 1)
    return found


def _cannot_run(path: str) -> None:
    st = os.stat(path)  # as root: it is there, setuid root
    assert st.st_mode & stat.S_ISUID and st.st_uid == 0, oct(st.st_mode)
    # Through a shell: setpriv's own exec of the program still has root's capabilities.
    res = _as_nobody("/bin/sh", "-c", 'exec "$0" -u', path)
    assert res.returncode != 0 and "Permission denied" in res.stderr, (res.stdout, res.stderr)
    assert res.stdout.strip() != "0"


def test_nobody_can_reach_the_work_dir_but_nothing_below_the_roots(env: Env) -> None:
    # The test means something only if nobody gets as far as the roots themselves.
    assert _as_nobody("ls", "-d", env.d.root, env.d.state).returncode == 0
    with pod(env) as (sid, cfg):
        cid = container(env, sid, cfg, "sleeper", ["sleep", "300"], annotations=TERMINATION,
                        envs=[pb.KeyValue(key="SECRET", value=b"s3cr3t")])
        bundle = os.path.join(env.d.root, "containers", cid)
        entries = _entries(env.d.root, env.d.state)
        # The places an attacker would look for are in the walk.
        paths = {p for p, _ in entries}
        assert bundle in paths and os.path.join(env.d.root, "sandboxes", sid) in paths
        reached = {p: r for p, r in _probe(entries).items() if r != "Permission denied"}
        assert reached == {}, reached
        # Deeper: the container's own files, each named exactly.
        deep = [(os.path.join(bundle, n), k) for n, k in (
            ("config.json", "file"), ("termination-log", "file"), ("rootfs", "dir"),
            ("upper", "dir"), ("rootfs/etc/passwd", "file"))]
        assert {r for r in _probe(deep).values()} == {"Permission denied"}
        for name in ("config.json", "termination-log"):
            assert stat.S_IMODE(os.stat(os.path.join(bundle, name)).st_mode) == 0o600, name
        with open(os.path.join(bundle, "config.json")) as fh:
            assert "SECRET=s3cr3t" in fh.read()  # what the 0600 protects
        for d, mode in ((env.d.root, 0o711), (env.d.state, 0o711),
                        (os.path.join(env.d.root, "containers"), 0o711), (bundle, 0o700),
                        (os.path.join(env.d.root, "sandboxes", sid), 0o700)):
            assert stat.S_IMODE(os.stat(d).st_mode) == mode, d


def test_setuid_binary_written_by_a_container_cannot_be_run_from_the_host(env: Env) -> None:
    with pod(env) as (sid, cfg):
        cid = container(env, sid, cfg, "writer", [
            "sh", "-c", "mkdir /suid && cp /bin/busybox /suid/id && chmod 4755 /suid/id "
                        "&& touch /suid/done && sleep 300"])
        bundle = os.path.join(env.d.root, "containers", cid)
        # Only once the container says so: the binary is copied before it is setuid.
        done = os.path.join(bundle, "rootfs", "suid", "done")
        for _ in range(100):
            if os.path.exists(done):
                break
            exec_sync(env, cid, ["true"])
        assert os.path.exists(done), "the container never finished writing its binary"
        for where in (os.path.join(bundle, "rootfs", "suid", "id"),
                      os.path.join(bundle, "upper", "suid", "id")):
            _cannot_run(where)


def test_setuid_binary_in_an_image_layer_cannot_be_run_from_the_host(
        env: Env, suid_image: str) -> None:
    layers = [os.path.join(dirpath, "id") for dirpath, _, files in os.walk(env.d.root)
              if dirpath.endswith(os.path.join("opt", "suid")) and "id" in files
              and "/containers/" not in dirpath]
    assert layers, "the setuid binary's layer was not found below the root"
    for path in layers:
        _cannot_run(path)
    # And through a container's rootfs made of that layer.
    with pod(env) as (sid, cfg):
        cid = container(env, sid, cfg, "suid", ["sleep", "300"], image=suid_image)
        _cannot_run(os.path.join(env.d.root, "containers", cid, "rootfs", "opt", "suid", "id"))


def test_a_non_root_container_reads_the_pod_files_and_writes_its_termination_log(
        env: Env) -> None:
    vol = os.path.join(env.tmpdir, "vol-for-1000")
    os.makedirs(vol)
    os.chmod(vol, 0o755)
    with open(os.path.join(vol, "data"), "w") as fh:
        fh.write("from-host\n")
    os.chmod(os.path.join(vol, "data"), 0o644)
    script = ("id -u; cat /etc/hostname >/dev/null && cat /etc/hosts >/dev/null && "
              "cat /etc/resolv.conf >/dev/null && echo pod-files-ok; "
              "touch /dev/shm/x && echo shm-ok; cat /deep/er/mount/data; "
              "printf 'bye from 1000' > /dev/termination-log; exit 3")
    with pod(env) as (sid, cfg):
        sc = pb.LinuxContainerSecurityContext(run_as_user=pb.Int64Value(value=1000))
        cid = container(env, sid, cfg, "user1000", ["sh", "-c", script],
                        annotations=TERMINATION, linux=pb.LinuxContainerConfig(
                            security_context=sc),
                        mounts=[pb.Mount(container_path="/deep/er/mount", host_path=vol)])
        st = wait_exited(env, cid)
        out = [t for _, t in log_lines(os.path.join(cfg.log_directory, "user1000.log"))]
        assert st.exit_code == 3, (out, env.d.logs()[-3000:])
        assert out[:5] == ["1000", "pod-files-ok", "shm-ok", "from-host"], out
        assert st.message == "bye from 1000"
        log = os.path.join(env.d.root, "containers", cid, "termination-log")
        lst = os.stat(log)
        assert stat.S_IMODE(lst.st_mode) == 0o600 and lst.st_uid == 1000
        # Exec'd processes get the usual umask, not the daemon's.
        cid2 = container(env, sid, cfg, "umask", ["sleep", "300"],
                         linux=pb.LinuxContainerConfig(security_context=sc))
        res = exec_sync(env, cid2, ["sh", "-c", "umask; touch /tmp/f && stat -c %a /tmp/f"])
        assert res.exit_code == 0 and res.stdout.decode().split() == ["0022", "644"], res


def test_a_user_namespaced_pods_dirs_are_its_groups_only(env: Env) -> None:
    mapping = pb.IDMapping(container_id=0, host_id=USERNS_HOST_ID, length=65536)
    opts = pb.NamespaceOption(userns_options=pb.UserNamespace(
        mode=pb.POD, uids=[mapping], gids=[mapping]))  # type: ignore[arg-type]
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="private-userns", namespace="e2e",
                                       uid="uid-private-userns"),
        hostname="private-userns", log_directory=os.path.join(env.tmpdir, "logs", "pu"),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=opts)))
    sid = env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=60).pod_sandbox_id
    try:
        cid = container(env, sid, cfg, "inside", ["sh", "-c", "echo hi > /f; sleep 300"],
                        linux=pb.LinuxContainerConfig(
                            security_context=pb.LinuxContainerSecurityContext(
                                namespace_options=opts)))
        assert status(env, cid).status.state == pb.CONTAINER_RUNNING
        for d in (os.path.join(env.d.root, "containers", cid),
                  os.path.join(env.d.root, "sandboxes", sid)):
            st = os.stat(d)
            assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == \
                (0o710, 0, USERNS_HOST_ID), d
        bundle = os.path.join(env.d.root, "containers", cid)
        assert set(_probe([(bundle, "dir"), (os.path.join(bundle, "config.json"), "file")])
                   .values()) == {"Permission denied"}
    finally:
        remove_pod(env, sid)


def test_an_older_installs_modes_are_tightened_at_start(env: Env) -> None:
    with pod(env) as (sid, cfg):
        cid = container(env, sid, cfg, "old", ["sleep", "300"], annotations=TERMINATION)
        bundle = os.path.join(env.d.root, "containers", cid)
        env.d.stop()
        # As an older crishim left them.
        for d in (env.d.root, env.d.state, os.path.join(env.d.root, "containers"),
                  os.path.join(env.d.root, "sandboxes"), bundle,
                  os.path.join(env.d.root, "sandboxes", sid)):
            os.chmod(d, 0o711 if d in (env.d.root, env.d.state) else 0o755)
        os.chmod(os.path.join(bundle, "config.json"), 0o644)
        os.chmod(os.path.join(env.d.state, "exits"), 0o755)
        env.d.start()
        for path, mode in ((env.d.root, 0o711), (env.d.state, 0o711),
                           (os.path.join(env.d.root, "containers"), 0o711), (bundle, 0o700),
                           (os.path.join(env.d.root, "sandboxes", sid), 0o700),
                           (os.path.join(bundle, "config.json"), 0o600),
                           (os.path.join(env.d.state, "exits"), 0o700)):
            assert stat.S_IMODE(os.stat(path).st_mode) == mode, path
        # The container it had kept running, and still runs commands.
        assert status(env, cid).status.state == pb.CONTAINER_RUNNING
        assert exec_sync(env, cid, ["true"]).exit_code == 0
