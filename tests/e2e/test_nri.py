"""NRI end to end: the real plugins of containerd/nri v0.12.0 (`../shared/bin/nri`) against
crishim's NRI socket, pods that use them under real runc, and plugins that hang, send
garbage, refuse or die (the Python plugins below speak the protocol through crishim's own
ttRPC and mux, from the plugin's side)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.lifecycle import Env, daemon_env, exec_sync, remove_pod
from tests.e2e.nriplugins import NRI_BIN, annotations_for, nri_status, plugin_names, wait_for
from tests.e2e.registry import Registry

_TAG = os.getpid() % 40
REQUEST_TIMEOUT = 1.0
UPDATE_LIMIT = 80 << 20  # the memory limit the "update" fake plugin puts in

# A plugin written against crishim's own ttRPC and mux, from the plugin's side:
# argv: socket, name, index, mode (hang | garbage | refuse | refuse-start | update: a
# container being updated gets a memory limit of UPDATE_LIMIT instead of the asked one).
FAKE_PLUGIN = r'''
import asyncio, sys
from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.nri import mux, ttrpc

async def main(sock, name, idx, mode):
    r, w = await asyncio.open_unix_connection(sock)
    m = mux.Mux(r, w)
    pconn, rconn = m.open(mux.PLUGIN_SERVICE_CONN), m.open(mux.RUNTIME_SERVICE_CONN)

    async def configure(msg):
        event = {"refuse-start": nri.START_CONTAINER,
                 "update": nri.UPDATE_CONTAINER}.get(mode, nri.CREATE_CONTAINER)
        return nri.ConfigureResponse(events=1 << (event - 1))

    async def synchronize(msg):
        return nri.SynchronizeResponse()

    async def create(msg):
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "garbage":
            w.write(b"\xff\xff\xff\xff not a mux frame" * 50)
            await asyncio.sleep(3600)
        raise ttrpc.TTRPCError(ttrpc.UNKNOWN, "refused by the test's policy")

    async def update(msg):
        own = nri.ContainerUpdate(container_id=msg.container.id)
        own.linux.resources.memory.limit.value = UPDATE_LIMIT
        return nri.UpdateContainerResponse(update=[own])

    M = ttrpc.Method
    server = ttrpc.Server({"nri.pkg.api.v1alpha1.Plugin": {
        "Configure": M(nri.ConfigureRequest, configure),
        "Synchronize": M(nri.SynchronizeRequest, synchronize),
        "CreateContainer": M(nri.CreateContainerRequest, create),
        "StartContainer": M(nri.StartContainerRequest, create),
        "UpdateContainer": M(nri.UpdateContainerRequest, update)}})
    client = ttrpc.Client(rconn, rconn.write)
    tasks = [asyncio.create_task(c) for c in
             (m.run(), server.serve(pconn, pconn.write), client.run())]
    await client.call("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin",
                      nri.RegisterPluginRequest(plugin_name=name, plugin_idx=idx),
                      nri.Empty, 5)
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)

asyncio.run(main(*sys.argv[1:]))
'''.replace("UPDATE_LIMIT", str(UPDATE_LIMIT))


def _need_plugins() -> None:
    if not os.path.isdir(NRI_BIN):
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the NRI plugins, but {NRI_BIN} is missing")
        pytest.skip(f"NRI plugins not found at {NRI_BIN} (shared/bin beside the repository)")


@pytest.fixture(scope="module")
def plugin_dirs() -> Iterator[tuple[str, str]]:
    """plugin_path with nri-template pre-installed as 05-template, and plugin_config_path."""
    _need_plugins()
    d = tempfile.mkdtemp(prefix="crishim-nri-")
    plugins, conf = os.path.join(d, "plugins"), os.path.join(d, "conf.d")
    os.makedirs(plugins)
    os.makedirs(conf)
    os.symlink(os.path.join(NRI_BIN, "nri-template"), os.path.join(plugins, "05-template"))
    yield plugins, conf
    subprocess.run(["rm", "-rf", d], check=False)


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str, plugin_dirs: tuple[str, str]) -> Iterator[Env]:
    plugins, conf = plugin_dirs
    with daemon_env(registry, busybox_ref, "crishim-nri", f"crinri{_TAG}",
                    f"10.{150 + _TAG % 50}.93.0/24",
                    'cdi_spec_dirs = ["{tmpdir}/cdi"]\n'
                    '[nri]\nsocket_path = "{tmpdir}/nri/nri.sock"\n'
                    f'plugin_path = "{plugins}"\nplugin_config_path = "{conf}"\n'
                    f"plugin_request_timeout = {REQUEST_TIMEOUT}\n"
                    "plugin_registration_timeout = 2.0\n") as e:
        yield e


class Plugins:
    """External plugin processes of the module, stopped at the end."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.sock = os.path.join(env.tmpdir, "nri", "nri.sock")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logger_log = ""  # where the running nri-logger writes

    def start(self, key: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(os.path.join(self.env.tmpdir, f"{key}.out"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[key] = p
        return p

    def go(self, key: str, binary: str, idx: str, *args: str) -> subprocess.Popen[bytes]:
        # The samples differ in the flag's name.
        flag = "-socket-path" if binary in ("nri-logger", "nri-device-injector") else "-socket"
        return self.start(key, [os.path.join(NRI_BIN, binary), "-idx", idx, flag, self.sock,
                                *args])

    def fake(self, name: str, idx: str, mode: str) -> subprocess.Popen[bytes]:
        return self.start(name, [sys.executable, "-c", FAKE_PLUGIN, self.sock, name, idx, mode])

    def stop(self, key: str) -> None:
        p = self.procs.pop(key)
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.fixture(scope="module")
def plugins(env: Env) -> Iterator[Plugins]:
    ps = Plugins(env)
    logfile = ps.logger_log = os.path.join(env.tmpdir, "logger.log")
    ps.go("logger", "nri-logger", "20", "-log-file", logfile, "-add-env", "NRI_LOGGER")
    ps.go("ulimit", "nri-ulimit-adjuster", "30")
    ps.go("device", "nri-device-injector", "40")
    try:
        wait_for(lambda: {"20-nri-logger", "30-nri-ulimit-adjuster", "40-nri-device-injector"}
                 <= set(plugin_names(env)), "the three plugins to register")
        yield ps
    finally:
        for key in list(ps.procs):
            ps.stop(key)


def run_pod(env: Env, name: str, annotations: dict[str, str] | None = None
            ) -> tuple[str, pb.PodSandboxConfig]:
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="nri", uid=f"uid-{name}"),
        hostname=name, log_directory=os.path.join(env.tmpdir, "logs", name),
        annotations=annotations or {},
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption())))
    resp = env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=60)
    return resp.pod_sandbox_id, cfg


def create(env: Env, pod_id: str, pod_cfg: pb.PodSandboxConfig, name: str,
           timeout: float = 60) -> str:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                             image=pb.ImageSpec(image=env.busybox),
                             command=["sleep", "3600"], log_path=f"{name}.log")
    return str(env.rt().CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg),
        timeout=timeout).container_id)


def start(env: Env, cid: str) -> None:
    env.rt().StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)


def sh(env: Env, cid: str, script: str) -> str:
    res = exec_sync(env, cid, ["sh", "-c", script])
    assert res.exit_code == 0, res.stderr.decode()
    return res.stdout.decode().strip()


def open_files_limits(env: Env, cid: str) -> list[str]:
    """The container's own process's RLIMIT_NOFILE [soft, hard], read on the host: a
    process `runc exec` starts is no witness (runc 1.1.5 often leaves its soft limit at
    runc's own, whatever process.rlimits says)."""
    info = json.loads(env.rt().ContainerStatus(pb.ContainerStatusRequest(
        container_id=cid, verbose=True), timeout=10).info["info"])
    with open(f"/proc/{info['pid']}/limits") as fh:
        line = next(ln for ln in fh if ln.startswith("Max open files"))
    return line.split()[3:5]


# --- tests ---------------------------------------------------------------------------------

def test_plugins_register_in_index_order(env: Env, plugins: Plugins) -> None:
    st = nri_status(env)
    assert st["enabled"] and st["socket"].endswith("/nri/nri.sock")
    names = [p["name"] for p in st["plugins"]]
    # The pre-installed plugin was started by crishim; the others connected.
    assert names[:4] == ["05-template", "20-nri-logger", "30-nri-ulimit-adjuster",
                         "40-nri-device-injector"]
    kinds = {p["name"]: p["kind"] for p in st["plugins"]}
    assert kinds["05-template"] == "pre-connected" and kinds["20-nri-logger"] == "external"
    assert os.stat(os.path.join(env.tmpdir, "nri", "nri.sock")).st_mode & 0o777 == 0o600


def test_annotated_pod_gets_every_adjustment(env: Env, plugins: Plugins) -> None:
    data = os.path.join(env.tmpdir, "nri-data")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "hello"), "w") as fh:
        fh.write("from the host\n")
    # A filler annotation makes every request bigger than the Go side's 4 KiB read buffer.
    pod_id, pod_cfg = run_pod(env, "adjusted", {**annotations_for("c0", data),
                                                "filler": "x" * 20000})
    try:
        cid = create(env, pod_id, pod_cfg, "c0")
        start(env, cid)
        assert open_files_limits(env, cid) == ["512", "1024"]
        node = sh(env, cid, "stat -c '%F %t:%T' /dev/nri-null")
        assert node == "character special file 1:3"
        assert sh(env, cid, "cat /nri-data/hello") == "from the host"
        assert sh(env, cid, "grep ' /nri-data ' /proc/mounts | cut -d' ' -f4").startswith("ro")
        res = exec_sync(env, cid, ["touch", "/nri-data/new"])
        assert res.exit_code != 0
        # The logger's value names its pid.
        logger_env = f"logger-pid-{plugins.procs['logger'].pid}"
        assert sh(env, cid, "echo $NRI_LOGGER") == logger_env
        # A container the annotations do not name gets none of it (but the logger's env).
        other = create(env, pod_id, pod_cfg, "other")
        start(env, other)
        assert open_files_limits(env, other) != ["512", "1024"]
        assert exec_sync(env, other, ["ls", "/dev/nri-null"]).exit_code != 0
        assert sh(env, other, "echo $NRI_LOGGER") == logger_env
    finally:
        remove_pod(env, pod_id)


def test_cdi_device_from_a_plugin_is_resolved_and_applied(env: Env, plugins: Plugins) -> None:
    """nri-device-injector's CDI annotation: the plugin names a device, crishim resolves it
    in its own cdi_spec_dirs and applies the device's edits, as containerd does."""
    data = os.path.join(env.tmpdir, "nri-cdi-data")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "hello"), "w") as fh:
        fh.write("from a CDI spec\n")
    spec_dir = os.path.join(env.tmpdir, "cdi")
    os.makedirs(spec_dir, exist_ok=True)
    with open(os.path.join(spec_dir, "nri-test.yaml"), "w") as fh:
        fh.write(f"""cdiVersion: "0.7.0"
kind: crishim.test/nri
devices:
- name: data
  containerEdits:
    env: [NRI_CDI=data]
    mounts:
    - hostPath: {data}
      containerPath: /nri-cdi
      options: [ro, bind]
""")
    pod_id, pod_cfg = run_pod(env, "cdi", {
        "cdi-devices.noderesource.dev/container.c": "- crishim.test/nri=data\n"})
    try:
        cid = create(env, pod_id, pod_cfg, "c")
        start(env, cid)
        assert sh(env, cid, "cat /nri-cdi/hello") == "from a CDI spec"
        assert sh(env, cid, "echo $NRI_CDI") == "data"
    finally:
        remove_pod(env, pod_id)


def test_logger_sees_every_event(env: Env, plugins: Plugins) -> None:
    logfile = os.path.join(env.tmpdir, "logger.log")
    pod_id, pod_cfg = run_pod(env, "logged")
    cid = create(env, pod_id, pod_cfg, "c1")
    start(env, cid)
    env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(cpu_shares=512)), timeout=30)
    env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=30)
    env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
    env.rt().StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
    env.rt().RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)

    def logged() -> list[str]:
        with open(logfile) as fh:
            text = fh.read()
        return [ev for ev in EVENTS if ev + ":" not in text]
    EVENTS = ["Synchronize", "RunPodSandbox", "CreateContainer", "PostCreateContainer",
              "StartContainer", "PostStartContainer", "UpdateContainer",
              "PostUpdateContainer", "StopContainer", "RemoveContainer", "StopPodSandbox",
              "RemovePodSandbox"]
    wait_for(lambda: not logged(), f"the logger to log {logged()}", 10)
    with open(logfile) as fh:
        text = fh.read()
    assert pod_id in text and cid in text
    # UpdateContainer carries the resources asked for.
    update = "\n".join(line for line in text.splitlines()
                       if 'msg="UpdateContainer:' in line)
    resources = update[update.index('msg="UpdateContainer: resources:"'):]
    assert "value: 512" in resources, update
    # In containerd's order.
    order = [text.index(ev + ":") for ev in ("RunPodSandbox", "CreateContainer",
                                             "PostCreateContainer", "StartContainer",
                                             "PostStartContainer")]
    assert order == sorted(order)


def test_late_plugin_is_synchronized(env: Env, plugins: Plugins) -> None:
    pod_id, pod_cfg = run_pod(env, "existing")
    try:
        cid = create(env, pod_id, pod_cfg, "c2")
        start(env, cid)
        late_log = os.path.join(env.tmpdir, "late.log")
        plugins.go("late", "nri-logger", "60", "-log-file", late_log, "-events",
                   "runpodsandbox")
        wait_for(lambda: "60-nri-logger" in plugin_names(env), "the late plugin")
        with open(late_log) as fh:
            text = fh.read()
        sync = text[text.index("Synchronize"):]
        assert pod_id in sync and cid in sync
        plugins.stop("late")
        wait_for(lambda: "60-nri-logger" not in plugin_names(env), "the late plugin to go")
    finally:
        remove_pod(env, pod_id)


def test_late_plugin_is_synchronized_in_parts(env: Env, plugins: Plugins) -> None:
    """Pods whose NRI form is bigger than one ttRPC message (4 MiB) reach a late plugin
    as a split Synchronize (`more`), as containerd splits it; the plugin sees them all.
    (Like containerd, a sync of 8 objects or fewer is not split.)"""
    pods = [run_pod(env, f"big{i}", {"filler": f"{i}" * (500 << 10)})[0] for i in range(10)]
    try:
        late_log = os.path.join(env.tmpdir, "late-split.log")
        plugins.go("split", "nri-logger", "61", "-log-file", late_log, "-events",
                   "runpodsandbox")
        wait_for(lambda: "61-nri-logger" in plugin_names(env), "the late plugin", 30)
        with open(late_log) as fh:
            sync = fh.read()
        assert all(pod_id in sync for pod_id in pods)
        plugins.stop("split")
    finally:
        for pod_id in pods:
            remove_pod(env, pod_id)


def _timed_pod(env: Env) -> float:
    t0 = time.monotonic()
    pod_id, pod_cfg = run_pod(env, f"timed{int(t0 * 1000) % 100000}")
    try:
        cid = create(env, pod_id, pod_cfg, "c")
        start(env, cid)
    finally:
        took = time.monotonic() - t0
        remove_pod(env, pod_id)
    return took


def test_killed_plugin_does_not_slow_pods(env: Env, plugins: Plugins) -> None:
    p = plugins.go("victim", "nri-template", "70")
    wait_for(lambda: "70-nri-template" in plugin_names(env), "the victim plugin")
    os.kill(p.pid, signal.SIGKILL)
    assert _timed_pod(env) < 5.0
    wait_for(lambda: "70-nri-template" not in plugin_names(env), "the dead plugin to go")
    plugins.stop("victim")


@pytest.mark.parametrize("mode", ["hang", "garbage"])
def test_faulty_plugin_is_dropped_within_the_timeout(env: Env, plugins: Plugins,
                                                     mode: str) -> None:
    plugins.fake(f"fault-{mode}", "80", mode)
    wait_for(lambda: f"80-fault-{mode}" in plugin_names(env), f"the {mode} plugin")
    pod_id, pod_cfg = run_pod(env, f"faulty-{mode}")
    try:
        t0 = time.monotonic()
        cid = create(env, pod_id, pod_cfg, "c")
        took = time.monotonic() - t0
        # Bounded by the request timeout (a hanging plugin), not by the plugin.
        assert took < REQUEST_TIMEOUT + 3.0
        start(env, cid)
        assert f"80-fault-{mode}" not in plugin_names(env)
        # The next pod does not wait for it at all.
        assert _timed_pod(env) < 5.0
    finally:
        remove_pod(env, pod_id)
        plugins.stop(f"fault-{mode}")


def test_refusal_fails_create_naming_the_plugin(env: Env, plugins: Plugins) -> None:
    plugins.fake("refuser", "85", "refuse")
    wait_for(lambda: "85-refuser" in plugin_names(env), "the refusing plugin")
    pod_id, pod_cfg = run_pod(env, "refused")
    try:
        with pytest.raises(grpc.RpcError) as err:
            create(env, pod_id, pod_cfg, "c")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "85-refuser" in str(err.value.details())
        assert "refused by the test's policy" in str(err.value.details())
        # A refusal is an answer: the plugin stays connected.
        assert "85-refuser" in plugin_names(env)
    finally:
        plugins.stop("refuser")
        remove_pod(env, pod_id)


def test_restart_restarts_preinstalled_and_resynchronizes(env: Env, plugins: Plugins) -> None:
    pod_id, pod_cfg = run_pod(env, "survivor")
    try:
        cid = create(env, pod_id, pod_cfg, "c3")
        start(env, cid)
        before = {p["name"]: p["pid"] for p in nri_status(env)["plugins"]}
        env.d.stop()
        # The Go stub exits when its connection to the runtime goes away.
        logger = plugins.procs["logger"]
        wait_for(lambda: logger.poll() is not None, "the logger to exit with the runtime")
        env.d.start()
        after = {p["name"]: p["pid"] for p in nri_status(env)["plugins"]}
        assert "05-template" in after and after["05-template"] != before["05-template"]
        # An external plugin reconnecting (restarted by its supervisor) is synchronized
        # with what survived the restart.
        plugins.stop("logger")
        relog = os.path.join(env.tmpdir, "relogger.log")
        plugins.go("logger", "nri-logger", "20", "-log-file", relog)
        plugins.logger_log = relog
        wait_for(lambda: "20-nri-logger" in plugin_names(env), "the logger to reconnect")
        with open(relog) as fh:
            sync = fh.read()
        assert pod_id in sync and cid in sync
    finally:
        remove_pod(env, pod_id)


def test_refused_start_fails_start_naming_the_plugin(env: Env, plugins: Plugins) -> None:
    plugins.fake("gate", "86", "refuse-start")
    wait_for(lambda: "86-gate" in plugin_names(env), "the refusing plugin")
    pod_id, pod_cfg = run_pod(env, "gated")
    try:
        cid = create(env, pod_id, pod_cfg, "c")
        with pytest.raises(grpc.RpcError) as err:
            start(env, cid)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "86-gate" in str(err.value.details())
        st = env.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                      timeout=10).status
        assert (st.state, st.reason) == (pb.CONTAINER_EXITED, "StartError")
    finally:
        plugins.stop("gate")
        remove_pod(env, pod_id)


def test_own_exit_is_a_stop_sent_once(env: Env, plugins: Plugins) -> None:
    """A container that exits by itself is a StopContainer for the plugins (as containerd
    sends it when the task exits); the RemoveContainer after it sends no second one."""
    logfile = plugins.logger_log
    pod_id, pod_cfg = run_pod(env, "exits")
    try:
        cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="quick"),
                                 image=pb.ImageSpec(image=env.busybox),
                                 command=["true"], log_path="quick.log")
        cid = env.rt().CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg),
            timeout=60).container_id
        start(env, cid)

        def stops() -> int:
            with open(logfile) as fh:
                return sum(1 for line in fh
                           if 'msg="StopContainer:' in line and f"id: {cid}" in line)
        wait_for(lambda: stops() == 1, "StopContainer for the exited container", 10)
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
        time.sleep(0.5)
        assert stops() == 1
    finally:
        remove_pod(env, pod_id)


def test_plugin_changes_the_resources_of_the_container_being_updated(
        env: Env, plugins: Plugins) -> None:
    """UpdateContainerResources: a plugin's UpdateContainer reply changing the container's
    own memory limit is what runc applies (as containerd applies it) and what
    ContainerStatus reports; the rest of the request (the cpu quota) is applied as asked."""
    plugins.fake("tuner", "87", "update")
    wait_for(lambda: "87-tuner" in plugin_names(env), "the updating plugin")
    pod_id, pod_cfg = run_pod(env, "tuned")
    try:
        cid = create(env, pod_id, pod_cfg, "c")
        start(env, cid)
        env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(
                memory_limit_in_bytes=96 << 20, cpu_period=100000, cpu_quota=30000)),
            timeout=30)
        assert int(sh(env, cid, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes "
                      "2>/dev/null || cat /sys/fs/cgroup/memory.max")) == UPDATE_LIMIT
        assert sh(env, cid, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || "
                  "cat /sys/fs/cgroup/cpu.max").split()[0] == "30000"
        status = env.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                          timeout=10).status
        linux = status.resources.linux
        assert (linux.memory_limit_in_bytes, linux.cpu_quota) == (UPDATE_LIMIT, 30000)
    finally:
        plugins.stop("tuner")
        remove_pod(env, pod_id)
