"""CDI devices end to end: spec files the test writes into the daemon's cdi_spec_dirs,
containers that ask for their devices (CDI_devices, or the cdi.k8s.io annotation older
kubelets send) and run under real runc, checked from inside."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import module_network
from tests.e2e.lifecycle import Env, container, daemon_env, exec_sync, pod
from tests.e2e.registry import Registry

KIND = "crishim.test/null"


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-cdi", *module_network("cdi"),
                    'cdi_spec_dirs = ["{tmpdir}/etc-cdi", "{tmpdir}/run-cdi"]\n') as e:
        yield e


def _spec_dir(env: Env, which: str) -> str:
    d = os.path.join(env.tmpdir, which)
    os.makedirs(d, exist_ok=True)
    return d


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"  # not *.json/*.yaml: never read half-written
    with open(tmp, "w") as fh:
        fh.write(text)
    os.rename(tmp, path)


@pytest.fixture(scope="module")
def null_spec(env: Env) -> str:
    """A YAML spec: device null0 is the host's /dev/null as /dev/crishim-null, with an env
    edit, a read-only bind mount of a host dir, an extra group and a createRuntime hook;
    the spec itself adds one more env var."""
    data = os.path.join(env.tmpdir, "cdi-data")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "hello.txt"), "w") as fh:
        fh.write("from the host\n")
    hook_out = os.path.join(env.tmpdir, "hook-ran")
    path = os.path.join(_spec_dir(env, "etc-cdi"), "crishim-null.yaml")
    _write(path, f"""---
cdiVersion: "0.7.0"
kind: {KIND}
containerEdits:
  env: [CDI_SPEC=crishim-null]
devices:
- name: null0
  containerEdits:
    env: [CDI_DEVICE=null0]
    deviceNodes:
    - path: /dev/crishim-null
      hostPath: /dev/null
    mounts:
    - hostPath: {data}
      containerPath: /cdi-data
      options: [ro, nosuid, nodev, bind]
    additionalGids: [4242]
    hooks:
    - hookName: createRuntime
      path: /bin/sh
      args: [sh, -c, 'cat > "$0.tmp" && echo "$CDI_HOOK" >> "$0.tmp" && mv "$0.tmp" "$0"',
             {hook_out}]
      env: [CDI_HOOK=hook-env]
""")
    return path


def _sh(env: Env, cid: str, script: str) -> tuple[int, str]:
    res = exec_sync(env, cid, ["sh", "-c", script])
    return res.exit_code, (res.stdout + res.stderr).decode()


def _as_user(uid: int) -> pb.LinuxContainerConfig:
    return pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        run_as_user=pb.Int64Value(value=uid)))


def _check_null0(env: Env, cid: str, uid: int) -> None:
    code, out = _sh(env, cid, "stat -c '%F %t:%T %u' /dev/crishim-null")
    assert (code, out.strip()) == (0, f"character special file 1:3 {uid}")
    code, out = _sh(env, cid, "echo written > /dev/crishim-null && wc -c < /dev/crishim-null")
    assert (code, out.strip()) == (0, "0")
    code, out = _sh(env, cid, "echo $CDI_DEVICE $CDI_SPEC")
    assert out.strip() == "null0 crishim-null"
    code, out = _sh(env, cid, "cat /cdi-data/hello.txt")
    assert (code, out) == (0, "from the host\n")
    code, _ = _sh(env, cid, "touch /cdi-data/new")
    assert code != 0  # mounted read-only
    code, out = _sh(env, cid, "id -G")
    assert "4242" in out.split()


def test_device_node_env_mount_group_and_hook_reach_the_container(env: Env,
                                                                    null_spec: str) -> None:
    hook_out = os.path.join(env.tmpdir, "hook-ran")
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "gpu", ["sleep", "3600"], linux=_as_user(1000),
                        CDI_devices=[pb.CDIDevice(name=f"{KIND}=null0")])
        # The node belongs to the container's user, as the CDI reference does it.
        _check_null0(env, cid, 1000)
        # The hook ran in the runtime namespace with its env and the container's state.
        with open(hook_out) as fh:
            state_json, hook_env = fh.read().rsplit("}", 1)
        assert json.loads(state_json + "}")["id"] == cid
        assert hook_env.strip() == "hook-env"
        # A container without CDI devices gets none of it.
        plain = container(env, pod_id, pod_cfg, "plain", ["sleep", "3600"])
        assert _sh(env, plain, "ls /dev/crishim-null")[0] != 0
        assert _sh(env, plain, "ls /cdi-data")[0] != 0
        assert _sh(env, plain, "echo $CDI_SPEC.") == (0, ".\n")


def test_annotation_form_and_both_forms_at_once(env: Env, null_spec: str) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "annotated", ["sleep", "3600"],
                        annotations={"cdi.k8s.io/crishim-test_null0": f"{KIND}=null0"})
        _check_null0(env, cid, 0)
        # A DRA driver moving to the field names the device both ways: injected once.
        both = container(env, pod_id, pod_cfg, "both", ["sleep", "3600"],
                         CDI_devices=[pb.CDIDevice(name=f"{KIND}=null0")],
                         annotations={"cdi.k8s.io/crishim-test_null0": f"{KIND}=null0"})
        _check_null0(env, both, 0)
        assert _sh(env, both, "env | grep -c ^CDI_DEVICE=") == (0, "1\n")


def _create_error(env: Env, pod_id: str, pod_cfg: pb.PodSandboxConfig, name: str,
                  **kw: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        container(env, pod_id, pod_cfg, name, ["true"], start=False, **kw)  # type: ignore[arg-type]
    return err.value


def test_unknown_devices_and_invalid_spec_files_are_invalid_argument(env: Env,
                                                                     null_spec: str) -> None:
    etc, run = _spec_dir(env, "etc-cdi"), _spec_dir(env, "run-cdi")
    broken = os.path.join(run, "broken.json")
    _write(broken, json.dumps({"cdiVersion": "9.0.0", "kind": "crishim.test/broken",
                               "devices": [{"name": "x", "containerEdits": {"env": ["X=1"]}}]}))
    try:
        with pod(env) as (pod_id, pod_cfg):
            before = len(env.rt().ListContainers(pb.ListContainersRequest()).containers)
            err = _create_error(env, pod_id, pod_cfg, "unknown",
                                CDI_devices=[pb.CDIDevice(name=f"{KIND}=nope")])
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.details() == (f"unresolvable CDI device {KIND}=nope: no valid spec file "
                                     f"in {etc}, {run} defines it")
            err = _create_error(env, pod_id, pod_cfg, "broken",
                                CDI_devices=[pb.CDIDevice(name="crishim.test/broken=x")])
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"{broken}: cdiVersion '9.0.0' is not a released CDI spec version" \
                in err.details()
            err = _create_error(env, pod_id, pod_cfg, "badname",
                                annotations={"cdi.k8s.io/x": "nvidia0"})
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "annotation cdi.k8s.io/x: 'nvidia0' is not a qualified CDI device name" \
                in err.details()
            # Nothing was left behind, and the broken file breaks no other device.
            assert len(env.rt().ListContainers(pb.ListContainersRequest()).containers) == before
            cid = container(env, pod_id, pod_cfg, "fine", ["sleep", "3600"],
                            CDI_devices=[pb.CDIDevice(name=f"{KIND}=null0")])
            _check_null0(env, cid, 0)
    finally:
        os.unlink(broken)


def test_spec_file_changes_are_picked_up_without_a_restart(env: Env) -> None:
    etc, run = _spec_dir(env, "etc-cdi"), _spec_dir(env, "run-cdi")
    path = os.path.join(etc, "versioned.json")

    def write(where: str, value: str) -> None:
        with open(where, "w") as fh:  # in place, as an editor would
            json.dump({"cdiVersion": "0.3.0", "kind": "crishim.test/versioned",
                       "devices": [{"name": "v", "containerEdits": {"env": [f"V={value}"]}}]},
                      fh)

    def seen(name: str) -> str:
        cid = container(env, pod_id, pod_cfg, name, ["sleep", "3600"],
                        CDI_devices=[pb.CDIDevice(name="crishim.test/versioned=v")])
        return _sh(env, cid, "echo $V")[1].strip()

    override = os.path.join(run, "versioned.json")
    write(path, "one")
    try:
        with pod(env) as (pod_id, pod_cfg):
            assert seen("first") == "one"
            write(path, "two")  # same size, very likely the same timestamp tick
            assert seen("second") == "two"
            write(override, "run")  # the later directory wins
            assert seen("third") == "run"
            os.unlink(override)
            assert seen("fourth") == "two"
    finally:
        for p in (path, override):
            if os.path.exists(p):
                os.unlink(p)
