"""Leak checks and workload helpers for the durability (fault injection) e2e tests.

`Resources.scan(d, tmpdir, bridge)` lists everything a crishim daemon can leave on the host:
netns pins under {state}/netns, veths enslaved to the test bridge, host-local IP files in the
test's CNI dataDir, mounts under {root} and {state}, runc/crun containers under the
daemon's own runtime roots, conmon processes whose command line names its state dir, and
the cgroups (scopes under the systemd driver) of containers and pauses below the test's
own pod cgroup parent, with that parent itself under the systemd driver (a slice crishim
made and must stop with the last pod in it).
`unowned(live_pods, live_containers)` keeps the ones no live API object accounts for.
`DurabilityEnv` is one daemon + isolated CNI network + busybox image, with helpers to make
pods and containers and a `force_cleanup` that removes everything even after a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.oci.slices import cgroup_relpath
from tests.e2e.cni import cni_conf_dir, host_local_ips, remove_bridge
from tests.e2e.daemon import Daemon, remove_workdir, running_daemon

HANDLERS = ("runc", "crun")


# --- what is on the host -------------------------------------------------------------------

def netns_pins(d: Daemon) -> list[str]:
    """Pod ids with a netns pin file under {state}/netns."""
    path = os.path.join(d.state, "netns")
    with contextlib.suppress(FileNotFoundError):
        return sorted(os.listdir(path))
    return []


def bridge_veths(bridge: str) -> list[str]:
    """Host-side interfaces enslaved to `bridge` (one per attached pod)."""
    out = subprocess.run(["ip", "-j", "link", "show", "master", bridge], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        return []
    return sorted(str(link["ifname"]) for link in json.loads(out.stdout))


def host_local_reservations(tmpdir: str) -> dict[str, str]:
    """{ip: CNI container id (the pod id)} that host-local holds in the test's dataDir."""
    out: dict[str, str] = {}
    root = os.path.join(tmpdir, "cni-ipam")
    for ip in host_local_ips(tmpdir):
        for net in os.listdir(root):
            path = os.path.join(root, net, ip)
            with contextlib.suppress(OSError), open(path) as fh:
                out[ip] = fh.read().split()[0] if os.path.getsize(path) else ""
    return out


def mounts_under(*prefixes: str) -> list[tuple[str, str]]:
    """(mount point, fs type) of every mount below one of `prefixes`."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            mp = parts[4]
            fstype = parts[parts.index("-") + 1]
            if any(mp == p or mp.startswith(p.rstrip("/") + "/") for p in prefixes):
                out.append((mp, fstype))
    return out


def runtime_containers(d: Daemon) -> dict[str, str]:
    """{id: status} of the OCI containers under the daemon's runtime roots."""
    out: dict[str, str] = {}
    for handler in HANDLERS:
        root = os.path.join(d.state, handler)
        if not os.path.isdir(root) or shutil.which(handler) is None:
            continue
        res = subprocess.run([handler, "--root", root, "list", "--format", "json"],
                             capture_output=True, text=True, check=False)
        if res.returncode == 0 and res.stdout.strip() not in ("", "null"):
            for item in json.loads(res.stdout):
                out[str(item["id"])] = str(item["status"])
    return out


CGROUP_V2 = os.path.isfile("/sys/fs/cgroup/cgroup.controllers")


def parent_cgroup_dirs(parent: str) -> list[str]:
    """Host directories of a pod cgroup parent (cgroupfs path or systemd slice): one per
    v1 hierarchy, the one unified directory on v2."""
    rel = cgroup_relpath(parent) if parent.endswith(".slice") else parent
    if CGROUP_V2:
        return ["/sys/fs/cgroup" + rel]
    return [os.path.join("/sys/fs/cgroup", h) + rel for h in sorted(os.listdir("/sys/fs/cgroup"))
            if os.path.isdir(os.path.join("/sys/fs/cgroup", h))
            and not os.path.islink(os.path.join("/sys/fs/cgroup", h))]


def cgroups_under(parent: str) -> dict[str, str]:
    """{container or pod id: cgroup dir} of the crishim-<id>[.scope] cgroups below
    `parent` ("" = no parent of the test's own: nothing is scanned)."""
    out: dict[str, str] = {}
    if not parent:
        return out
    for base in parent_cgroup_dirs(parent):
        with contextlib.suppress(OSError):
            for name in os.listdir(base):
                if name.startswith("crishim-") and os.path.isdir(os.path.join(base, name)):
                    out[name.removeprefix("crishim-").removesuffix(".scope")] = \
                        os.path.join(base, name)
    return out


def _cmdlines() -> Iterator[tuple[int, list[bytes]]]:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().split(b"\0")
        except OSError:
            continue
        yield int(pid), cmd


def conmon_processes(d: Daemon) -> dict[int, str]:
    """{pid: container id} of conmon processes whose command line names the state dir."""
    out: dict[int, str] = {}
    marker = d.state.encode()
    for pid, cmd in _cmdlines():
        if not cmd or not cmd[0].endswith(b"conmon") or not any(marker in a for a in cmd):
            continue
        cid = ""
        if b"--cid" in cmd:
            cid = cmd[cmd.index(b"--cid") + 1].decode()
        elif b"-c" in cmd:
            cid = cmd[cmd.index(b"-c") + 1].decode()
        out[pid] = cid
    return out


@dataclass
class Resources:
    netns: list[str] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    ips: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str]] = field(default_factory=list)
    runtime: dict[str, str] = field(default_factory=dict)
    conmons: dict[int, str] = field(default_factory=dict)
    cgroups: dict[str, str] = field(default_factory=dict)
    slices: list[str] = field(default_factory=list)  # made slices still there (systemd)

    @classmethod
    def scan(cls, d: Daemon, tmpdir: str, bridge: str, cgroup_parent: str = "") -> Resources:
        made = [p for p in parent_cgroup_dirs(cgroup_parent) if os.path.isdir(p)] \
            if cgroup_parent.endswith(".slice") else []
        return cls(netns=netns_pins(d), veths=bridge_veths(bridge),
                   ips=host_local_reservations(tmpdir),
                   mounts=mounts_under(d.root, d.state), runtime=runtime_containers(d),
                   conmons=conmon_processes(d), cgroups=cgroups_under(cgroup_parent),
                   slices=made)

    def unowned(self, pods: set[str], containers: set[str],
                netns_pods: set[str] | None = None) -> dict[str, Any]:
        """What no live object accounts for. `pods`/`containers`: ids the API lists;
        `netns_pods`: pods that may hold network resources (default: all of `pods`)."""
        net = pods if netns_pods is None else netns_pods
        ids = pods | containers
        leaks: dict[str, Any] = {}
        if extra := [p for p in self.netns if p not in net]:
            leaks["netns"] = extra
        if len(self.veths) > len(net):
            leaks["veths"] = self.veths
        if extra_ips := {ip: c for ip, c in self.ips.items() if c not in net}:
            leaks["ips"] = extra_ips
        extra_mounts = [m for m in self.mounts if not any(i in m[0] for i in ids)
                        and not m[0].endswith("/netns")]  # the netns dir bind itself
        if extra_mounts:
            leaks["mounts"] = extra_mounts
        if extra_rt := {c: s for c, s in self.runtime.items() if c not in ids}:
            leaks["runtime"] = extra_rt
        if extra_cm := {p: c for p, c in self.conmons.items() if c not in ids}:
            leaks["conmons"] = extra_cm
        if extra_cg := {c: d for c, d in self.cgroups.items() if c not in ids}:
            leaks["cgroups"] = extra_cg
        if self.slices and not pods:
            leaks["slices"] = self.slices
        return leaks

    def empty(self) -> dict[str, Any]:
        """Everything still present (for "after removing all, nothing is left")."""
        return self.unowned(set(), set())


# --- a daemon with an isolated network and an image ---------------------------------------

@dataclass
class DurabilityEnv:
    d: Daemon
    tmpdir: str
    bridge: str
    image: str
    config: str
    pods: int = 0
    # Every pod's cgroup_parent: the test's own, so that its cgroups can be scanned (a
    # slice crishim makes under the systemd driver, a directory under cgroupfs).
    cgroup_parent: str = ""

    def rt(self) -> Any:
        return self.d.runtime()

    def scan(self) -> Resources:
        return Resources.scan(self.d, self.tmpdir, self.bridge, self.cgroup_parent)

    def restart(self, env: dict[str, str] | None = None) -> None:
        """(Re)start the daemon process, optionally with extra environment."""
        saved = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        try:
            self.d.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def reset(self) -> None:
        """Start of a test: the daemon runs and has no pods (whatever a failed test left)."""
        if self.d.proc is None or self.d.proc.poll() is not None:
            self.restart()
        self.remove_all()

    def pod_config(self, name: str = "") -> pb.PodSandboxConfig:
        self.pods += 1
        name = name or f"pod{self.pods}"
        # The log dir is unique per config: a reused pod name must not append to old logs.
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace="durability",
                                           uid=f"uid-{name}"),
            hostname=name,
            log_directory=os.path.join(self.tmpdir, "logs", f"{name}-{self.pods}"),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption())))

    def run_pod(self, name: str = "", timeout: float = 60) -> tuple[str, pb.PodSandboxConfig]:
        return self.run_pod_with(self.pod_config(name), timeout)

    def run_pod_with(self, cfg: pb.PodSandboxConfig,
                     timeout: float = 60) -> tuple[str, pb.PodSandboxConfig]:
        resp = self.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=timeout)
        return str(resp.pod_sandbox_id), cfg

    def container_config(self, name: str, cmd: list[str], image: str = "") -> pb.ContainerConfig:
        return pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                                  image=pb.ImageSpec(image=image or self.image), command=cmd,
                                  log_path=f"{name}.log")

    def create(self, pod_id: str, pod_cfg: pb.PodSandboxConfig, name: str, cmd: list[str],
               timeout: float = 60, image: str = "") -> str:
        return str(self.rt().CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=self.container_config(name, cmd, image),
            sandbox_config=pod_cfg), timeout=timeout).container_id)

    def start(self, cid: str, timeout: float = 30) -> None:
        self.rt().StartContainer(pb.StartContainerRequest(container_id=cid), timeout=timeout)

    def container(self, pod_id: str, pod_cfg: pb.PodSandboxConfig, name: str,
                  cmd: list[str]) -> str:
        cid = self.create(pod_id, pod_cfg, name, cmd)
        self.start(cid)
        return cid

    def pods_listed(self) -> dict[str, pb.PodSandbox]:
        items = self.rt().ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
        return {p.id: p for p in items}

    def containers_listed(self) -> dict[str, pb.Container]:
        items = self.rt().ListContainers(pb.ListContainersRequest(), timeout=10).containers
        return {c.id: c for c in items}

    def container_status(self, cid: str) -> pb.ContainerStatus:
        resp: pb.ContainerStatusResponse = self.rt().ContainerStatus(
            pb.ContainerStatusRequest(container_id=cid), timeout=10)
        return resp.status

    def remove_all(self) -> None:
        """Stop and remove every pod (and so its containers) through the API."""
        rt = self.rt()
        for pid in self.pods_listed():
            rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pid), timeout=120)
            rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pid), timeout=120)
        for cid in self.containers_listed():  # none should be left; be thorough anyway
            rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)

    def assert_consistent(self) -> tuple[set[str], set[str]]:
        """Every listed pod/container agrees with runc; nothing on the host is unowned.
        Returns the (pod ids, container ids) the API lists."""
        pods = self.pods_listed()
        ctrs = self.containers_listed()
        res = self.scan()
        for cid, c in ctrs.items():
            assert c.pod_sandbox_id in pods, f"container {cid} lists a pod that is gone; " \
                f"the daemon's log of both, across restarts:\n" \
                f"{self.log_lines(cid, c.pod_sandbox_id)}"
            rstate = res.runtime.get(cid, "")
            if c.state == pb.CONTAINER_RUNNING:
                assert rstate == "running", f"container {cid} RUNNING but runc says {rstate!r}"
            elif c.state == pb.CONTAINER_CREATED:
                # Not launched until StartContainer, or launched and not yet started.
                assert rstate in ("", "created"), \
                    f"container {cid} CREATED but runc says {rstate!r}"
            else:
                assert rstate in ("", "stopped"), f"container {cid} is {c.state} but runc " \
                    f"says {rstate!r}"
        for pid, p in pods.items():
            if p.state == pb.SANDBOX_READY:
                assert res.runtime.get(pid) == "running", f"pod {pid} READY, pause not running"
        leaks = res.unowned(set(pods), set(ctrs))
        assert not leaks, f"resources no live object owns: {leaks}\n{self.d.logs()[-4000:]}"
        return set(pods), set(ctrs)

    def log_lines(self, *ids: str, limit: int = 80) -> str:
        """The daemon's log lines (every run's: the log is appended to) naming any of
        `ids`, the last `limit` of them."""
        try:
            with open(self.d.log_path, errors="replace") as fh:
                lines = [line for line in fh if any(i in line for i in ids)]
        except OSError as exc:
            return f"(no log: {exc})"
        return "".join(lines[-limit:])

    def assert_nothing_left(self) -> None:
        leaks = self.scan().empty()
        assert not leaks, f"left after removing everything: {leaks}\n{self.d.logs()[-4000:]}"


def daemon_config(conf_dir: str, extra: str = "") -> str:
    """Daemon TOML: `extra` (top-level keys and/or tables) first, then the CNI table."""
    return (extra.rstrip("\n") + "\n" if extra else "") + (
        f'[cni]\nconf_dir = "{conf_dir}"\nbin_dirs = ["/usr/lib/cni", "/opt/cni/bin"]\n')


@dataclass
class NetDaemon:
    d: Daemon
    tmpdir: str
    bridge: str
    config: str


@contextlib.contextmanager
def networked_daemon(name: str, bridge: str, subnet: str, extra_config: str = "",
                     image: str = "", extra_roots: Iterable[tuple[str, str]] = ()
                     ) -> Iterator[NetDaemon]:
    """A daemon on its own CNI bridge and subnet (config under a fresh temp dir), with
    `image` pulled if given; everything it made is force-removed afterwards, also when the
    test failed. `{tmpdir}` in `extra_config` and in the `extra_roots` (runtime binary,
    --root of handlers configured outside <state>) stands for that temp dir."""
    tmpdir = tempfile.mkdtemp(prefix=name + "-")
    os.chmod(tmpdir, 0o755)
    conf_dir = cni_conf_dir(tmpdir, name, bridge, subnet)
    config = daemon_config(conf_dir, extra_config.replace("{tmpdir}", tmpdir))
    holder: list[Daemon] = []
    try:
        with running_daemon(config) as d:
            holder.append(d)
            if image:
                d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=image)),
                                     timeout=120)
            yield NetDaemon(d, tmpdir, bridge, config)
    finally:
        if holder:
            force_cleanup(holder[0], [(b, r.replace("{tmpdir}", tmpdir))
                                      for b, r in extra_roots])
            remove_workdir(holder[0].workdir)  # kept if a mount was left; now it is not
        remove_bridge(bridge)
        shutil.rmtree(tmpdir, ignore_errors=True)


@contextlib.contextmanager
def durability_env(image: str, tag: int, extra_config: str = "") -> Iterator[DurabilityEnv]:
    """A daemon on its own bridge `crdur<tag>` / 10.<x>.<tag>.0/24 with `image` pulled;
    everything it made is force-removed afterwards, also when the test failed."""
    with networked_daemon("crishim-dur", f"crdur{tag}", f"10.{180 + tag % 20}.{tag}.0/24",
                          extra_config, image) as nd:
        driver = nd.d.runtime().RuntimeConfig(pb.RuntimeConfigRequest(),
                                              timeout=10).linux.cgroup_driver
        parent = (f"crishimdur{tag}.slice" if driver == pb.CgroupDriver.SYSTEMD
                  else f"/crishim-dur-{tag}")
        try:
            yield DurabilityEnv(nd.d, nd.tmpdir, nd.bridge, image, nd.config,
                                cgroup_parent=parent)
        finally:
            remove_cgroup_parent(parent)


def remove_cgroup_parent(parent: str) -> None:
    """What a failed test left of a test's pod cgroup parent: the slice (stopping it stops
    every scope in it), or the cgroupfs directories, deepest first."""
    if parent.endswith(".slice"):
        subprocess.run(["systemctl", "stop", parent], check=False, capture_output=True)
        return
    for base in parent_cgroup_dirs(parent):
        for dirpath, _dirs, _files in sorted(os.walk(base), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def force_cleanup(d: Daemon, extra_roots: Iterable[tuple[str, str]] = ()) -> None:
    """Remove what a daemon made, through the API if it still answers, then by hand.
    `extra_roots`: (runtime binary, --root) pairs of handlers configured outside <state>."""
    if d.proc is not None and d.proc.poll() is None:
        with contextlib.suppress(Exception):
            rt = d.runtime()
            for item in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items:
                rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=item.id), timeout=60)
                rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=item.id),
                                    timeout=60)
        with contextlib.suppress(Exception):
            d.stop()
    for handler, root in [*((h, os.path.join(d.state, h)) for h in HANDLERS), *extra_roots]:
        if os.path.isdir(root) and shutil.which(handler):
            for name in os.listdir(root):
                if not name.startswith("."):
                    subprocess.run([handler, "--root", root, "delete", "--force", name],
                                   check=False, capture_output=True)
    for pid in conmon_processes(d):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for mp, _ in sorted(mounts_under(d.workdir), reverse=True):
        subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
    shutil.rmtree(d.workdir, ignore_errors=True)


def wait_for(pred: Any, seconds: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        time.sleep(every)

