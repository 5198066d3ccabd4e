"""A stock kubelet driving crishim, as on a node: static pods, its own HTTP API.

The kubelets are the prebuilt ones in ../shared/bin (see its README): v1.32 ("kubelet",
plain HTTP on its main port) and v1.36 ("kubelet-1.36", HTTPS with a self-signed
certificate). Both read the same KubeletConfiguration here; one kubelet may run on a
machine at a time (its device-plugin socket path is fixed), so a lock file serialises
test runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.registry import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_BIN = os.path.join(os.path.dirname(REPO), "shared", "bin")
# Version → binary name in ../shared/bin.
KUBELETS = {"1.32": "kubelet", "1.36": "kubelet-1.36"}
LOCK = "/tmp/kubelet.lock"
NODE = "test-node"

Pod = dict[str, Any]


def binary(version: str) -> str:
    return os.path.join(SHARED_BIN, KUBELETS[version])


def missing_reason(version: str) -> str:
    """Why this kubelet cannot run here ("" when it can)."""
    path = binary(version)
    if not os.access(path, os.X_OK):
        return f"{path} is absent (the prebuilt kubelets live in ../shared/bin)"
    return ""


def cgroup_driver(runtime: Any) -> str:
    """The cgroup driver the kubelet must be configured with: $CRISHIM_KUBELET_CGROUP_DRIVER,
    else the one crishim reports in RuntimeConfig. The two must agree: a kubelet on the
    systemd driver names pod cgroups "kubepods-…-pod<uid>.slice", which a runtime on
    cgroupfs would refuse (and the other way round). 1.32 takes the config's word for it."""
    forced = os.environ.get("CRISHIM_KUBELET_CGROUP_DRIVER", "")
    if forced:
        return forced
    resp = runtime.RuntimeConfig(pb.RuntimeConfigRequest(), timeout=10)
    return "systemd" if resp.linux.cgroup_driver == pb.CgroupDriver.SYSTEMD else "cgroupfs"


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def config_yaml(endpoint: str, manifests: str, extra: dict[str, Any], port: int,
                read_only_port: int) -> str:
    """A KubeletConfiguration both kubelets accept (JSON is YAML)."""
    cfg: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "cgroupDriver": "cgroupfs",  # callers pass the runtime's (cgroup_driver())
        "failCgroupV1": False,
        "failSwapOn": False,
        "staticPodPath": manifests,
        "fileCheckFrequency": "1s",
        "syncFrequency": "2s",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": read_only_port,
        "healthzPort": 0,
        "enforceNodeAllocatable": [],
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        # Small, frequently checked logs: rotation is part of what is tested.
        "containerLogMaxSize": "20Ki",
        "containerLogMaxFiles": 3,
        "containerLogMonitorInterval": "3s",
        **extra,
    }
    return json.dumps(cfg, indent=1)


@dataclass
class Kubelet:
    version: str
    endpoint: str  # unix://… of the crishim under test
    workdir: str
    config: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    _lock: IO[bytes] | None = None
    # Chosen free at the first start (not 10250/10255: whatever else runs on the host may
    # hold them) and kept across restarts.
    port: int = 0
    read_only_port: int = 0

    @property
    def manifests(self) -> str:
        return os.path.join(self.workdir, "manifests")

    @property
    def root(self) -> str:
        return os.path.join(self.workdir, "root")

    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "kubelet.log")

    @property
    def url(self) -> str:
        """The main server: exec, attach, portForward, containerLogs, stats."""
        scheme = "http" if self.version == "1.32" else "https"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def ro_url(self) -> str:
        return f"http://127.0.0.1:{self.read_only_port}"

    def start(self) -> None:
        os.makedirs(self.manifests, exist_ok=True)
        if self._lock is None:
            self._lock = open(LOCK, "ab")
            fcntl.flock(self._lock, fcntl.LOCK_EX)  # one kubelet per machine
        cfg_path = os.path.join(self.workdir, "kubelet.yaml")
        with open(cfg_path, "w") as fh:
            if not self.port:
                self.port, self.read_only_port = free_port(), free_port()
            fh.write(config_yaml(self.endpoint, self.manifests, self.config, self.port,
                                 self.read_only_port))
        log = open(self.log_path, "ab")
        # The 1.32 build starts its main server only when the flag says so.
        server = ["--enable-server=true"] if self.version == "1.32" else []
        self.proc = subprocess.Popen(
            [binary(self.version), "--config", cfg_path, "--hostname-override", NODE,
             "--root-dir", self.root, f"--v={os.environ.get('CRISHIM_KUBELET_V', '2')}",
             *server],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_for(self._serving, 60, f"kubelet {self.version} serving /pods and its node",
                 on_fail=self.tail)

    def _serving(self) -> bool:
        """Ours answers: /pods, and the summary names our node (a server left on the port
        by someone else must not pass for it)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"kubelet exited {self.proc.returncode}:\n{self.tail()}")
        try:
            self.pods()
            summary = json.loads(self.get("/stats/summary", read_only=True))
        except (OSError, ValueError):
            return False  # not up yet, or its stats not ready (500)
        node = summary.get("node", {}).get("nodeName")
        assert node == NODE, f"the server on port {self.read_only_port} is node {node!r}, " \
            f"not our kubelet's {NODE!r}"
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
        return ""

    # --- its API ------------------------------------------------------------------------
    def get(self, path: str, read_only: bool = False, timeout: float = 10) -> bytes:
        base = self.ro_url if read_only else self.url
        ctx = _insecure() if base.startswith("https") else None
        with urllib.request.urlopen(base + path, timeout=timeout, context=ctx) as resp:
            body: bytes = resp.read()
            return body

    def pods(self) -> list[Pod]:
        items: list[Pod] | None = json.loads(self.get("/pods", read_only=True))["items"]
        return items or []

    def pod(self, name: str) -> Pod | None:
        full = f"{name}-{NODE}"
        return next((p for p in self.pods() if p["metadata"]["name"] == full), None)

    def wait_pod(self, name: str, pred: Callable[[Pod], bool], seconds: float,
                 what: str) -> Pod:
        def check() -> Pod | None:
            p = self.pod(name)
            return p if p is not None and pred(p) else None
        found: Pod = wait_for(check, seconds, f"pod {name}: {what}",
                              on_fail=lambda: json.dumps(self.pod(name), indent=1)[-3000:])
        return found

    def wait_ready(self, name: str, seconds: float = 60) -> Pod:
        return self.wait_pod(name, all_ready, seconds, "every container Ready")

    def write_manifest(self, name: str, pod: Pod) -> None:
        tmp = os.path.join(self.workdir, f".{name}.json")
        with open(tmp, "w") as fh:
            json.dump(pod, fh)
        os.rename(tmp, os.path.join(self.manifests, f"{name}.json"))

    def remove_manifest(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.manifests, f"{name}.json"))

    def pod_path(self, name: str, container: str = "") -> str:
        return f"/default/{name}-{NODE}" + (f"/{container}" if container else "")


def statuses(pod: Pod) -> dict[str, Pod]:
    st = pod.get("status", {})
    return {c["name"]: c for c in st.get("containerStatuses", [])
            + st.get("initContainerStatuses", [])}


def all_ready(pod: Pod) -> bool:
    st = pod.get("status", {})
    containers = st.get("containerStatuses", [])
    return bool(containers) and st.get("phase") == "Running" and \
        all(c.get("ready") for c in containers)


def wait_for(pred: Callable[[], Any], seconds: float, what: str, every: float = 0.25,
             on_fail: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        try:
            value = pred()
        except (OSError, urllib.error.URLError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            detail = on_fail() if on_fail else ""
            raise AssertionError(f"timed out after {seconds}s waiting for {what}\n{detail}")
        time.sleep(every)


@contextlib.contextmanager
def kubelet(version: str, endpoint: str, workdir: str, **config: Any) -> Iterator[Kubelet]:
    k = Kubelet(version, endpoint, workdir, config)
    try:
        k.start()
        yield k
    finally:
        k.close()
