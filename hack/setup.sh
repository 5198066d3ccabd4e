#!/usr/bin/env bash
# Prepare a Debian 12 host for crishim and (with --run) start it. Idempotent; run as root.
#
#   hack/setup.sh [--dev] [--with-bench] [--run]
#
#   --dev         also install the test tools (pytest, ruff, mypy, grpcio-tools; xfsprogs
#                 for the e2e tests' loop-mounted XFS)
#   --with-bench  also install containerd and the benchmark extras (hack/bench)
#   --run         start crishim on unix:///run/crishim/crishim.sock afterwards
#                 (systemd unit when systemd is PID 1, else in the background with
#                 logs in /var/log/crishim.log)
#
# Environment: PYTHON (interpreter to install into, default python3),
# CRISHIM_VENV (venv used when that interpreter is Debian's externally managed one,
# default /opt/crishim/venv).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)

DEV=0 BENCH=0 RUN=0
for arg in "$@"; do
    case "$arg" in
        --dev) DEV=1 ;;
        --with-bench) BENCH=1 ;;
        --run) RUN=1 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
    esac
done

say() { printf '==> %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: must run as root (it installs packages and configures the host)" >&2
    exit 1
fi

# --- Debian packages -------------------------------------------------------------------
PACKAGES=(runc crun conmon containernetworking-plugins catatonit iptables docker-registry
          busybox-static iproute2 python3 python3-venv python3-pip ca-certificates)
[ "$BENCH" = 1 ] && PACKAGES+=(containerd)
# The writable-layer cap tests make XFS filesystems (mkfs.xfs) with project quotas.
[ "$DEV" = 1 ] && PACKAGES+=(xfsprogs)
# A kernel that enforces AppArmor (Debian's and Ubuntu's) needs apparmor_parser to load
# crishim's default container profile (crishim-default); without it containers run
# unconfined there.
if [ "$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)" = Y ]; then
    PACKAGES+=(apparmor)
fi
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
        || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
else
    say "Debian packages already installed"
fi
if [ "$BENCH" = 1 ] && [ -d /run/systemd/system ]; then
    # The benchmark starts containerd itself, on its own socket.
    systemctl disable --now containerd >/dev/null 2>&1 || true
fi

# --- the shell of critest's stand-in images (--dev) ------------------------------------
# Debian's dynamically linked busybox runs commands through $PATH like the upstream busybox
# image; busybox-static runs its own applets directly, which critest's MaskedPaths spec
# tells apart. As a package it conflicts with busybox-static, so only its binary is kept.
TEST_BUSYBOX=/opt/crishim/test/busybox
if [ "$DEV" = 1 ] && [ ! -x "$TEST_BUSYBOX" ]; then
    say "fetching Debian's dynamic busybox for the test images into $TEST_BUSYBOX"
    tmp=$(mktemp -d)
    chmod 0755 "$tmp"  # apt's download user writes here
    (cd "$tmp" && { apt-get download busybox || { apt-get update && apt-get download busybox; }; })
    dpkg-deb -x "$tmp"/busybox_*.deb "$tmp/root"
    install -D -m 0755 "$tmp/root/bin/busybox" "$TEST_BUSYBOX"
    rm -rf "$tmp"
fi

# --- CNI -------------------------------------------------------------------------------
# Debian ships the plugins in /usr/lib/cni; most tooling looks in /opt/cni/bin.
mkdir -p /opt/cni/bin /etc/cni/net.d
for plugin in /usr/lib/cni/*; do
    name=$(basename "$plugin")
    [ -e "/opt/cni/bin/$name" ] || ln -s "$plugin" "/opt/cni/bin/$name"
done
if ! compgen -G '/etc/cni/net.d/*.conflist' >/dev/null \
   && ! compgen -G '/etc/cni/net.d/*.conf' >/dev/null \
   && ! compgen -G '/etc/cni/net.d/*.json' >/dev/null; then
    say "installing the default pod network /etc/cni/net.d/10-crishim.conflist (10.88.0.0/16)"
    cat >/etc/cni/net.d/10-crishim.conflist <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "crishim",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "crishim0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.88.0.0/16"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true}
    }
  ]
}
EOF
else
    say "keeping the existing CNI config in /etc/cni/net.d"
fi

# --- kernel ----------------------------------------------------------------------------
# Pods reach beyond the node only with forwarding on; overlay is the rootfs driver and
# br_netfilter lets iptables (portmap, masquerade) see bridged traffic.
sysctl -qw net.ipv4.ip_forward=1 || echo "warning: cannot enable net.ipv4.ip_forward" >&2
mkdir -p /etc/sysctl.d
echo "net.ipv4.ip_forward = 1" >/etc/sysctl.d/99-crishim.conf
if command -v modprobe >/dev/null; then
    for mod in overlay br_netfilter; do
        modprobe "$mod" 2>/dev/null || echo "note: kernel module $mod not loaded (built in or unavailable)"
    done
fi

# --- the Python package --------------------------------------------------------------
PY=${PYTHON:-python3}
if "$PY" -c 'import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
         and sys.prefix == sys.base_prefix else 1)'; then
    # Debian's own interpreter refuses system-wide pip installs (PEP 668): use a venv.
    VENV=${CRISHIM_VENV:-/opt/crishim/venv}
    [ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
    PY=$VENV/bin/python
fi
extras=()
[ "$DEV" = 1 ] && extras+=(dev)
[ "$BENCH" = 1 ] && extras+=(bench)
spec=.
if [ ${#extras[@]} -gt 0 ]; then
    spec=".[$(IFS=,; echo "${extras[*]}")]"
fi
say "pip install -e '$spec' into $("$PY" -c 'import sys; print(sys.prefix)')"
"$PY" -m pip install --quiet --disable-pip-version-check -e "$spec"
BIN=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/crishim
# One stable path for the systemd unit and for people: /usr/local/bin/crishim.
if [ "$BIN" != /usr/local/bin/crishim ]; then
    ln -sfn "$BIN" /usr/local/bin/crishim
fi
mkdir -p /etc/crishim
"$PY" -m crishim config >/dev/null  # fails loudly if /etc/crishim/crishim.toml is bad
if [ -d /run/systemd/system ]; then
    install -m 0644 systemd/crishim.service /etc/systemd/system/crishim.service
    systemctl daemon-reload
fi
say "crishim $("$PY" -m crishim --version | cut -d' ' -f2) installed as /usr/local/bin/crishim (source: $REPO)"

[ "$RUN" = 1 ] || exit 0

# --- run -------------------------------------------------------------------------------
SOCK=/run/crishim/crishim.sock
version_check() {
    "$PY" - "$SOCK" <<'EOF'
import sys, grpc
from crishim.api.runtime.v1 import api_pb2 as pb, api_pb2_grpc
with grpc.insecure_channel("unix://" + sys.argv[1]) as ch:
    v = api_pb2_grpc.RuntimeServiceStub(ch).Version(pb.VersionRequest(), timeout=2)
print(f"{v.runtime_name} {v.runtime_version} (CRI {v.runtime_api_version}) is serving")
EOF
}
if [ -d /run/systemd/system ]; then
    say "starting crishim.service"
    systemctl enable --now crishim.service
elif version_check >/dev/null 2>&1; then
    say "crishim is already running"
else
    say "starting crishim in the background (logs: /var/log/crishim.log)"
    nohup /usr/local/bin/crishim >>/var/log/crishim.log 2>&1 </dev/null &
    echo $! >/run/crishim.pid
fi
for _ in $(seq 1 100); do
    if version_check 2>/dev/null; then
        echo "crictl --runtime-endpoint unix://$SOCK info"
        exit 0
    fi
    sleep 0.2
done
echo "setup.sh: crishim did not answer on $SOCK within 20s; see /var/log/crishim.log" \
     "(or journalctl -u crishim)" >&2
exit 1
