"""The floor: the same pod made by hand, to show the physical cost both runtimes pay.

Per pod: pin a netns (`ip netns add`), run the CNI chain ADD (the same bridge + portmap
plugins, own bridge/subnet) while `runc create` + exec-fifo start (what `runc start`
does, minus spawning runc) starts the pause process on its
read-only unpacked rootfs, then mount an overlay over the unpacked busybox for the container and
`runc create/start` it in the pause's net/ipc/uts namespaces. No daemon, no monitor, no
database: what is left of a runtime's latency above this is its own overhead.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import os
import shutil
import subprocess
import tarfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hack.benchlib.hostclean import unmount_under
from hack.benchlib.runtimes import cni_bin_dir
from hack.benchlib.workload import CGROUP_PARENT, CONTAINER_CMD
from tests.e2e import imagebuild as ib
from tests.e2e.cni import cni_conf_dir, remove_bridge

NET = ("bench-floor", "bnch-floor", "10.252.0.0/16")
NETNS_PREFIX = "bench-floor-"


def _unpack(image: ib.BuiltImage, dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    for layer in image.layers:
        raw = zlib.decompress(layer.data, 16 + zlib.MAX_WBITS)  # gzip
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            tf.extractall(dest, filter="fully_trusted")


def _run(args: list[str], stdin: bytes | None = None, env: dict[str, str] | None = None
         ) -> bytes:
    p = subprocess.run(args, input=stdin, env=env, capture_output=True, timeout=60,
                       stdin=None if stdin is not None else subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])}: exit {p.returncode}: "
                           f"{(p.stderr or p.stdout).decode(errors='replace')[-2000:]}")
    return p.stdout


@dataclass
class FloorPod:
    name: str
    netns: str
    pause_id: str
    ctr_id: str
    steps: dict[str, float] = field(default_factory=dict)
    pause_pid: int = 0


class Floor:
    def __init__(self, workdir: str, pause: ib.BuiltImage, busybox: ib.BuiltImage) -> None:
        self.workdir = os.path.join(workdir, "floor")
        os.makedirs(self.workdir, exist_ok=True)
        self.runc_root = os.path.join(self.workdir, "runc")
        self.cni_bin = cni_bin_dir()
        self.conf_dir = cni_conf_dir(self.workdir, *NET)
        with open(os.path.join(self.conf_dir, f"10-{NET[0]}.conflist")) as fh:
            self.conflist: dict[str, Any] = json.load(fh)
        self.pause_rootfs = os.path.join(self.workdir, "images", "pause")
        self.busybox_rootfs = os.path.join(self.workdir, "images", "busybox")
        _unpack(pause, self.pause_rootfs)
        _unpack(busybox, self.busybox_rootfs)
        spec_dir = os.path.join(self.workdir, "spec")
        os.makedirs(spec_dir, exist_ok=True)
        _run(["runc", "spec", "--bundle", spec_dir])
        with open(os.path.join(spec_dir, "config.json")) as fh:
            self.template: dict[str, Any] = json.load(fh)
        self._ids = itertools.count(1)  # pods are made from several threads
        self.pods: list[FloorPod] = []

    # --- CNI ---
    def _cni(self, command: str, pod: FloorPod) -> None:
        prev: dict[str, Any] | None = None
        plugins = list(self.conflist["plugins"])
        if command == "DEL":
            plugins.reverse()
        for plugin in plugins:
            conf = dict(plugin, name=self.conflist["name"],
                        cniVersion=self.conflist["cniVersion"])
            if "portMappings" in plugin.get("capabilities", {}):
                conf["runtimeConfig"] = {"portMappings": []}
            if prev is not None and command == "ADD":
                conf["prevResult"] = prev
            env = {"CNI_COMMAND": command, "CNI_CONTAINERID": pod.pause_id,
                   "CNI_NETNS": f"/run/netns/{pod.netns}", "CNI_IFNAME": "eth0",
                   "CNI_PATH": self.cni_bin, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            out = _run([os.path.join(self.cni_bin, plugin["type"])], json.dumps(conf).encode(), env)
            if command == "ADD":
                prev = json.loads(out)

    def _cni_timed(self, pod: FloorPod) -> float:
        t0 = time.perf_counter()
        self._cni("ADD", pod)
        return time.perf_counter() - t0

    # --- OCI ---
    def _spec(self, rootfs: str, readonly: bool, args: list[str], cgroup: str,
              namespaces: list[dict[str, str]], hostname: str) -> dict[str, Any]:
        spec = copy.deepcopy(self.template)
        spec["process"]["terminal"] = False
        spec["process"]["args"] = args
        spec["root"] = {"path": rootfs, "readonly": readonly}
        spec["hostname"] = hostname
        spec["linux"]["namespaces"] = namespaces
        spec["linux"]["cgroupsPath"] = cgroup
        return spec

    def _runc_start(self, cid: str, spec: dict[str, Any]) -> int:
        bundle = os.path.join(self.workdir, "bundles", cid)
        os.makedirs(bundle, exist_ok=True)
        with open(os.path.join(bundle, "config.json"), "w") as fh:
            json.dump(spec, fh)
        pidfile = os.path.join(bundle, "pid")
        runc_log = os.path.join(bundle, "runc.log")
        # The container inherits runc's stdio: pipes would never reach EOF, so /dev/null,
        # and runc's own errors go to --log.
        p = subprocess.run(["runc", "--root", self.runc_root, "--log", runc_log, "create",
                            "--bundle", bundle, "--pid-file", pidfile, cid],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)
        if p.returncode != 0:
            with open(runc_log, errors="replace") as fh:
                raise RuntimeError(f"runc create {cid}: exit {p.returncode}: {fh.read()[-2000:]}")
        self._start(cid)
        with open(pidfile) as fh:
            return int(fh.read().strip())

    def _start(self, cid: str) -> None:
        """What `runc start` does, without spawning runc: read the exec fifo (runc init
        blocks writing it, then execs the process) and remove it. A runtime may do this
        too (crishim does), so the floor must not charge a runc start process."""
        fifo = os.path.join(self.runc_root, cid, "exec.fifo")
        try:
            fd = os.open(fifo, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _run(["runc", "--root", self.runc_root, "start", cid])
            return
        try:
            os.read(fd, 1)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(fifo)

    def make_ready(self) -> FloorPod:
        n = next(self._ids)
        pod = FloorPod(f"floor{n}", f"{NETNS_PREFIX}{os.getpid()}-{n}", f"floor{n}-pause",
                       f"floor{n}-app")
        self.pods.append(pod)
        cgroup = f"{CGROUP_PARENT}/floor/pod{n}"
        t0 = time.perf_counter()
        _run(["ip", "netns", "add", pod.netns])
        t_ns = time.perf_counter()
        # The pause needs only the netns, not its addresses: CNI ADD runs alongside the
        # pause's create/start (the critical path a runtime can reach; crishim does it).
        with ThreadPoolExecutor(max_workers=1) as pool:
            cni = pool.submit(self._cni_timed, pod)
            pause_ns = [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                        {"type": "network", "path": f"/run/netns/{pod.netns}"}]
            pod.pause_pid = self._runc_start(pod.pause_id, self._spec(
                self.pause_rootfs, True, ["/catatonit", "-P"], f"{cgroup}/{pod.pause_id}",
                pause_ns, pod.name))
            t_pause = time.perf_counter()
            cni_secs = cni.result()
        t2 = time.perf_counter()
        rootfs = os.path.join(self.workdir, "bundles", pod.ctr_id, "rootfs")
        upper = os.path.join(self.workdir, "bundles", pod.ctr_id, "upper")
        work = os.path.join(self.workdir, "bundles", pod.ctr_id, "work")
        for d in (rootfs, upper, work):
            os.makedirs(d, exist_ok=True)
        _run(["mount", "-t", "overlay", "overlay", "-o",
              f"lowerdir={self.busybox_rootfs},upperdir={upper},workdir={work}", rootfs])
        t_mount = time.perf_counter()
        ns = f"/proc/{pod.pause_pid}/ns"
        ctr_ns = [{"type": "pid"}, {"type": "mount"},
                  {"type": "network", "path": f"{ns}/net"},
                  {"type": "ipc", "path": f"{ns}/ipc"}, {"type": "uts", "path": f"{ns}/uts"}]
        spec = self._spec(rootfs, False, CONTAINER_CMD, f"{cgroup}/{pod.ctr_id}", ctr_ns, "")
        del spec["hostname"]  # joins the pause's uts namespace
        self._runc_start(pod.ctr_id, spec)
        t3 = time.perf_counter()
        pod.steps = {"netns": t_ns - t0, "CNI ADD": cni_secs,
                     "pause create/start": t_pause - t_ns,
                     "sandbox (netns, then CNI || pause)": t2 - t0,
                     "container overlay mount": t_mount - t2,
                     "container create/start": t3 - t_mount,
                     "container mount+create/start": t3 - t2, "ready": t3 - t0}
        return pod

    def teardown(self, pod: FloorPod) -> float:
        t0 = time.perf_counter()
        for cid in (pod.ctr_id, pod.pause_id):
            subprocess.run(["runc", "--root", self.runc_root, "delete", "--force", cid],
                           check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["umount", os.path.join(self.workdir, "bundles", pod.ctr_id, "rootfs")],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with contextlib.suppress(RuntimeError):
            self._cni("DEL", pod)
        subprocess.run(["ip", "netns", "del", pod.netns], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        secs = time.perf_counter() - t0
        shutil.rmtree(os.path.join(self.workdir, "bundles", pod.ctr_id), ignore_errors=True)
        shutil.rmtree(os.path.join(self.workdir, "bundles", pod.pause_id), ignore_errors=True)
        if pod in self.pods:
            self.pods.remove(pod)
        return secs

    def cleanup(self) -> None:
        for pod in list(self.pods):
            self.teardown(pod)
        unmount_under(self.workdir)
        remove_bridge(NET[1])
