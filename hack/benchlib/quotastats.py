"""The quota-stats scenario: ListContainerStats and ListPodSandboxStats with writable layers
walked vs read from their XFS project quotas (docs/storage.md), at the same load, in one
run.

Two more crishims, their roots on one loop-mounted XFS with `prjquota`: "walk" without a
cap (usage from the cached tree walk, as on any node without caps) and "quota" with
`[storage] container_rootfs_size` (every layer capped, usage from quotactl). Each gets
`pods` host-network pods of one container that writes a few MiB and many small files in
its writable layer. Then the two are called in turns (A B, B A, ...), so a drift in the
machine's load falls on both alike. Only kernels with XFS quota support can run it (the
cgroup v2 guest; not the CI host): elsewhere the scenario says so and adds no rows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host import xfsquota
from crishim.host.quota import PROJECT_IDS
from hack.benchlib import workload
from hack.benchlib.images import BenchImages
from hack.benchlib.nri import cost_pct
from hack.benchlib.report import Results, Row
from hack.benchlib.runtimes import Crishim
from hack.benchlib.stats import p50, p90, summary
from hack.benchlib.workload import CGROUP_PARENT, timed

Progress = Callable[[str], None]
SCEN = "quota-stats"
WALK, QUOTA = "walk", "quota"
CALLS = ("ListContainerStats", "ListPodSandboxStats")
Samples = dict[str, dict[str, list[float]]]  # call -> mode -> seconds
MODE_NAMES = {WALK: "walked (no cap)", QUOTA: "from quotas (container_rootfs_size)"}
MiB = 1024 * 1024
XFS_SIZE = 2048 * MiB
WRITE_MIB = 4
SMALL_FILES = 200
# The daemons' own cap: far above what a container writes here.
CAP = "256Mi"
# A container writes WRITE_MIB MiB in one file and SMALL_FILES small ones (what a walk
# has to stat), then sleeps.
WRITER = (f"dd if=/dev/zero of=/data bs=1M count={WRITE_MIB} 2>/dev/null && mkdir /many "
          f"&& i=0; while [ $i -lt {SMALL_FILES} ]; do echo $i > /many/$i; i=$((i+1)); "
          "done; exec sleep 86400")


class XfsUnavailable(RuntimeError):
    pass


@contextlib.contextmanager
def loop_xfs(workdir: str) -> Iterator[str]:
    """A loop-mounted XFS with project quotas under `workdir`; its mount point."""
    if shutil.which("mkfs.xfs") is None:
        raise XfsUnavailable("mkfs.xfs is not installed (xfsprogs: hack/setup.sh --dev)")
    image, mnt = os.path.join(workdir, "quota-xfs.img"), os.path.join(workdir, "quota-xfs")
    os.makedirs(mnt, exist_ok=True)
    with open(image, "wb") as fh:
        fh.truncate(XFS_SIZE)
    subprocess.run(["mkfs.xfs", "-q", "-f", image], check=True, capture_output=True)
    done = subprocess.run(["mount", "-o", "loop,prjquota", image, mnt],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise XfsUnavailable("this kernel cannot mount XFS with prjquota: "
                             f"{done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", mnt], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        with contextlib.suppress(OSError):
            os.unlink(image)


def _pod_config(rt: Crishim, mode: str, name: str) -> pb.PodSandboxConfig:
    uid = str(uuid.uuid4())
    log_dir = os.path.join(rt.log_dir, f"bench_{name}_{uid}")
    os.makedirs(log_dir, exist_ok=True)
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="bench"),
        hostname=name, log_directory=log_dir,
        labels={"app": "bench", "io.kubernetes.pod.name": name},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=f"{CGROUP_PARENT}/crishim-{mode}/pod{uid}",
            # Host network: the pods need no CNI, and the two daemons no bridges.
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER,
                                                     ipc=pb.POD))))


def _start_pods(rt: Crishim, mode: str, image: str, n: int) -> list[str]:
    """`n` pods of one writing container; their container ids."""
    assert rt.rt is not None
    ids = []
    for i in range(n):
        cfg = _pod_config(rt, mode, f"qs-{i}")
        sid = rt.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=120) \
            .pod_sandbox_id
        ccfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image=image),
            command=["sh", "-c", WRITER], log_path="app/0.log",
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                namespace_options=cfg.linux.security_context.namespace_options)))
        cid = rt.rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=ccfg, sandbox_config=cfg), timeout=120).container_id
        rt.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=120)
        ids.append(cid)
    return ids


def _project(rt: Crishim, cid: str) -> int:
    return xfsquota.get_project(os.path.join(rt.workdir, "root", "containers", cid))[1]


def _wait_written(rt: Crishim, n: int, timeout: float = 300.0) -> None:
    """Until every container's writable layer reports what it wrote (the walk side's
    cache refreshes every 10 s)."""
    assert rt.rt is not None
    deadline = time.monotonic() + timeout
    while True:
        stats = rt.rt.ListContainerStats(pb.ListContainerStatsRequest(), timeout=60).stats
        done = [s for s in stats if s.writable_layer.used_bytes.value >= WRITE_MIB * MiB]
        if len(done) >= n:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{rt.workdir}: {len(done)} of {n} writable layers report "
                               f"{WRITE_MIB} MiB after {timeout:.0f}s")
        time.sleep(1.0)


def quota_rows(samples: Samples, pods: int) -> list[Row]:
    """Per call: p50 and p90 per mode, then how much slower the quota side is than the
    walk side, in percent of the walk side's (negative: faster)."""
    rows = []
    for call, by_mode in samples.items():
        rows += [Row(f"{SCEN}: {call} {label} @{pods} pods, {MODE_NAMES[mode]}", "s",
                     {"crishim": fn(by_mode[mode]) if by_mode[mode] else None})
                 for label, fn in (("p50", p50), ("p90", p90)) for mode in (WALK, QUOTA)]
        for label, fn in (("p50", p50), ("p90", p90)):
            both = by_mode[WALK] and by_mode[QUOTA]
            rows.append(Row(f"{SCEN}: {call}, quotas vs walk ({label})", "%", {
                "crishim": cost_pct(fn(by_mode[QUOTA]), fn(by_mode[WALK])) if both
                else None}))
    return rows


def _call(rt: Crishim, call: str, pods: int) -> float:
    assert rt.rt is not None
    fn, req = ((rt.rt.ListContainerStats, pb.ListContainerStatsRequest()) if call == CALLS[0]
               else (rt.rt.ListPodSandboxStats, pb.ListPodSandboxStatsRequest()))
    reply, secs = timed(call, fn, req)
    if len(reply.stats) != pods:
        raise RuntimeError(f"{SCEN}: {rt.workdir}: {call}: {len(reply.stats)} stats, not "
                           f"{pods}")
    return secs


def _measure(sides: dict[str, Crishim], image: str, pods: int, calls: int, warmup: int,
             samples: Samples, log: Progress) -> None:
    for mode, rt in sides.items():
        rt.start()
        assert rt.img is not None
        workload.ensure_image(rt.img, image)
        log(f"{SCEN}: {mode}: starting {pods} pods")
        ids = _start_pods(rt, mode, image, pods)
        capped = sum(_project(rt, cid) in PROJECT_IDS for cid in ids)
        if capped != (len(ids) if mode == QUOTA else 0):
            raise RuntimeError(f"{SCEN}: {mode}: {capped} of {len(ids)} layers capped")
    for rt in sides.values():
        _wait_written(rt, pods)
    log(f"{SCEN}: {warmup} warm-up + {calls} calls of {' and '.join(CALLS)} per mode, "
        "in turns")
    for i in range(warmup + calls):
        for call in CALLS:
            for mode in (WALK, QUOTA) if i % 2 == 0 else (QUOTA, WALK):
                secs = _call(sides[mode], call, pods)
                if i >= warmup:
                    samples[call][mode].append(secs)


def quota_stats(images: BenchImages, workdir: str, certs: str, pods: int, calls: int,
                warmup: int, res: Results, log: Progress) -> None:
    """p50/p90 of ListContainerStats and ListPodSandboxStats over `calls` calls each per
    mode at `pods` pods."""
    samples: Samples = {call: {WALK: [], QUOTA: []} for call in CALLS}
    with contextlib.ExitStack() as stack:
        try:
            mnt = stack.enter_context(loop_xfs(workdir))
        except (XfsUnavailable, subprocess.CalledProcessError) as exc:
            log(f"{SCEN}: skipped: {exc}")
            res.meta[f"{SCEN} skipped"] = str(exc)
            return
        sides = {WALK: Crishim(os.path.join(mnt, WALK), certs),
                 QUOTA: Crishim(os.path.join(mnt, QUOTA), certs)}
        sides[QUOTA].extra_toml = f'[storage]\ncontainer_rootfs_size = "{CAP}"\n'
        for rt in sides.values():
            stack.callback(rt.cleanup)  # before the XFS is unmounted
        _measure(sides, images.busybox, pods, calls, warmup, samples, log)
    for row in quota_rows(samples, pods):
        res.add(row)
    res.raw[SCEN] = {call: {mode: summary(v) | {"samples": v} for mode, v in d.items()}
                     for call, d in samples.items()}
