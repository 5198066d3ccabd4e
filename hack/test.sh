#!/usr/bin/env bash
# Run every check: ruff, mypy, unit tests, e2e tests, then the kubelet layer (stock
# kubelets from ../shared/bin driving crishim). Exits non-zero on any failure.
#
#   hack/test.sh [lint] [unit] [e2e] [kubelet] [v2] [mutants] [-- PYTEST_ARGS...]
#                                       (default: lint unit e2e kubelet)
#
# mutants applies the deliberate breaks of hack/mutants.py to a throw-away copy of HEAD and
# fails if a test selection does not catch one (arguments after -- go to hack/mutants.py).
#
# v2 runs the cgroup v2 + systemd + AppArmor layer in a QEMU guest (hack/v2.sh); it needs
# only root and ../shared/v2vm here, not the host parts.
#
# Missing test tools or host parts are installed first with hack/setup.sh --dev (as root).
# e2e and kubelet tests need root and the host parts. When those are present, or when
# CI=true, a run of either in which every test was skipped is a failure, not a pass; with
# CI=true any skip not listed in tests/ci_skips.txt fails its test (tests/conftest.py).
# Environment: CRISHIM_PYTHON (interpreter; default the venv hack/setup.sh made,
# $CRISHIM_VENV or /opt/crishim/venv, else python3); CRISHIM_UNIT_TIMEOUT,
# CRISHIM_E2E_TIMEOUT and CRISHIM_KUBELET_TIMEOUT (seconds for the whole unit / e2e /
# kubelet run, default 900 / 3600 / 2400).
set -uo pipefail
cd "$(dirname "$0")/.."

steps=() pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        lint|unit|e2e|kubelet|v2|mutants) steps+=("$1") ;;
        --) shift; pytest_args=("$@"); break ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "test.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
done
[ ${#steps[@]} -gt 0 ] || steps=(lint unit e2e kubelet)

pick_python() {
    PY=${CRISHIM_PYTHON:-}
    if [ -z "$PY" ]; then
        PY=${CRISHIM_VENV:-/opt/crishim/venv}/bin/python
        [ -x "$PY" ] || PY=python3
    fi
}
ready() {  # the test tools import, and (as root) the host parts for e2e are there
    "$PY" -c 'import crishim, grpc_tools, pytest, pytest_asyncio, ruff, mypy' 2>/dev/null || return 1
    [ "$(id -u)" -ne 0 ] && return 0
    [ -x /opt/crishim/test/busybox ] || return 1  # critest's stand-in shell (setup --dev)
    "$PY" -c 'import sys; from tests.conftest import e2e_missing
sys.exit(1 if [m for m in e2e_missing() if m != "root"] else 0)'
}
pick_python
# v2 alone runs everything in the guest: the host needs no test tools for it.
if [ "${steps[*]}" = v2 ]; then
    ./hack/v2.sh ${pytest_args[@]+-- "${pytest_args[@]}"}
    exit $?
fi
if ! ready; then
    # One command on a fresh machine: install what is missing first.
    if [ "$(id -u)" -eq 0 ]; then
        printf '==> test tools or host parts missing: running hack/setup.sh --dev\n'
        hack/setup.sh --dev || { echo "test.sh: hack/setup.sh --dev failed" >&2; exit 1; }
        pick_python
        ready || { echo "test.sh: test tools still missing for $PY after setup" >&2; exit 1; }
    else
        echo "test.sh: test tools missing for $PY; run 'sudo hack/setup.sh --dev' first" >&2
        exit 1
    fi
fi

failed=()
say() { printf '\n==> %s\n' "$*"; }
check() {  # check NAME CMD...: run, remember failures, keep going
    local name=$1; shift
    say "$name: $*"
    "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "--- $name failed (exit $rc)"
        failed+=("$name")
    fi
    return "$rc"
}

# pytest exits 5 when it collected nothing: that is a broken suite, never a pass.
# A hung test must not eat the CI budget: the whole run has a time limit, and a test
# running over 5 minutes gets every thread's stack dumped (faulthandler) to show where.
run_pytest() {  # run_pytest NAME PATH SECONDS [ARGS...]
    local name=$1 path=$2 limit=$3; shift 3
    check "$name" timeout --signal=INT --kill-after=60 "$limit" \
        "$PY" -m pytest -q -ra -o faulthandler_timeout=300 "$path" "$@" "${pytest_args[@]}"
    local rc=$?
    [ "$rc" -eq 5 ] && echo "--- $name: pytest collected no tests in $path"
    [ "$rc" -eq 124 ] && echo "--- $name: stopped after ${limit}s"
    return "$rc"
}

# run_required NAME PATH SECONDS: pytest on a root-only layer. Where the host parts are
# present (or CI=true), a run in which every test was skipped is a failure, not a pass.
run_required() {
    local name=$1 path=$2 limit=$3 missing required=0 report ran
    missing=$("$PY" -c 'from tests.conftest import e2e_missing; print(", ".join(e2e_missing()))')
    if [ -z "$missing" ] || [ "${CI:-}" = true ]; then required=1; fi
    [ -n "$missing" ] && echo "note: $name tests need: $missing (run hack/setup.sh --dev as root)"
    report=$(mktemp -d)
    run_pytest "$name" "$path" "$limit" --junitxml="$report/$name.xml"
    if [ "$required" = 1 ]; then
        # Count what really ran: a suite that skipped everything proves nothing.
        ran=$("$PY" - "$report/$name.xml" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0)
    raise SystemExit
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
print(sum(int(s.get("tests", 0)) - int(s.get("skipped", 0)) for s in suites))
PYEOF
)
        if [ "${ran:-0}" -eq 0 ]; then
            echo "--- $name: no test ran (all skipped or none collected), but they are required here"
            failed+=("$name-skipped")
        else
            echo "$name tests that ran: $ran"
        fi
    fi
    rm -rf "$report"
}

for step in "${steps[@]}"; do
    case "$step" in
    lint)
        check ruff "$PY" -m ruff check --output-format=concise .
        check mypy "$PY" -m mypy
        ;;
    unit)
        run_pytest unit tests/unit "${CRISHIM_UNIT_TIMEOUT:-900}"
        ;;
    e2e)
        run_required e2e tests/e2e "${CRISHIM_E2E_TIMEOUT:-3600}"
        ;;
    kubelet)
        # Stock kubelets (../shared/bin) driving crishim; each test module runs per kubelet.
        run_required kubelet tests/kubelet "${CRISHIM_KUBELET_TIMEOUT:-2400}"
        ;;
    mutants)
        check mutants "$PY" hack/mutants.py ${pytest_args[@]+"${pytest_args[@]}"}
        ;;
    v2)
        check v2 ./hack/v2.sh ${pytest_args[@]+-- "${pytest_args[@]}"}
        ;;
    esac
done

if [ ${#failed[@]} -gt 0 ]; then
    say "FAILED: ${failed[*]}"
    exit 1
fi
say "all checks passed (${steps[*]})"
