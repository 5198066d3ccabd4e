"""OCI spec builder and runtime-output parsing (no root needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.host.facts import oom_score_adj_floor
from crishim.oci import seccomp
from crishim.oci import spec as ocispec
from crishim.runtime.conmon import attach_cuuid, attach_socket_path, runtime_reason
from crishim.runtime.runc import last_log_error


def test_default_spec_has_containerd_defaults() -> None:
    s = ocispec.default_spec(["/pause"], hostname="pod", readonly_rootfs=True)
    assert s["process"]["args"] == ["/pause"]
    assert sorted(s["process"]["capabilities"]["bounding"]) == sorted(ocispec.DEFAULT_CAPS)
    assert len(ocispec.DEFAULT_CAPS) == 14
    assert s["root"] == {"path": "rootfs", "readonly": True}
    assert s["hostname"] == "pod"
    dests = [m["destination"] for m in s["mounts"]]
    assert dests == ["/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys",
                     "/sys/fs/cgroup"]
    assert "/proc/kcore" in s["linux"]["maskedPaths"]
    assert "/proc/sys" in s["linux"]["readonlyPaths"]
    assert {n["type"] for n in s["linux"]["namespaces"]} == set(ocispec.NAMESPACES)
    assert any(e.startswith("PATH=") for e in s["process"]["env"])


def test_namespace_and_mount_edits() -> None:
    s = ocispec.default_spec(["/x"])
    ocispec.set_namespace(s, "network", "/run/netns/a")
    ocispec.remove_namespace(s, "pid")
    ns = {n["type"]: n.get("path", "") for n in s["linux"]["namespaces"]}
    assert ns["network"] == "/run/netns/a" and "pid" not in ns
    ocispec.add_mount(s, "/dev/shm/", "/host/shm", options=["rbind", "ro"])
    shm = [m for m in s["mounts"] if m["destination"].rstrip("/") == "/dev/shm"]
    assert len(shm) == 1 and shm[0]["source"] == "/host/shm"


def test_privileged_drops_restrictions() -> None:
    s = ocispec.default_spec(["/x"])
    ocispec.set_privileged(s)
    assert "CAP_SYS_ADMIN" in s["process"]["capabilities"]["bounding"]
    assert "maskedPaths" not in s["linux"]
    sysfs = next(m for m in s["mounts"] if m["destination"] == "/sys")
    assert "ro" not in sysfs["options"]


def test_oom_score_adj_is_clamped_to_floor() -> None:
    s = ocispec.default_spec(["/x"])
    ocispec.set_oom_score_adj(s, -998, floor=-500)
    assert s["process"]["oomScoreAdj"] == -500
    ocispec.set_oom_score_adj(s, 2000, floor=-500)
    assert s["process"]["oomScoreAdj"] == 1000
    # The detected floor never exceeds our own score, is really settable, and probing
    # leaves our own score as it was.
    with open("/proc/self/oom_score_adj") as fh:
        own = int(fh.read())
    floor = oom_score_adj_floor()
    assert floor <= own
    with open("/proc/self/oom_score_adj") as fh:
        assert int(fh.read()) == own
    probe = subprocess.run(
        [sys.executable, "-c", f"open('/proc/self/oom_score_adj','w').write('{floor}')"],
        check=False)
    assert probe.returncode == 0


def test_sysctl_namespaces() -> None:
    assert ocispec.sysctl_namespace("net.ipv4.ip_forward") == "net"
    assert ocispec.sysctl_namespace("kernel.shm_rmid_forced") == "ipc"
    assert ocispec.sysctl_namespace("fs.mqueue.msg_max") == "ipc"
    assert ocispec.sysctl_namespace("kernel.hostname") == "uts"
    assert ocispec.sysctl_namespace("vm.swappiness") is None
    assert ocispec.sysctl_namespace("kernel.pid_max") is None


def test_cgroups_path_drivers() -> None:
    assert ocispec.cgroups_path("cgroupfs", "/kubepods/pod1", "crishim", "abc") == \
        "/kubepods/pod1/crishim-abc"
    assert ocispec.cgroups_path("systemd", "kubepods-pod1.slice", "crishim", "abc") == \
        "kubepods-pod1.slice:crishim:abc"
    assert ocispec.cgroups_path("systemd", "", "crishim", "abc") == "system.slice:crishim:abc"


def test_write_bundle_is_readable(tmp_path: str) -> None:
    s = ocispec.default_spec(["/x"])
    path = ocispec.write_bundle(str(tmp_path), s)
    with open(path) as fh:
        assert json.load(fh) == s
    assert not os.path.exists(path + ".tmp")


def test_runtime_error_messages() -> None:
    log = "\n".join([json.dumps({"level": "info", "msg": "x"}),
                     json.dumps({"level": "error", "msg": "container not running"})])
    assert last_log_error(log) == "container not running"
    stderr = 'time="2026" level=error msg="runc create failed: exec: \\"/x\\": not found"\n'
    assert runtime_reason(stderr) == 'runc create failed: exec: "/x": not found'
    assert runtime_reason("") == "no error message"


def test_attach_socket_path_fits_sun_path() -> None:
    cid = "a" * 64
    long_dir = "/tmp/" + "d" * 70
    path = attach_socket_path(long_dir, cid)
    assert len(path) <= 107
    assert attach_cuuid("/run/crishim/attach", cid) == cid


def test_one_seccomp_rule_for_pods_and_containers(tmp_path: Path) -> None:
    """The typed field wins; the deprecated string form maps like containerd's, and a
    string it does not know is refused rather than guessed at."""
    caps = ["CAP_CHOWN"]
    SP = pb.SecurityProfile
    assert seccomp.select(None, "", caps) is None
    assert seccomp.select(None, "unconfined", caps) is None
    default = seccomp.select(None, "runtime/default", caps)
    assert default is not None and default == seccomp.select(None, "docker/default", caps)
    assert seccomp.select(SP(profile_type=SP.RuntimeDefault), "unconfined", caps) == default
    assert seccomp.select(SP(profile_type=SP.Unconfined), "runtime/default", caps) is None
    prof = tmp_path / "p.json"
    prof.write_text('{"defaultAction": "SCMP_ACT_LOG"}')
    assert seccomp.select(None, f"localhost/{prof}", caps) == {"defaultAction": "SCMP_ACT_LOG"}
    with pytest.raises(InvalidArgument, match="seccomp profile 'bogus'"):
        seccomp.select(None, "bogus", caps)
