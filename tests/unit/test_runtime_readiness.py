"""Which runtime handlers can run on this host: the start-up probe and its verdict."""

from __future__ import annotations

import os
import stat

import pytest

from crishim.config import Config, RuntimeHandler
from crishim.errors import FailedPrecondition, Kind
from crishim.host.cgroups import CgroupFacts
from crishim.host.facts import HostFacts, hybrid_v2_controllers
from crishim.runtime.runc import OCIRuntime, RuntimeRegistry, probe_runtime, readiness

V1_HYBRID = HostFacts(cgroups=CgroupFacts.everything(1),
                      hybrid_v2_controllers=frozenset({"hugetlb"}))
V1_PURE = HostFacts(cgroups=CgroupFacts.everything(1))
V2 = HostFacts(cgroups=CgroupFacts.everything(2))
CRUN = "crun version 1.8.1"
RUNC = "runc version 1.1.5+ds1"


def test_crun_cannot_run_on_a_v1_hybrid_host_with_unified_controllers() -> None:
    verdict = readiness("/usr/bin/crun", True, CRUN, "", V1_HYBRID)
    assert not verdict.ready
    assert "hybrid" in verdict.reason and "hugetlb" in verdict.reason
    assert "/sys/fs/cgroup/unified" in verdict.reason


@pytest.mark.parametrize("host", [V1_PURE, V2], ids=["v1-pure", "v2"])
def test_crun_runs_on_pure_v1_and_on_v2(host: HostFacts) -> None:
    assert readiness("/usr/bin/crun", True, CRUN, "", host).ready


@pytest.mark.parametrize("host", [V1_HYBRID, V1_PURE, V2], ids=["v1-hybrid", "v1-pure", "v2"])
def test_runc_runs_everywhere(host: HostFacts) -> None:
    assert readiness("/usr/sbin/runc", True, RUNC, "", host).ready


def test_crun_is_known_by_what_it_says_not_by_its_file_name() -> None:
    assert not readiness("/opt/bin/oci", True, CRUN, "", V1_HYBRID).ready
    assert readiness("/opt/bin/crun-wrapper", True, RUNC, "", V1_HYBRID).ready


def test_a_missing_or_broken_binary_cannot_run() -> None:
    missing = readiness("/no/such/runc", False, "", "", V2)
    assert not missing.ready and "/no/such/runc is not found" in missing.reason
    broken = readiness("/bin/runc", True, "", "Exec format error", V2)
    assert not broken.ready and "Exec format error" in broken.reason


def test_hybrid_controllers_are_read_only_beside_v1(tmp_path: object) -> None:
    root = str(tmp_path)
    assert hybrid_v2_controllers(root) == frozenset()  # pure v1: no unified mount
    os.makedirs(os.path.join(root, "unified"))
    with open(os.path.join(root, "unified", "cgroup.controllers"), "w") as fh:
        fh.write("")
    assert hybrid_v2_controllers(root) == frozenset()  # hybrid, no controllers
    with open(os.path.join(root, "unified", "cgroup.controllers"), "w") as fh:
        fh.write("hugetlb pids\n")
    assert hybrid_v2_controllers(root) == {"hugetlb", "pids"}
    with open(os.path.join(root, "cgroup.controllers"), "w") as fh:
        fh.write("cpu memory\n")
    assert hybrid_v2_controllers(root) == frozenset()  # unified at the root: v2


def _script(path: str, body: str) -> str:
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def _garbage(path: str) -> str:
    """An executable file the kernel cannot run."""
    with open(path, "wb") as fh:
        fh.write(b"\x7fELF\x00garbage")
    os.chmod(path, 0o755)
    return path


async def test_probe_reads_version_and_features(tmp_path: object) -> None:
    binary = _script(os.path.join(str(tmp_path), "rt"), """case "$1" in
  --version) echo "crun version 1.20"; echo "commit: x";;
  features) echo '{"mountOptions":["rro"]}';;
esac
""")
    rt = OCIRuntime("crun", binary, str(tmp_path))
    probed = await probe_runtime(rt, V2)
    assert probed.ready and probed.version == "crun version 1.20"
    assert probed.features == b'{"mountOptions":["rro"]}\n'
    hybrid = await probe_runtime(rt, V1_HYBRID)
    assert not hybrid.ready and "hybrid" in hybrid.reason


async def test_failing_features_alone_leaves_the_handler_usable(tmp_path: object) -> None:
    # crun 1.8 has no `features` command: nothing announced, still usable.
    binary = _script(os.path.join(str(tmp_path), "rt"), """case "$1" in
  --version) echo "crun version 1.8.1";;
  *) echo "unknown command $1" >&2; exit 1;;
esac
""")
    probed = await probe_runtime(OCIRuntime("crun", binary, str(tmp_path)), V2)
    assert probed.ready and probed.features == b""


async def test_a_binary_that_cannot_execute_is_not_ready(tmp_path: object) -> None:
    binary = _garbage(os.path.join(str(tmp_path), "garbage"))
    probed = await probe_runtime(OCIRuntime("odd", binary, str(tmp_path)), V2)
    assert not probed.ready and binary in probed.reason and "cannot run" in probed.reason
    failing = _script(os.path.join(str(tmp_path), "failing"),
                      'echo "libfoo.so: cannot open shared object" >&2; exit 127\n')
    probed = await probe_runtime(OCIRuntime("odd", failing, str(tmp_path)), V2)
    assert not probed.ready and "exit 127: libfoo.so" in probed.reason


async def test_registry_refuses_an_unusable_handler_and_keeps_it_resolvable(
        tmp_path: object) -> None:
    crun = _script(os.path.join(str(tmp_path), "crun"), """case "$1" in
  --version) echo "crun version 1.8.1";;
  *) exit 1;;
esac
""")
    runc = _script(os.path.join(str(tmp_path), "runc"), """case "$1" in
  --version) echo "runc version 1.1.5";;
  features) echo '{}';;
esac
""")
    missing = os.path.join(str(tmp_path), "kata")
    cfg = Config(root="/r", state="/s", default_runtime="runc",
                 runtimes={"runc": RuntimeHandler(runc), "crun": RuntimeHandler(crun),
                           "kata": RuntimeHandler(missing)})
    reg = RuntimeRegistry(cfg, V1_HYBRID)
    # Before the probe every handler counts as ready.
    assert reg.usable("crun").name == "crun"
    await reg.probe()
    assert reg.usable("").name == "runc" and reg.readiness("runc").ready
    with pytest.raises(FailedPrecondition, match=r"'crun' cannot run on this host: crun "
                       r"refuses a cgroup v1 hybrid host") as err:
        reg.usable("crun")
    assert err.value.code == Kind.FAILED_PRECONDITION
    with pytest.raises(FailedPrecondition, match=r"'kata'.*kata is not found"):
        reg.usable("kata")
    # Its pods from before can still be stopped and removed.
    assert reg.get("crun").name == "crun"
    on_v2 = RuntimeRegistry(cfg, V2)
    await on_v2.probe()
    assert on_v2.usable("crun").name == "crun"
