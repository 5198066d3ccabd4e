#!/usr/bin/env bash
# The v2 layer's part inside the guest (hack/v2.sh copies the checkout to /srv/crishim and
# runs this there): a real node's host, cgroup v2 unified, systemd as PID 1, AppArmor
# enforced. Installs and starts crishim as a user would (hack/setup.sh --run), then runs
# the tests where v1 and v2 differ: cgroups, stats, logs, AppArmor, crun, kill -9 recovery,
# and the kubelet layer with kubelets 1.36 and 1.32 on the systemd cgroup driver. Prints
# one "v2 <part>: …" line per part.
#
#   hack/v2-guest.sh [-- PYTEST_ARGS...]     (as root, in the guest)
set -uo pipefail
cd "$(dirname "$0")/.."
# In the guest every part is present: a skipped-out suite is a failure, and a skip not
# listed in tests/ci_skips.txt fails its test (tests/conftest.py).
export CI=true
# A daemon starts 5-10x slower under emulation than on the host (tests/e2e/daemon.py).
export CRISHIM_E2E_START_TIMEOUT=120
PY=/opt/crishim/venv/bin/python
extra=()
[ "${1:-}" = -- ] && { shift; extra=("$@"); }

# The e2e modules that read or write cgroups, stats, logs or AppArmor state (cgroup_v2:
# unified keys, io, swap, hugetlb, PSI, shared slices, crun; lifecycle: logs, OOMKilled,
# AppArmor, resources; sandbox options: cgroup parents). The rest of the suite does the
# same thing on v1 and v2 and runs on the host; under emulation this subset takes about
# 8 minutes.
E2E=(
    tests/e2e/test_cgroup_v2.py
    tests/e2e/test_stats_runtime.py
    tests/e2e/test_stats_metrics_endpoint.py
    tests/e2e/test_cgroup_policy.py
    tests/e2e/test_container_lifecycle.py
    tests/e2e/test_sandbox_options.py
    "tests/e2e/test_foundation.py::test_runtime_config_reports_cgroup_driver"
    # Device cgroup rules are eBPF on v2 (CDI device nodes); user namespaces with
    # idmapped layers on Debian 12's kernel, under systemd and AppArmor.
    tests/e2e/test_cdi.py
    tests/e2e/test_userns.py
    # kill -9 under running pods, restart, remove: no scope, slice, mount, netns or runc
    # state left (the pods share a slice crishim made).
    "tests/e2e/test_durability_restart.py::test_sigkill_restart_keeps_pods_and_logs[3]"
    # CRIU runs on Debian's kernel (not on the CI host's): checkpoints and restores of a
    # container and of a two-container pod.
    tests/e2e/test_checkpoint.py
    # Writable-layer caps as XFS project quotas on a loop-mounted XFS (the CI host's
    # kernel has no quota support): ENOSPC at the cap, usage from the quota, ids freed.
    tests/e2e/test_rootfs_quota.py
)

t0=$(date +%s)
failed=()
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || { echo "v2-guest: /sys/fs/cgroup is not cgroup v2" >&2; exit 1; }

hack/setup.sh --dev --run || { echo "v2 setup: hack/setup.sh --dev --run failed"; exit 1; }
# CRIU for the checkpoint tests: a node's own choice (hack/setup.sh leaves it out, as
# `criu check` fails on many kernels), here where it works. setup.sh has just read the
# package lists; an update of its own would cost minutes under emulation.
DEBIAN_FRONTEND=noninteractive apt-get install -y -q criu >/dev/null \
    || { echo "v2 setup: apt-get install criu failed"; exit 1; }
crictl version >/dev/null || failed+=(crictl)
echo "v2 setup: $(( $(date +%s) - t0 ))s"
# The tests start their own daemons; the service only had to come up (and spares a CPU).
systemctl stop crishim

counts() {  # counts NAME XML: "passed/failed/skipped" from the junit report
    "$PY" - "$2" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("no report"); raise SystemExit
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
bad = n["failures"] + n["errors"]
print(f"{n['tests'] - bad - n['skipped']} passed, {bad} failed, {n['skipped']} skipped")
PYEOF
}
part() {  # part NAME SECONDS PYTEST_ARGS...
    local name=$1 limit=$2 t=$(date +%s) rc line ran; shift 2
    timeout --signal=INT --kill-after=60 "$limit" "$PY" -m pytest -q -ra -p no:cacheprovider \
        -o faulthandler_timeout=300 --junitxml="/tmp/v2-$name.xml" "$@" "${extra[@]}"
    rc=$?
    line=$(counts "$name" "/tmp/v2-$name.xml")
    echo "v2 $name: $line in $(( $(date +%s) - t ))s (exit $rc)"
    [ "$rc" -eq 0 ] || failed+=("$name")
    # A part in which nothing ran (all skipped, none collected, no report) proved nothing.
    ran=${line%% passed*}
    case "$ran" in
        ''|*[!0-9]*|0) echo "v2 $name: no test ran"; failed+=("$name-none-ran") ;;
    esac
}
part e2e 1200 "${E2E[@]}"
# Both kubelets on the systemd driver (about 4.5 minutes each under emulation).
part kubelet-1.36 900 tests/kubelet -k kubelet-1.36
part kubelet-1.32 900 tests/kubelet -k kubelet-1.32

echo "v2 guest total: $(( $(date +%s) - t0 ))s"
if [ ${#failed[@]} -gt 0 ]; then echo "v2 FAILED: ${failed[*]}"; exit 1; fi
