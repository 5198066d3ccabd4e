"""Start/stop the two runtimes under test on temp sockets, roots and state dirs.

Each runtime gets its own CNI conflist (same plugins, distinct bridge and subnet), the
same registry hosts.toml tree and the same download concurrency, so only the runtime
differs. Everything lives under the bench's work dir; `cleanup()` removes pods through
the CRI first, then kills what is left (by PID, matched on our own paths only).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.api.runtime.v1 import api_pb2_grpc as pbg
from hack.benchlib import ctrdconf, procs
from hack.benchlib.anchors import SHIM, Anchor
from hack.benchlib.ctrdconf import ContainerdPaths
from hack.benchlib.hostclean import (
    delete_netns,
    delete_runc_containers,
    netns_names,
    unmount_under,
)
from tests.e2e.cni import cni_conf_dir, remove_bridge
from tests.e2e.registry import free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOWNLOADS = 3  # containerd's default max_concurrent_downloads; crishim gets the same


def cni_bin_dir() -> str:
    """Where the CNI plugins are: /opt/cni/bin (upstream layout) or /usr/lib/cni (Debian)."""
    for d in ("/opt/cni/bin", "/usr/lib/cni"):
        if os.access(os.path.join(d, "bridge"), os.X_OK):
            return d
    raise RuntimeError("no CNI plugins (bridge, host-local, portmap) in /opt/cni/bin or "
                       "/usr/lib/cni: install containernetworking-plugins")


@dataclass
class Network:
    name: str
    bridge: str
    subnet: str


# /16s above the ranges the e2e tests pick their /24s from (10.20-249.x), so a bench can
# run next to the test suite without overlapping routes.
CRISHIM_NET = Network("bench-crishim", "bnch-crishim", "10.250.0.0/16")
MAX_ANCHORS = 4  # 10.251-254: one network per containerd anchor


def anchor_network(index: int) -> Network:
    if not 0 <= index < MAX_ANCHORS:
        raise ValueError(f"at most {MAX_ANCHORS} containerd anchors")
    return Network(f"bench-ctrd{index}", f"bnch-ctrd{index}", f"10.{251 + index}.0.0/16")


def all_bridges() -> list[str]:
    """Every bridge a bench may create (to clean up after a killed one)."""
    return [CRISHIM_NET.bridge, *(anchor_network(i).bridge for i in range(MAX_ANCHORS))]


class Runtime:
    """A CRI runtime process under test."""

    name = ""
    monitor_exe = ""

    def __init__(self, workdir: str, certs_dir: str, net: Network) -> None:
        self.workdir = os.path.join(workdir, self.name)
        os.makedirs(self.workdir, exist_ok=True)
        self.certs_dir = certs_dir
        self.net = net
        self.cni_dir = cni_conf_dir(self.workdir, self.net.name, self.net.bridge,
                                    self.net.subnet)
        self.log_dir = os.path.join(self.workdir, "pod-logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None
        self.rt: pbg.RuntimeServiceStub | None = None
        self.img: pbg.ImageServiceStub | None = None
        # NRI for the nri scenario: None = the runtime's default config (every other
        # scenario), else explicitly on or off with the socket at `nri_socket`.
        self.nri: bool | None = None
        # The tracing scenario's OTLP/gRPC receiver ("host:port"); "" = tracing off.
        self.otlp = ""

    # --- subclass hooks ---
    @property
    def socket(self) -> str:
        return os.path.join(self.workdir, f"{self.name}.sock")

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def nri_socket(self) -> str:
        """Where NRI plugins connect ("" when this runtime has no NRI)."""
        return os.path.join(self.workdir, "nri", "nri.sock")

    def env(self) -> dict[str, str] | None:
        return None  # inherit the bench's

    def monitor_marker(self) -> str:
        """A string in every monitor process's command line that only we use."""
        return self.workdir

    # --- lifecycle ---
    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, f"{self.name}.log")

    def start(self, timeout: float = 60.0) -> None:
        logf = open(self.log_path, "ab")  # the child owns it
        # Own session: a Ctrl-C in the bench's terminal must not kill the daemons before
        # the bench has removed the pods through them.
        self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=REPO_ROOT,
                                     env=self.env())
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n"
                                   f"{self.logs()}")
            if os.path.exists(self.socket):
                ch = grpc.insecure_channel("unix://" + self.socket, options=[
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
                try:
                    grpc.channel_ready_future(ch).result(timeout=1)
                    rt = pbg.RuntimeServiceStub(ch)
                    rt.Version(pb.VersionRequest(version="v1"), timeout=5)
                    self.channel, self.rt, self.img = ch, rt, pbg.ImageServiceStub(ch)
                    return
                except (grpc.FutureTimeoutError, grpc.RpcError):
                    ch.close()
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not come up in {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return fh.read()[-8000:]
        except OSError:
            return ""

    def daemon_pids(self) -> list[int]:
        return [self.proc.pid] if self.proc and self.proc.poll() is None else []

    def monitor_pids(self) -> list[int]:
        return procs.find(self.monitor_exe, self.monitor_marker())

    def remove_all_pods(self) -> None:
        """Stop and remove every pod (and so its containers) through the CRI."""
        if self.rt is None:
            return
        try:
            pods = self.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items
        except grpc.RpcError:
            return
        for pod in pods:
            for call, req in ((self.rt.StopPodSandbox, pb.StopPodSandboxRequest),
                              (self.rt.RemovePodSandbox, pb.RemovePodSandboxRequest)):
                with contextlib.suppress(grpc.RpcError):
                    call(req(pod_sandbox_id=pod.id), timeout=60)

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = self.rt = self.img = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self) -> None:
        """Everything we started goes, even after a failure: pods, processes, mounts."""
        with contextlib.suppress(Exception):
            self.remove_all_pods()
        self.stop()
        for pid in self.monitor_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.kill_leftover_containers()
        unmount_under(self.workdir)
        remove_bridge(self.net.bridge)

    def kill_leftover_containers(self) -> None:
        """runc containers under our runc root that survived (pods not removed)."""
        delete_runc_containers(self.runc_state_root())

    def runc_state_root(self) -> str:
        """The runc --root holding this runtime's containers."""
        raise NotImplementedError


class Crishim(Runtime):
    name = "crishim"
    monitor_exe = "conmon"

    def __init__(self, workdir: str, certs_dir: str, settings: list[str] | None = None) -> None:
        super().__init__(workdir, certs_dir, CRISHIM_NET)
        # Top-level config lines (KEY = VALUE) from --crishim-set: in place of the bench's
        # own line for the same key, else after them.
        self.settings = settings or []
        self.extra_toml = ""  # config sections of one scenario's own crishims

    def command(self) -> list[str]:
        cfg = os.path.join(self.workdir, "crishim.toml")
        top = {"cgroup_driver": '"cgroupfs"', "pause_image": '""', "log_level": '"info"'}
        for line in self.settings:
            key, _, value = line.partition("=")
            top[key.strip()] = value.strip()
        with open(cfg, "w") as fh:
            fh.write(f"""\
{"".join(f"{key} = {value}{chr(10)}" for key, value in top.items())}
[cni]
conf_dir = "{self.cni_dir}"
bin_dirs = ["{cni_bin_dir()}"]

[registry]
config_path = "{self.certs_dir}"
max_concurrent_downloads = {DOWNLOADS}
{self._nri_toml()}{self._tracing_toml()}{self.extra_toml}""")
        return [sys.executable, "-m", "crishim", "--config", cfg,
                "--listen", "unix://" + self.socket,
                "--root", os.path.join(self.workdir, "root"),
                "--state", os.path.join(self.workdir, "state")]

    def _nri_toml(self) -> str:
        if self.nri is None:
            return ""
        nri_dir = os.path.dirname(self.nri_socket)
        # No pre-installed plugins: the host's /opt/nri/plugins is not the bench's.
        return f"""
[nri]
enable = {"true" if self.nri else "false"}
socket_path = "{self.nri_socket}"
plugin_path = "{nri_dir}/plugins"
plugin_config_path = "{nri_dir}/conf.d"
"""

    def _tracing_toml(self) -> str:
        if not self.otlp:
            return ""
        return f"""
[tracing]
endpoint = "{self.otlp}"
protocol = "grpc"
sampling_rate_per_million = 1000000
"""

    def runc_state_root(self) -> str:
        return os.path.join(self.workdir, "state", "runc")


class Containerd(Runtime):
    """One containerd anchor: its own root, state, sockets, runc root and CNI network."""

    monitor_exe = SHIM

    def __init__(self, workdir: str, certs_dir: str, sandbox_image: str, anchor: Anchor,
                 index: int) -> None:
        self.name = anchor.name
        self.anchor = anchor
        super().__init__(workdir, certs_dir, anchor_network(index))
        self.sandbox_image = sandbox_image
        # containerd 1.x pins pod netns as /run/netns/cni-<uuid>; the ones that appear
        # while it runs are ours (2.x keeps them under its state dir).
        self.netns_before = netns_names("cni-")

    def cleanup(self) -> None:
        super().cleanup()
        if self.anchor.major < 2:
            for name in netns_names("cni-") - self.netns_before:
                delete_netns(name)

    def monitor_marker(self) -> str:
        return self.socket  # shims run with -address <our socket>

    @property
    def nri_socket(self) -> str:
        # 1.x has no NRI on by default (1.6 none at all); 2.x's is set in config_toml.
        return f"{self.workdir}/state/nri/nri.sock" if self.anchor.major >= 2 else ""

    def runc_root(self) -> str:
        return os.path.join(self.workdir, "runc")

    def runc_state_root(self) -> str:
        return os.path.join(self.runc_root(), "k8s.io")  # the shim adds the namespace

    def env(self) -> dict[str, str]:
        # containerd finds its shim on PATH: put the anchor's own first, or a 2.x would run
        # Debian's 1.6 shim (and the other way round).
        shim_dir = os.path.dirname(self.anchor.shim)
        env = {**os.environ, "PATH": f"{shim_dir}:{os.environ.get('PATH', '')}"}
        if self.otlp:
            # containerd 2.x's otlp plugin reads only the environment (1.x: its TOML).
            env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{self.otlp}",
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                    "OTEL_EXPORTER_OTLP_INSECURE": "true",
                    "OTEL_SERVICE_NAME": self.name, "OTEL_TRACES_SAMPLER": "always_on"}
        return env

    def config_toml(self) -> str:
        paths = ContainerdPaths(
            root=f"{self.workdir}/root", state=f"{self.workdir}/state", socket=self.socket,
            runc_root=self.runc_root(), shim=self.anchor.shim, cni_bin=cni_bin_dir(),
            cni_conf=self.cni_dir, certs=self.certs_dir, sandbox_image=self.sandbox_image,
            stream_port=free_port(), downloads=DOWNLOADS)
        return (ctrdconf.v3(paths, nri_disable=self.nri is False) if self.anchor.major >= 2
                else ctrdconf.v2(paths))

    def command(self) -> list[str]:
        cfg = os.path.join(self.workdir, "config.toml")
        with open(cfg, "w") as fh:
            fh.write(self.config_toml())
        return [self.anchor.binary, "--config", cfg]
